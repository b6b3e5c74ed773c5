"""Every message that crosses the data channel, both ways: one frozen type each, its JSON form and its parser.

This is the one place the Python side spells a message type. ``docs/protocol.md`` describes each message;
``tests/protocol/vectors.json`` holds one JSON text per case, read by the Python tests and, in Chromium, by the
page's ``static/protocol.js`` (so the page and the server cannot drift apart).

Server to peer: ``result`` (compact, or every field with ``"detail": true``), ``ping``, ``source``, ``uplink``,
``model``, ``video``, ``error``. Peer to server: ``ping`` and ``pong`` (and aiortc's example client's plain text
``ping <time>``, answered ``pong <time>``). Anything else from a peer is answered with an ``error``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

from edge_app.results import FrameResult

MAX_MESSAGE_BYTES = 4096  # a peer sends only small control messages


class ProtocolError(ValueError):
    """A text that is not a message of this protocol; ``str()`` is the reason, fit to send back."""


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, **asdict(self)}

    def encode(self) -> str:
        return _dumps(self.to_json())


@dataclass(frozen=True)
class Ping(Message):
    """Either way: answer with a ``pong`` of the same ``id``. ``t``: the sender's wall clock in ms (the server's
    pings carry it; the page lines up its frames with it)."""

    TYPE: ClassVar[str] = "ping"
    id: int
    t: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "id": self.id, **({} if self.t is None else {"t": self.t})}


@dataclass(frozen=True)
class Pong(Message):
    TYPE: ClassVar[str] = "pong"
    id: int | None


@dataclass(frozen=True)
class Source(Message):
    """A watched camera's state changed: "streaming", "reconnecting" (``reason`` says why, redacted), "stopped"."""

    TYPE: ClassVar[str] = "source"
    camera: str
    state: str
    reason: str | None = None


@dataclass(frozen=True)
class Uplink(Message):
    """What the browser should send of its camera: a bitrate cap (None: none), a resolution divisor, a frame rate
    (the page applies it with ``RTCRtpSender.setParameters``)."""

    TYPE: ClassVar[str] = "uplink"
    max_bitrate_bps: int | None
    scale_down: float
    max_fps: float


@dataclass(frozen=True)
class Model(Message):
    """The server now serves another model: results carry these classes from the next one on."""

    TYPE: ClassVar[str] = "model"
    name: str
    classes: tuple[str, ...]
    num_exits: int

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "name": self.name, "classes": list(self.classes), "num_exits": self.num_exits}


@dataclass(frozen=True)
class Video(Message):
    """What the video sent back shows: "camera" (its own picture; the page draws the analysis) or "annotated"."""

    TYPE: ClassVar[str] = "video"
    picture: Literal["camera", "annotated"]


@dataclass(frozen=True)
class Error(Message):
    """A message the server refused, and why."""

    TYPE: ClassVar[str] = "error"
    reason: str


@dataclass(frozen=True)
class Result(Message):
    """One frame's answer. ``data`` is the whole JSON object (compact or, with ``detail``, every field); the
    fields a client acts on are read out and checked."""

    TYPE: ClassVar[str] = "result"
    source: str
    frame: int
    exit: int
    label: str  # the smoothed answer's class name
    confidence: float
    deadline_met: bool
    stamp: int | None
    detail: bool
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)


ALL: tuple[type[Message], ...] = (Result, Ping, Pong, Source, Uplink, Model, Video, Error)
BY_TYPE = {m.TYPE: m for m in ALL}


def result(r: FrameResult, classes: list[str], detail: bool, **extra: Any) -> Result:
    """The message for one analysed frame: compact (what the page and a user's script need, about half the
    bytes: at 30 fps the full form alone is ~230 kbit/s) or every field (``detail``), plus ``extra`` keys (the
    session's ``rtt_source``; on a detailed one ``session`` and ``receive_estimate_bps``)."""
    data = {**(_full(r, classes) if detail else _compact(r, classes)), **extra}
    return Result(source=r.source, frame=r.seq, exit=r.exit, label=classes[r.smoothed_class],
                  confidence=float(data["smoothed"]["confidence"]), deadline_met=r.deadline_met, stamp=r.stamp,
                  detail=detail, data=data)


def _r(v: float, digits: int) -> float:
    return round(float(v), digits)


