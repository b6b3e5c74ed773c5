"""Process-wide WebRTC settings that read no private state: which addresses ICE offers as host candidates, and
aiortc's lowest encoder bitrate. (aiortc's private state is read only in ``streams.aiortc_adapter``.)"""

from __future__ import annotations

from collections.abc import Sequence

import aioice.ice
from aiortc.codecs import h264, vpx

_HOST_ADDRESSES = aioice.ice.get_host_addresses


def lower_video_bitrate_floor(min_bps: int) -> None:
    """aiortc's encoders never go under 250 kbit/s (VP8) or 500 kbit/s (H.264): too much for a narrow path,
    where fewer, smaller frames are better than a queue.  Lower their floor (module constants, read per call)."""
    vpx.MIN_BITRATE = min(vpx.MIN_BITRATE, min_bps)
    h264.MIN_BITRATE = min(h264.MIN_BITRATE, min_bps)


def restrict_host_addresses(addresses: Sequence[str] | None) -> None:
    """Every new ICE connection of this process offers exactly ``addresses`` as host candidates (None: aioice's
    default, every interface's but loopback). aioice has no per-connection setting for it, so it is its module
    function, replaced here: tests stay on loopback, a box with several interfaces offers only the cameras'."""
    if addresses is None:
        aioice.ice.get_host_addresses = _HOST_ADDRESSES
        return
    fixed = list(addresses)

    def only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in fixed if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = only


def machine_host_addresses() -> list[str]:
    """The addresses aioice offers by default (every interface's but loopback)."""
    return list(_HOST_ADDRESSES(use_ipv4=True, use_ipv6=True))
