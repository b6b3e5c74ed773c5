"""The client side of the results data channel, for aiortc peers in tests and benchmarks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edge_app import protocol


def results_channel(pc: Any, on_result: Callable[[dict[str, Any]], None],
                    on_uplink: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """Open the client's "results" data channel on ``pc``: answer the server's pings, pass results on (and the
    server's requests of what to send, as the page applies them to its camera's sender)."""
    channel = pc.createDataChannel("results", ordered=False, maxRetransmits=0)

    @channel.on("message")  # type: ignore[untyped-decorator]
    def on_message(message: str) -> None:
        msg = protocol.parse(message)
        if isinstance(msg, protocol.Ping):
            channel.send(protocol.Pong(msg.id).encode())
        elif isinstance(msg, protocol.Result):
            on_result(msg.data)
        elif isinstance(msg, protocol.Uplink) and on_uplink is not None:
            on_uplink(msg.to_json())

    return channel