def _compact(r: FrameResult, classes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": Result.TYPE, "source": r.source, "frame": r.seq,
        "raw": {"class": r.raw_class, "confidence": _r(r.raw_confidence, 2)},
        "smoothed": {"class": r.smoothed_class, "label": classes[r.smoothed_class],
                     "confidence": _r(r.smoothed_confidence, 2)},
        "exit": r.exit, "exits_run": r.exits_run, "horizon": r.horizon, "reused": r.reused,
        "deadline_met": r.deadline_met, "latency_ms": _r(r.latency_ms, 2),
        "arrived_unix_ms": round(r.arrived_unix_ms, 1),
        "budget": {"total_ms": _r(r.budget.total_ms, 2), "compute_ms": _r(r.budget.compute_ms, 2),
                   "late_ms": _r(r.budget.late_ms, 2)},
        "costs": {"actual_ms": _r(r.actual_ms, 2)},
        "network": {"rtt_ms": _r(r.network.rtt_ms, 2), "bitrate_bps": round(r.network.bitrate_bps),
                    "rtt_from_prior": r.network.rtt_from_prior},
        "frame_size": list(r.frame_size),
    }
    optional = {"stamp": r.stamp, "truth": None if r.truth is None else _truth(r), "error": r.error,
                "skipped": r.skipped, "unchanged": r.unchanged or None}
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def _full(r: FrameResult, classes: list[str]) -> dict[str, Any]:
    return {
        "type": Result.TYPE, "source": r.source, "frame": r.seq, "stamp": r.stamp,
        "arrived_unix_ms": _r(r.arrived_unix_ms, 3),
        "raw": {"class": r.raw_class, "label": classes[r.raw_class], "confidence": _r(r.raw_confidence, 3)},
        "smoothed": {"class": r.smoothed_class, "label": classes[r.smoothed_class],
                     "confidence": _r(r.smoothed_confidence, 3)},
        "exit": r.exit, "exits_run": r.exits_run, "horizon": r.horizon,
        "costs": {"predicted_ms": _r(r.predicted_ms, 3), "actual_ms": _r(r.actual_ms, 3),
                  "segments_ms": [_r(v, 3) for v in r.segments_ms]},
        "budget": {k: _r(v, 3) for k, v in asdict(r.budget).items()},
        "network": {k: (v if isinstance(v, bool) else _r(v, 3)) for k, v in asdict(r.network).items()},
        "stages_ms": {k: _r(v, 3) for k, v in r.stages_ms.items()},
        "latency_ms": _r(r.latency_ms, 3), "deadline_met": r.deadline_met, "dropped_stale": r.dropped_stale,
        "error": r.error, "reused": r.reused, "skipped": r.skipped, "unchanged": r.unchanged,
        "frame_size": list(r.frame_size),
        "truth": None if r.truth is None else _truth(r), "detail": True,
    }


def _truth(r: FrameResult) -> dict[str, Any]:
    return {"label": r.truth, "raw_correct": r.raw_correct, "smoothed_correct": r.smoothed_correct}


# --- parsing ---------------------------------------------------------------------------------------------------

_KINDS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def _field(obj: dict[str, Any], key: str, kind: str, optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    ok = isinstance(value, _KINDS[kind]) and not (kind in ("int", "float") and isinstance(value, bool))
    if not ok:
        raise ProtocolError(f"{obj.get('type')!r} message: {key!r} must be {'an' if kind == 'int' else 'a'} {kind}"
                            + (" or null" if optional else ""))
    return value


def _parse_result(obj: dict[str, Any]) -> Result:
    smoothed = obj.get("smoothed")
    if not isinstance(smoothed, dict):
        raise ProtocolError("'result' message: 'smoothed' must be an object")
    return Result(source=_field(obj, "source", "str"), frame=_field(obj, "frame", "int"),
                  exit=_field(obj, "exit", "int"), label=_field(smoothed, "label", "str"),
                  confidence=float(_field(smoothed, "confidence", "float")),
                  deadline_met=_field(obj, "deadline_met", "bool"), stamp=_field(obj, "stamp", "int", True),
                  detail=obj.get("detail") is True, data=obj)


def _from_json(obj: dict[str, Any]) -> Message:
    kind = obj.get("type")
    if kind == Result.TYPE:
        return _parse_result(obj)
    if kind == Ping.TYPE:
        return Ping(_field(obj, "id", "int"), _field(obj, "t", "float", True))
    if kind == Pong.TYPE:
        return Pong(_field(obj, "id", "int", True))
    if kind == Source.TYPE:
        return Source(_field(obj, "camera", "str"), _field(obj, "state", "str"), _field(obj, "reason", "str", True))
    if kind == Uplink.TYPE:
        return Uplink(_field(obj, "max_bitrate_bps", "int", True), float(_field(obj, "scale_down", "float")),
                      float(_field(obj, "max_fps", "float")))
    if kind == Model.TYPE:
        classes = obj.get("classes")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ProtocolError("'model' message: 'classes' must be a list of strings")
        return Model(_field(obj, "name", "str"), tuple(classes), _field(obj, "num_exits", "int"))
    if kind == Video.TYPE:
        picture = obj.get("picture")
        if picture not in ("camera", "annotated"):
            raise ProtocolError("'video' message: 'picture' must be 'camera' or 'annotated'")
        return Video(picture)
    if kind == Error.TYPE:
        return Error(_field(obj, "reason", "str"))
    raise ProtocolError(f"unknown message type {kind!r}; expected one of {sorted(BY_TYPE)}")


def parse(text: str | bytes) -> Message:
    """Any message of the protocol (a client's view: what the server sends, and what it accepts)."""
    if not isinstance(text, str) or len(text.encode()) > MAX_MESSAGE_BYTES * 16:
        raise ProtocolError("messages are JSON text")
    try:
        obj = json.loads(text)
    except ValueError:
        raise ProtocolError("not JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError("a message is a JSON object with a 'type'")
    return _from_json(obj)


@dataclass(frozen=True)
class TextPing:
    """aiortc's example client (``examples/server/client.js``) sends ``ping <time>`` and expects ``pong <time>``."""

    rest: str

    def answer(self) -> str:
        return "pong" + self.rest


def parse_from_peer(text: object) -> Ping | Pong | TextPing:
    """A message a peer sent the server; ``ProtocolError`` (the reason to send back) for anything else."""
    if not isinstance(text, str) or len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError("messages must be JSON text under 4 KiB")
    if text.startswith("ping") and not text.startswith("ping{"):
        return TextPing(text[4:])
    try:
        obj = json.loads(text)
    except ValueError:
        raise ProtocolError("not JSON") from None
    kind = obj.get("type") if isinstance(obj, dict) else None
    if kind not in (Ping.TYPE, Pong.TYPE):
        raise ProtocolError(f"unknown message type {kind!r}; expected 'ping' or 'pong'")
    msg = _from_json(obj)
    assert isinstance(msg, Ping | Pong)
    return msg

