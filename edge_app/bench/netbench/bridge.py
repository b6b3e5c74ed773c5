"""The impairing bridge: a user-space L2 bridge between two interfaces over raw packet sockets.

Run inside the middle namespace (``python -m edge_app.bench.netbench.bridge A B --trace F --start-at EPOCH``).
Every frame that arrives on one interface is sent out of the other after the trace's one-way delay
(plus a uniform 0..jitter), or dropped with the trace's loss probability; the rate limit is a ``tbf``
qdisc on both interfaces, changed with ``tc`` when the trace says so.  Without jitter frames leave in
the order they came (a falling delay does not let later frames overtake earlier ones).  Before
``--start-at`` the first row is in force; after the trace's end the last row stays.

Each change is logged as one JSON line with its wall-clock time (``--log``); on SIGTERM/SIGINT a
summary line gives frames forwarded and dropped per direction and how late frames left against their
due time (the bridge's own timing error), then the bridge exits.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import numpy as np

from edge_app.bench.netbench.trace import Step, Trace, load_trace

ETH_P_ALL = 0x0003
MAX_FRAME = 65_536


def open_raw(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((ifname, 0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    return s


def tbf(ifname: str, rate_kbit: float | None) -> None:
    """Set (or clear, ``None``) a tbf rate limit on ``ifname``'s egress."""
    if rate_kbit is None:
        subprocess.run(["tc", "qdisc", "del", "dev", ifname, "root"], capture_output=True, check=False)
        return
    burst = max(3_200, int(rate_kbit * 1000 / 8 / 50))  # 20 ms of tokens, at least two full frames
    subprocess.run(["tc", "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", f"{rate_kbit:g}kbit",
                    "burst", str(burst), "latency", "400ms"], check=True, capture_output=True)


class Direction:
    """Frames from one interface waiting for their time to leave by the other."""

    def __init__(self, name: str, out: socket.socket, rng: random.Random) -> None:
        self.name = name
        self.out = out
        self.rng = rng
        self.heap: list[tuple[float, int, bytes]] = []
        self.cond = threading.Condition()
        self.seq = 0
        self.last_due = 0.0
        self.forwarded = 0
        self.bytes_forwarded = 0
        self.dropped = 0
        self.send_errors = 0
        self.late_ms: list[float] = []

    def push(self, frame: bytes, now: float, step: Step) -> None:
        if step.loss_pct > 0 and self.rng.random() * 100 < step.loss_pct:
            self.dropped += 1
            return
        due = now + step.one_way_ms / 1e3
        if step.jitter_ms > 0:
            due += self.rng.random() * step.jitter_ms / 1e3  # may reorder, as real jitter does
        else:
            due = max(due, self.last_due)  # keep order when the delay falls
        self.last_due = max(self.last_due, due)
        with self.cond:
            heapq.heappush(self.heap, (due, self.seq, frame))
            self.seq += 1
            self.cond.notify()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self.cond:
                if not self.heap:
                    self.cond.wait(0.1)
                    continue
                due = self.heap[0][0]
                wait = due - time.monotonic()
                if wait > 0:
                    self.cond.wait(min(wait, 0.1))
                    continue
                _, _, frame = heapq.heappop(self.heap)
            try:
                self.out.send(frame)
                self.forwarded += 1
                self.bytes_forwarded += len(frame)
            except OSError:  # e.g. ENOBUFS when tbf's queue is full: the frame is lost, as on a real link
                self.send_errors += 1
            if len(self.late_ms) < 200_000:
                self.late_ms.append((time.monotonic() - due) * 1e3)


