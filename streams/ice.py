"""Which local addresses aioice offers as host candidates.

aioice leaves 127.0.0.1 out of its host candidates
(``aioice.ice.get_host_addresses``), so two peers on one machine connect over
its interface address.  ``restrict_host_addresses(["127.0.0.1"])`` makes
every new ICE connection of this process offer exactly the given addresses:
tests use it to stay on loopback, and a box with several interfaces can use
it to offer only the camera network's.  ``None`` restores aioice's default.
"""

from __future__ import annotations

from collections.abc import Sequence

import aioice.ice

_ORIGINAL = aioice.ice.get_host_addresses


def machine_host_addresses() -> list[str]:
    """The addresses aioice offers by default (every interface's but loopback)."""
    return list(_ORIGINAL(use_ipv4=True, use_ipv6=True))


def restrict_host_addresses(addresses: Sequence[str] | None) -> None:
    if addresses is None:
        aioice.ice.get_host_addresses = _ORIGINAL
        return
    fixed = list(addresses)

    def only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in fixed if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = only
