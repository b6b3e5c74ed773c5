"""Stopping asyncio tasks: the one helper every owner of a task uses."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None and finished ones are skipped, and so is the task calling this) and wait until each
    has ended, whatever it raised."""
    current = asyncio.current_task()
    pending = [t for t in tasks if t is not None and t is not current and not t.done()]
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
