"""What the app needs of a camera, whatever reads it: ``CameraSource``.

An RTSP camera (``streams.rtsp``), a video file (``streams.filecam``) and the labelled demo frames
(``streams.demo``) all have a name, a kind, a state, a slot the newest frame waits in, ``start``/``stop`` and a
``status()`` for ``/status``; a source whose compressed stream a browser could take as it is also says why not
(``forward_problem``) and takes a ``packet_sink``. The hub, ``/metrics``, ``/status`` and the page work on this
and nothing else.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from streams.codecinfo import PacketSink
from streams.frames import LatestSlot, SourceFrame

STATES = ("connecting", "streaming", "backoff", "stopped")


@runtime_checkable
class CameraSource(Protocol):
    packet_sink: PacketSink | None  # gets each compressed packet, when forwarding is possible

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...  # "rtsp", "file", "demo"

    @property
    def state(self) -> str: ...  # one of STATES

    @property
    def slot(self) -> LatestSlot[SourceFrame] | None: ...  # made by start()

    @property
    def frames(self) -> int: ...

    @property
    def reconnects(self) -> int: ...

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