class Bridge:
    def __init__(self, a: str, b: str, trace: Trace, start_at: float, log: IO[str], seed: int = 0) -> None:
        self.ifaces = (a, b)
        self.trace = trace
        self.start_at = start_at  # wall clock (time.time()) of the trace's t = 0
        self.log = log
        self.socks = (open_raw(a), open_raw(b))
        rng = random.Random(seed)
        self.dirs = (Direction(f"{a}->{b}", self.socks[1], rng), Direction(f"{b}->{a}", self.socks[0], rng))
        self.stop = threading.Event()
        self.step = trace.at(-1.0)
        self._emit("start", self.step)
        self._apply_rate(None, self.step)

    def _emit(self, event: str, step: Step) -> None:
        rec = {"event": event, "wall": time.time(), "t_s": round(time.time() - self.start_at, 4),
               "one_way_ms": step.one_way_ms, "jitter_ms": step.jitter_ms, "loss_pct": step.loss_pct,
               "rate_kbit": step.rate_kbit}
        self.log.write(json.dumps(rec) + "\n")
        self.log.flush()

    def _apply_rate(self, old: Step | None, new: Step) -> None:
        if old is None or old.rate_kbit != new.rate_kbit:
            for ifname in self.ifaces:
                tbf(ifname, new.rate_kbit)

    def _schedule(self) -> None:
        while not self.stop.wait(0.005):
            new = self.trace.at(time.time() - self.start_at)
            if new != self.step:
                self._apply_rate(self.step, new)
                self.step = new
                self._emit("change", new)

    def _receive(self) -> None:
        socks = self.socks
        while not self.stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.1)
            for s in ready:
                try:
                    frame, addr = s.recvfrom(MAX_FRAME)
                except BlockingIOError:
                    continue
                if addr[2] == socket.PACKET_OUTGOING:  # our own sends, seen again on the way out
                    continue
                self.dirs[0 if s is socks[0] else 1].push(frame, time.monotonic(), self.step)

    def run(self) -> dict[str, object]:
        threads = [threading.Thread(target=self._schedule, daemon=True),
                   threading.Thread(target=self._receive, daemon=True)]
        threads += [threading.Thread(target=d.run, args=(self.stop,), daemon=True) for d in self.dirs]
        for t in threads:
            t.start()
        try:
            sent = [d.bytes_forwarded for d in self.dirs]
            t_last = time.monotonic()
            while not self.stop.wait(1.0):  # the throughput each way, once a second (the benchmark plots it)
                now = time.monotonic()
                rec: dict[str, object] = {"event": "throughput", "wall": time.time(),
                                          "t_s": round(time.time() - self.start_at, 3)}
                for i, d in enumerate(self.dirs):
                    rec[d.name] = round((d.bytes_forwarded - sent[i]) * 8 / 1e3 / (now - t_last), 1)  # kbit/s
                    sent[i] = d.bytes_forwarded
                t_last = now
                self.log.write(json.dumps(rec) + "\n")
                self.log.flush()
        finally:
            self.stop.set()
            for t in threads:
                t.join(2)
            self._apply_rate(self.step, Step(0, 0))
        summary: dict[str, object] = {"event": "summary", "wall": time.time()}
        for d in self.dirs:
            late = np.asarray(d.late_ms or [0.0])
            summary[d.name] = {"forwarded": d.forwarded, "dropped_by_trace": d.dropped, "send_errors": d.send_errors,
                               "late_ms_p50": round(float(np.percentile(late, 50)), 3),
                               "late_ms_p99": round(float(np.percentile(late, 99)), 3),
                               "late_ms_max": round(float(late.max()), 3)}
        self.log.write(json.dumps(summary) + "\n")
        self.log.flush()
        return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edge_app.bench.netbench.bridge", description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--trace", required=True, help="trace CSV (or the name of a shipped trace)")
    p.add_argument("--start-at", type=float, default=None, help="wall-clock time of the trace's t=0 (default: now)")
    p.add_argument("--log", type=Path, default=None, help="JSON lines of applied changes (default: stdout)")
    p.add_argument("--seed", type=int, default=0, help="seed of the loss and jitter draws")
    args = p.parse_args(argv)
    trace = load_trace(args.trace)
    log = args.log.open("a") if args.log else open("/dev/stdout", "w")  # noqa: SIM115
    bridge = Bridge(args.a, args.b, trace, args.start_at or time.time(), log, args.seed)
    signal.signal(signal.SIGTERM, lambda *_: bridge.stop.set())
    signal.signal(signal.SIGINT, lambda *_: bridge.stop.set())
    bridge.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
