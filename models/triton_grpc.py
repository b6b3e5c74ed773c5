"""The gRPC side of the Triton runner (``models.triton_runner``): tritonclient's channel as the runner opens it,
its inputs, what a failure means, and the pool of system shared-memory regions frames go through when client and
server share a host."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np

from models.triton_host import ACCESS_HEADER


class SharedInputs:
    """A pool of system shared-memory regions for frames' inputs, registered with Triton (once per server life)."""

    def __init__(self, count: int, nbytes: int, access_token: str | None) -> None:
        import uuid

        from tritonclient.utils import shared_memory as shm

        self.shm = shm
        self.nbytes = nbytes
        tag = uuid.uuid4().hex[:12]
        self.names = [f"edge_{tag}_{i}" for i in range(count)]
        self.handles = {n: shm.create_shared_memory_region(n, f"/{n}", nbytes) for n in self.names}
        self.free: asyncio.Queue[str] = asyncio.Queue()
        for n in self.names:
            self.free.put_nowait(n)
        self.registered = False
        self.headers = {ACCESS_HEADER: access_token} if access_token else None

    async def take(self, client: Any, x: np.ndarray) -> str:
        if not self.registered:
            for n in self.names:
                with contextlib.suppress(Exception):  # a region left registered by a client before this one
                    await client.unregister_system_shared_memory(n, headers=self.headers)
                await client.register_system_shared_memory(n, f"/{n}", self.nbytes, headers=self.headers)
            self.registered = True
        name = await self.free.get()
        self.shm.set_shared_memory_region(self.handles[name], [x])
        return name

    def give(self, name: str) -> None:
        self.free.put_nowait(name)

    def lost(self) -> None:
        self.registered = False

    async def release(self, client: Any) -> None:
        with contextlib.suppress(Exception):
            for n in self.names:
                await client.unregister_system_shared_memory(n, headers=self.headers)
        self.destroy()

    def destroy(self) -> None:
        for h in self.handles.values():
            with contextlib.suppress(Exception):
                self.shm.destroy_shared_memory_region(h)
        self.handles = {}


def open_client(grpcclient: Any, url: str) -> Any:
    """tritonclient's channel with gRPC's reconnect backoff capped at 1 s (its default grows to 2 min, so a server
    back after a long outage would wait for the channel's next try, whatever ``RETRY_S`` says)."""
    from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE

    return grpcclient.InferenceServerClient(url, channel_args=[
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1000)])


def tensor(grpcclient: Any, name: str, value: np.ndarray, dtype: str) -> Any:
    i = grpcclient.InferInput(name, list(value.shape), dtype)
    i.set_data_from_numpy(value)
    return i


def reason(exc: BaseException) -> str:
    text = str(exc).lower()
    if "queue" in text:  # Triton's "Exceeds maximum queue size" (gRPC UNAVAILABLE): full, not down
        return "rejected"
    if isinstance(exc, TimeoutError) or "deadline" in text or "timeout" in text:
        return "timeout"
    if "unavailable" in text or "connect" in text or isinstance(exc, OSError):
        return "unavailable"
    return "rejected"
