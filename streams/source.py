"""What the app needs of a camera, whatever reads it: ``CameraSource``.

An RTSP camera (``streams.rtsp``), a video file (``streams.filecam``) and the labelled demo frames
(``streams.demo``) all have a name, a kind, a state, a slot the newest frame waits in, ``start``/``stop`` and a
``status()`` for ``/status``; a source whose compressed stream a browser could take as it is also says why not
(``forward_problem``) and takes a ``packet_sink``. The hub, ``/metrics``, ``/status`` and the page work on this
and nothing else.

Every source's ``status()`` starts from ``common_status``: the keys in ``STATUS_KEYS`` are there for every kind
(the page reads only those, and treats anything else as optional); a kind adds its own after them.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from streams.codecinfo import PacketSink
from streams.frames import LatestSlot, SourceFrame
from streams.redact import redact

STATES = ("connecting", "streaming", "backoff", "stopped")


@runtime_checkable
class CameraSource(Protocol):
    packet_sink: PacketSink | None  # gets each compressed packet, when forwarding is possible

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...  # "rtsp", "file", "demo"

    @property
    def safe_url(self) -> str: ...  # where it reads from, with no secret in it

    @property
    def transport_in_use(self) -> str: ...  # how frames reach the box now: "tcp" / "udp" (RTSP), "file", "demo"

    @property
    def state(self) -> str: ...  # one of STATES

    @property
    def slot(self) -> LatestSlot[SourceFrame] | None: ...  # made by start()

    @property
    def frames(self) -> int: ...

    @property
    def reconnects(self) -> int: ...

    @property
    def connects(self) -> int: ...  # times frames started to flow

    @property
    def last_error(self) -> str | None: ...

    @property
    def resolution(self) -> tuple[int, int] | None: ...

    @property
    def labelled(self) -> bool: ...  # its frames say what they show (``SourceFrame.truth``): live accuracy

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def forward_problem(self) -> str | None: ...


# what every source's status() holds, whatever its kind
STATUS_KEYS = ("name", "kind", "url", "state", "transport_in_use", "frames", "reconnects", "connects", "last_error",
               "resolution", "labelled")


def common_status(source: CameraSource) -> dict[str, Any]:
    """The part of ``status()`` every kind has (``STATUS_KEYS``), read through the protocol; no secret in it."""
    error = source.last_error
    return {"name": source.name, "kind": source.kind, "url": source.safe_url, "state": source.state,
            "transport_in_use": source.transport_in_use, "frames": source.frames, "reconnects": source.reconnects,
            "connects": source.connects, "last_error": None if error is None else redact(error),
            "resolution": None if source.resolution is None else list(source.resolution),
            "labelled": source.labelled}
