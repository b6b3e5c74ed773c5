"""The client side of the results data channel, for aiortc peers in tests and benchmarks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def results_channel(pc: Any, on_result: Callable[[dict[str, Any]], None],
                    on_uplink: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """Open the client's "results" data channel on ``pc``: answer the server's pings, pass results on (and the
    server's requests of what to send, as the page applies them to its camera's sender)."""
    channel = pc.createDataChannel("results", ordered=False, maxRetransmits=0)

    @channel.on("message")  # type: ignore[untyped-decorator]
    def on_message(message: str) -> None:
        msg = json.loads(message)
        if msg["type"] == "ping":
            channel.send(json.dumps({"type": "pong", "id": msg["id"]}))
        elif msg["type"] == "result":
            on_result(msg)
        elif msg["type"] == "uplink" and on_uplink is not None:
            on_uplink(msg)

    return channel
