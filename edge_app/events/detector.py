"""Events from states: per source, the smoothed answer is a state; a state held long enough, sure enough, is an
event while it lasts.

``StateTracker.feed(t, label, confidence)`` with every answer of a source (``t`` in seconds). A label that has been
the answer for ``min_s`` seconds, each answer at confidence ≥ ``min_confidence``, becomes the source's state (a
``StateChange``); if it is one of the source's event labels, an event starts (``new``), is updated while it lasts
when its best confidence rises (``update``, at most once per ``update_every_s``; the caller keeps the snapshot of
that frame) and ends when another label has held (``end``, its end is when that label began). An answer below
``min_confidence`` restarts the hold. Flicker (a label that changes before ``min_s``) never becomes a state, so it
makes no event. Pure: no clock, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal


def event_id(source: str, label: str, start_s: float) -> str:
    """Readable, unique per source, label and start, safe in a URL and a file name: ``1765000000123-door-open``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{int(start_s * 1000)}-{source}-{label}")


@dataclass(frozen=True)
class Event:
    source: str
    label: str
    start_s: float  # when the label began to hold (the first answer of the hold), wall seconds
    best_confidence: float
    best_at_s: float  # the answer of the best confidence: its snapshot is the event's
    end_s: float | None = None
    id: str = ""
    ended_by: str | None = None  # None: another state held; "stop": the camera or the app stopped; "restart": the
    # app was gone (a crash, a power cut) and the next start closed it at the last time it heard of the camera


@dataclass(frozen=True)
class EventChange:
    kind: Literal["new", "update", "end"]
    before: Event | None  # for update and end: the event as it was last told
    after: Event


@dataclass(frozen=True)
class StateChange:
    source: str
    label: str
    since_s: float
    confidence: float


@dataclass
class StateTracker:
    source: str
    event_labels: frozenset[str]
    min_s: float = 2.0
    min_confidence: float = 0.6
    update_every_s: float = 1.0
    state: str | None = None  # the label that held last
    event: Event | None = None  # the event going on
    _candidate: str | None = None
    _since: float = 0.0
    _best: tuple[float, float] = (0.0, 0.0)  # (confidence, t) of the candidate's hold
    _told: Event | None = None
    _told_s: float = field(default=-1e18)

    def feed(self, t: float, label: str, confidence: float) -> list[StateChange | EventChange]:
        out: list[StateChange | EventChange] = []
        if label != self._candidate or confidence < self.min_confidence:
            self._candidate = label if confidence >= self.min_confidence else None
            self._since, self._best = t, (confidence, t)
            return out
        if confidence > self._best[0]:
            self._best = (confidence, t)
        held = t - self._since >= self.min_s
        if held and label != self.state:
            out += self._new_state(label)
        elif label == self.state and self.event is not None and confidence > self.event.best_confidence:
            self.event = replace(self.event, best_confidence=confidence, best_at_s=t)
            if t - self._told_s >= self.update_every_s:
                out.append(EventChange("update", self._told, self.event))
                self._told, self._told_s = self.event, t
        return out

    def _new_state(self, label: str) -> list[StateChange | EventChange]:
        out: list[StateChange | EventChange] = []
        if self.event is not None:  # another label held: the event ended when it began
            ended = replace(self.event, end_s=self._since)
            out.append(EventChange("end", self._told, ended))
            self.event = None
        self.state = label
        out.append(StateChange(self.source, label, self._since, self._best[0]))
        if label in self.event_labels:
            self.event = Event(self.source, label, self._since, self._best[0], self._best[1],
                               id=event_id(self.source, label, self._since))
            out.append(EventChange("new", None, self.event))
            self._told, self._told_s = self.event, self._since
        return out

    @property
    def candidate_best_at(self) -> float | None:
        """When the label holding now (or trying to) was answered with its best confidence so far: the frame to
        keep, should it become an event (its snapshot)."""
        return None if self._candidate is None else self._best[1]

    def close(self, t: float) -> list[EventChange]:
        """The source stopped (or the app): an event going on ends now."""
        if self.event is None:
            return []
        ended = replace(self.event, end_s=t, ended_by="stop")
        self.event, self.state, self._candidate = None, None, None
        return [EventChange("end", self._told, ended)]
