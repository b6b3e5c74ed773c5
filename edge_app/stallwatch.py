"""Event-loop stall watchdog: say when the loop stops turning, and what it was doing.

A frame's answer is only on time if the event loop keeps turning: it reads
RTP, hands frames to the inference thread, sends results and encodes the
annotated video.  A coroutine beats a heartbeat every ``interval_s``; a
daemon thread checks it, and when the loop has not beaten for ``warn_s`` it
logs a warning with the loop thread's stack *while the stall is on*, so the
culprit is named, not guessed.  When the loop comes back, the stall's length
goes to the ``edge_event_loop_lag_seconds`` histogram (every heartbeat's
lateness does) and to the log with the process CPU used meanwhile: about a
core per second of stall means the loop was busy computing; much less means it
was starved (another process on the cores) or waiting on a lock.

asyncio's debug mode reports slow callbacks too, but only after they return
and at a cost that is not meant for production; this costs one wake-up per
``interval_s`` on the loop and one in the thread.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from prometheus_client import Histogram

from streams.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class StallWatch:
    def __init__(self, lag: Histogram, interval_s: float = 0.05, warn_s: float = 0.25, stack_frames: int = 12) -> None:
        if not 0 < interval_s < warn_s:
            raise ValueError(f"need 0 < interval_s < warn_s, got {interval_s} and {warn_s}")
        self.lag = lag
        self.interval_s = interval_s
        self.warn_s = warn_s
        self.stack_frames = stack_frames
        self.stalls = 0  # stalls of warn_s or more, counted when they end
        self.longest_s = 0.0
        self._beat = time.monotonic()
        self._beat_cpu = time.process_time()
        self._loop_thread_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reported_beat: float | None = None  # the heartbeat whose stall the thread has already reported

    def start(self) -> None:
        self._loop_thread_id = threading.get_ident()
        self._beat, self._beat_cpu = time.monotonic(), time.process_time()
        self._stop.clear()
        self._task = asyncio.create_task(self._heartbeat(), name="stall-watch")
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        await cancel_and_wait(self._task)
        self._task = None
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2.0)
            self._thread = None

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            now, cpu = time.monotonic(), time.process_time()
            gap = now - self._beat
            late = max(0.0, gap - self.interval_s)
            self.lag.observe(late)
            if gap >= self.warn_s:
                self.stalls += 1
                self.longest_s = max(self.longest_s, gap)
                log.warning("event loop stalled for %.0f ms (process CPU meanwhile: %.0f ms); frames due in that "
                            "time are late", gap * 1e3, (cpu - self._beat_cpu) * 1e3)
            self._beat, self._beat_cpu = now, cpu

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            beat = self._beat
            if time.monotonic() - beat < self.warn_s or self._reported_beat == beat:
                continue
            self._reported_beat = beat
            frame = sys._current_frames().get(self._loop_thread_id or -1)
            stack = "".join(traceback.format_stack(frame, self.stack_frames)) if frame is not None else "(no stack)\n"
            log.warning("event loop has not turned for %.0f ms; it is in:\n%s",
                        (time.monotonic() - beat) * 1e3, stack.rstrip())
