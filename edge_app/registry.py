"""Every analysis pipeline the app runs, by source id, with events when one comes or goes.

``camera:NAME`` for a configured camera (analysed once, whoever watches), ``session:ID`` for a browser that sends
its camera. Teach (capture, shadow runs) finds pipelines here; outputs that live beyond a session (events, MQTT)
subscribe to ``on_added`` and ``on_removed``. A model change reaches a pipeline through its own handshake
(``AnalysisPipeline.use``, from ``Hub.deploy``). A camera's pipeline is budgeted for the costliest of its viewers'
networks (``ViewerNetworks``): each viewer's monitor pushes its view when it changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edge_app.decision.budget import send_time_ms, worst_network
from edge_app.pipeline import AnalysisPipeline
from edge_app.results import NetworkView


@dataclass(frozen=True)
class Entry:
    id: str  # "camera:NAME" or "session:ID"
    kind: str  # "camera" or "browser"
    name: str
    pipeline: AnalysisPipeline


Listener = Callable[[Entry], None]


class UnknownSource(KeyError):
    pass


class PipelineRegistry:
    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self.on_added: list[Listener] = []
        self.on_removed: list[Listener] = []

    def add(self, kind: str, name: str, pipeline: AnalysisPipeline) -> Entry:
        entry = Entry(f"{'camera' if kind == 'camera' else 'session'}:{name}", kind, name, pipeline)
        self._entries[entry.id] = entry
        for listener in list(self.on_added):
            listener(entry)
        return entry

    def remove(self, source_id: str) -> None:
        entry = self._entries.pop(source_id, None)
        if entry is not None:
            for listener in list(self.on_removed):
                listener(entry)

    def get(self, source_id: str) -> AnalysisPipeline:
        entry = self._entries.get(source_id)
        if entry is None:
            raise UnknownSource(source_id)
        return entry.pipeline

    def camera(self, name: str) -> AnalysisPipeline:
        return self.get(f"camera:{name}")

    def entries(self, kind: str | None = None) -> list[Entry]:
        return [e for e in self._entries.values() if kind is None or e.kind == kind]

    def pipelines(self) -> list[AnalysisPipeline]:
        return [e.pipeline for e in self._entries.values()]


class ViewerNetworks:
    """A camera's viewers' network views; the pipeline is given the costliest (its budget must suit every viewer),
    or the prior while nobody watches."""

    def __init__(self, pipeline: AnalysisPipeline, prior: NetworkView) -> None:
        self.pipeline = pipeline
        self.prior = prior
        self.views: dict[str, NetworkView] = {}

    def listener(self, viewer: str) -> Callable[[NetworkView], None]:
        return lambda view: self.update(viewer, view)

    def update(self, viewer: str, view: NetworkView) -> None:
        self.views[viewer] = view
        self._push()

    def remove(self, viewer: str) -> None:
        if self.views.pop(viewer, None) is not None:
            self._push()

    def _push(self) -> None:
        views = list(self.views.values())
        i = worst_network([v.estimate.rtt_ms + send_time_ms(v.frame_bytes, v.estimate.bitrate_bps) for v in views])
        self.pipeline.set_network(self.prior if i is None else views[i])
