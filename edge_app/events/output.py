"""Events of every camera, found through the pipeline registry: each camera pipeline that comes is followed (its
answers into a ``StateTracker``, its frames tapped for the snapshot of an event's best answer), and what changes
goes to the store and to every listener (MQTT, webhooks: they subscribe here, never to sessions).

Nothing here waits: the tracker is pure, the store's writes are queued to its thread, a snapshot is encoded in a
media thread, and a listener must return at once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import cv2
import numpy as np

from edge_app.events.detector import EventChange, StateChange, StateTracker
from edge_app.events.store import EventStore
from edge_app.registry import Entry, PipelineRegistry
from edge_app.results import AnalysedFrame

log = logging.getLogger(__name__)

KEEP_FRAMES = 8  # recent tapped frames per camera, by sequence number: the one an event's best answer came from
Listener = Callable[[StateChange | EventChange], None]
SnapshotListener = Callable[[str, str, bytes], None]  # (camera, event id, JPEG)


class CameraFollower:
    """One camera pipeline's answers and frames."""

    def __init__(self, entry: Entry, tracker: StateTracker, out: EventsOutput) -> None:
        self.entry = entry
        self.tracker = tracker
        self.out = out
        self.frames: OrderedDict[int, np.ndarray] = OrderedDict()
        self.best_frame: np.ndarray | None = None  # the frame of the holding label's best answer so far
        self.taps = bool(tracker.event_labels) and out.snapshots  # no event label: no frame is ever kept
        if self.taps:
            entry.pipeline.add_tap(self.tap)
        entry.pipeline.subscribe(self.on_answer, video=False)

    def tap(self, seq: int, rgb: np.ndarray) -> None:
        # RENDER draws on the frame in place, and only when someone watches as video: then a copy is kept;
        # otherwise nothing writes to it again and holding it costs nothing (a copy was 0.2 ms of the loop a frame)
        self.frames[seq] = rgb.copy() if self.entry.pipeline.wants_video else rgb
        while len(self.frames) > KEEP_FRAMES:
            self.frames.popitem(last=False)

    def on_answer(self, af: AnalysedFrame) -> None:
        r = af.result
        if r.skipped is not None or r.reused:
            return  # the smoothed answer again, for a frame the model did not see
        classes = af.classes or []
        label = classes[r.smoothed_class] if r.smoothed_class < len(classes) else str(r.smoothed_class)
        t = r.arrived_unix_ms / 1e3
        changes = self.tracker.feed(t, label, float(r.smoothed_confidence))
        if self.tracker.event is not None:  # an event going on: should the app vanish, it ends about here
            self.out.store.seen(self.entry.name, t)
        if self.tracker.candidate_best_at == t:
            self.best_frame = self.frames.get(r.seq)
        for change in changes:
            self.out.changed(change)
            if isinstance(change, EventChange) and change.kind in ("new", "update"):
                self.snapshot(change.after.id)

    def snapshot(self, event_id: str) -> None:
        rgb = self.best_frame
        if rgb is None or not self.out.snapshots:
            return
        future = self.entry.pipeline.run_media(_jpeg, rgb)
        future.add_done_callback(partial(self._encoded, event_id))

    def _encoded(self, event_id: str, future: object) -> None:
        try:
            jpeg = future.result()  # type: ignore[attr-defined]
        except Exception as exc:  # an encode that fails costs the snapshot, never the event
            log.warning("events: snapshot of %s not encoded: %s", event_id, exc)
            return
        self.out.store.put_snapshot(event_id, jpeg)
        for listener in self.out.snapshot_listeners:
            try:
                listener(self.entry.name, event_id, jpeg)
            except Exception:
                log.exception("events: a snapshot listener failed on %s", event_id)

    def stop(self, now_s: float) -> None:
        if self.taps:
            self.entry.pipeline.remove_tap(self.tap)
        self.entry.pipeline.unsubscribe(self.on_answer)
        for change in self.tracker.close(now_s):
            self.out.changed(change)


def _jpeg(rgb: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 85])
    if not ok:
        raise ValueError("JPEG encode failed")
    return bytes(buf)


CameraListener = Callable[[str, list[str]], None]  # (camera, its event labels): a camera followed


class EventsOutput:
    """Every camera's events, to the store and to the listeners given at construction; events the store closed at
    open (a run that did not stop cleanly left them going on) are told to the listeners first."""

    def __init__(self, store: EventStore, registry: PipelineRegistry, make_tracker: Callable[[str], StateTracker],
                 model_name: Callable[[str], str], snapshots: bool = True, listeners: Sequence[Listener] = (),
                 snapshot_listeners: Sequence[SnapshotListener] = (),
                 camera_listeners: Sequence[CameraListener] = ()) -> None:
        self.store = store
        self.make_tracker = make_tracker
        self.model_name = model_name
        self.snapshots = snapshots
        self.listeners = tuple(listeners)
        self.snapshot_listeners = tuple(snapshot_listeners)
        self.camera_listeners = tuple(camera_listeners)
        self.followers: dict[str, CameraFollower] = {}
        self.counts = {"new": 0, "update": 0, "end": 0, "state": 0}
        for ended in store.ended_at_open:
            self._tell(EventChange("end", replace(ended, end_s=None, ended_by=None), ended))
        registry.on_added.append(self._added)
        registry.on_removed.append(self._removed)
        for entry in registry.entries("camera"):
            self._added(entry)

    def _added(self, entry: Entry) -> None:
        if entry.kind == "camera" and entry.name not in self.followers:
            follower = self.followers[entry.name] = CameraFollower(entry, self.make_tracker(entry.name), self)
            for listener in self.camera_listeners:
                listener(entry.name, sorted(follower.tracker.event_labels))

    def _removed(self, entry: Entry) -> None:
        follower = self.followers.pop(entry.name, None) if entry.kind == "camera" else None
        if follower is not None:
            follower.stop(time.time())

    def changed(self, change: StateChange | EventChange) -> None:
        if isinstance(change, EventChange):
            self.store.put(change.after, self.model_name(change.after.source))
        self._tell(change)

    def _tell(self, change: StateChange | EventChange) -> None:
        self.counts[change.kind if isinstance(change, EventChange) else "state"] += 1
        for listener in self.listeners:
            try:
                listener(change)
            except Exception:
                log.exception("events: a listener failed on %s", change)

    def states(self) -> dict[str, dict[str, object]]:
        """Each camera's state and the event going on (for ``/status``)."""
        return {name: {"state": f.tracker.state,
                       "event": None if f.tracker.event is None else f.tracker.event.id}
                for name, f in self.followers.items()}

    def close(self, now_s: float) -> None:
        for name in list(self.followers):
            self.followers.pop(name).stop(now_s)
