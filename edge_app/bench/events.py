"""``edge-app bench-events``: what keeping and sending events costs, in one run.

* ``cpu``: ``bench-pipeline``'s results-only path (VP8 in at 640x480, 30 fps, the real pipeline and model) on demo
  images held 3 s each, so that every image is a state and an event (``[events]`` and ``[[webhooks]]`` as shipped:
  ``min_s`` 2 s; ``min_confidence`` 0.3; an event every 3 s is far more than a real scene makes). Off and on
  alternate in pairs; *on* follows the pipeline with the store (snapshots on), MQTT to
  Debian's ``mosquitto`` (started here, when installed) and one signed webhook to a receiver in another process.
  It prints the process's CPU (% of one core) of each run, the paired differences (the order within a pair
  alternates, so a drift cancels), their median and a bootstrap 95 % interval of their mean.
* ``store``: 1,000 events a second (each a ``new`` and, a second later, its ``end``: 2,000 writes a second) into
  the store through ``EventsOutput`` (and MQTT when the broker is there) for ``--store-s`` seconds, while a 5 ms
  ticker measures the event loop's lag: its p50, p99 and max, what was written, queued and dropped.
* ``api``: ``GET /api/events`` over a store of ``--api-events`` events on loopback HTTP: newest first, by camera,
  by label, a time range, and pages 2-5 through the cursor; p50 and p95 per kind and overall.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edge_app.bench.rtsp_camera import free_port
from edge_app.config import AppConfig
from edge_app.config.outputs import MqttConfig, WebhookConfig
from edge_app.events.detector import Event, EventChange, StateTracker
from edge_app.events.mqtt import MqttOutput
from edge_app.events.output import EventsOutput
from edge_app.events.store import EventStore
from edge_app.events.webhooks import Webhooks
from edge_app.pipeline import AnalysisPipeline
from edge_app.registry import PipelineRegistry
from models.service import InferenceService

RECEIVER = """
import sys
from aiohttp import web
async def hook(request):
    await request.read()
    return web.Response(status=204)
app = web.Application()
app.router.add_post("/hook", hook)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""
SECRET = "bench-webhook-secret-0123456789"


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args!r} did not listen on {port}")


@contextlib.contextmanager
def mosquitto(folder: Path) -> Iterator[int | None]:
    """Debian's broker on a free loopback port, or None where it is not installed."""
    exe = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    if exe is None:
        print("no mosquitto here (apt-get install mosquitto): MQTT is left out of this run", file=sys.stderr)
        yield None
        return
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest none\n"
                    + ("user root\n" if os.geteuid() == 0 else ""))
    proc = subprocess.Popen([exe, "-c", str(conf)], stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def receiver() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)], stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        proc.terminate()
        proc.wait(10)


class Outputs:
    """The events outputs as ``serve`` wires them, around one bench pipeline."""

    def __init__(self, folder: Path, classes: list[str], broker: int | None, hook: str | None,
                 min_s: float = 2.0) -> None:
        self.store = EventStore(folder)
        self.store.open()
        self.registry = PipelineRegistry()
        self.tasks: list[asyncio.Task[None]] = []
        self.mqtt: MqttOutput | None = None
        self.hooks: Webhooks | None = None
        listeners: list[Any] = []
        if broker is not None:
            self.mqtt = MqttOutput(MqttConfig(enabled=True, port=broker, prefix="bench"), lambda p: p, "bench",
                                   dict)
            listeners.append(self.mqtt)
            self.tasks.append(asyncio.ensure_future(self.mqtt.run()))
        if hook is not None:
            self.hooks = Webhooks([WebhookConfig(url=hook, secret=SECRET)])
            listeners.append(self.hooks)
            self.tasks.append(asyncio.ensure_future(self.hooks.run()))
        mqtt = self.mqtt
        self.output = EventsOutput(self.store, self.registry,
                                   lambda cam: StateTracker(cam, frozenset(classes), min_s, 0.3), lambda cam: "bench",
                                   listeners=listeners, snapshot_listeners=[] if mqtt is None else [mqtt.snapshot],
                                   camera_listeners=[] if mqtt is None else [mqtt.add_camera])

    def follow(self, pipe: AnalysisPipeline) -> Callable[[], None]:
        self.registry.add("camera", "bench", pipe)
        return lambda: self.registry.remove("camera:bench")

    def summary(self) -> str:
        parts = [f"changes {dict(self.output.counts)}", f"store written {self.store.written} dropped "
                 f"{self.store.dropped}"]
        if self.mqtt is not None:
            m = self.mqtt.status()
            parts.append(f"MQTT published {m['published']} dropped {m['dropped']} queued {m['queued']}")
        if self.hooks is not None:
            h = self.hooks.status()[0]
            parts.append(f"webhook sent {h['sent']} failed {h['failed']} dropped {h['dropped']}")
        return "; ".join(parts)

    async def close(self) -> None:
        self.output.close(time.time())
        await asyncio.sleep(0.5)  # the last changes reach the broker and the receiver
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.store.flush()
        self.store.close()


def bootstrap_mean(diffs: list[float], n: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    a = np.asarray(diffs)
    means = a[rng.integers(0, len(a), (n, len(a)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


async def bench_cpu(cfg: AppConfig, service: InferenceService, npz: Path | None, pairs: int,
                    run_s: float) -> str:
    from edge_app.bench.pipeline import HEIGHT, WIDTH, encode_vp8, run_mode
    from edge_app.bench.testvideo import LabelledVideo

    if npz is None:
        return "cpu: needs the demo test split (data/demo/test.npz: edge-app demo-model makes it)"
    with np.load(npz) as z:
        images, labels = z["images"][:20], z["labels"][:20]
    packets = encode_vp8(LabelledVideo(images, labels, hold=90, width=WIDTH, height=HEIGHT))
    lines = [f"cpu: results-only path, 640x480 at 30 fps, {pairs} pairs of {run_s:.0f} s runs (off and on, in "
             "turns); demo images held 3 s: an event every 3 s (min_s 2 s as shipped, min_confidence 0.3)"]
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp, mosquitto(Path(tmp)) as broker, receiver() as hook:
        for k in range(pairs):
            for mode in ("off", "on") if k % 2 == 0 else ("on", "off"):  # alternate the order: drift cancels
                outputs = Outputs(Path(tmp) / f"store{k}", service.class_names, broker, hook) if mode == "on" \
                    else None
                _, s = await run_mode(cfg, service, packets, False, run_s, run_s, False,
                                      around=None if outputs is None else outputs.follow)
                if outputs is not None:
                    await outputs.close()
                share = 100 * s.cpu_s / s.wall_s
                cpu[mode].append(share)
                lines.append(f"  pair {k + 1} {mode:>3}: {share:5.1f} % of a core, {s.analysed} frames analysed"
                             + ("" if outputs is None else f"; {outputs.summary()}"))
                print(lines[-1], file=sys.stderr, flush=True)
    diffs = [on - off for off, on in zip(cpu["off"], cpu["on"], strict=True)]
    lo, hi = bootstrap_mean(diffs)
    off, on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    lines.append(f"cpu: off median {off:.1f} %, on median {on:.1f} % of a core; on - off per pair "
                 f"{[round(d, 1) for d in diffs]}: median {statistics.median(diffs):+.2f}, mean {np.mean(diffs):+.2f} "
                 f"(95 % bootstrap interval {lo:+.2f} .. {hi:+.2f}) points of a core")
    return "\n".join(lines)


async def _ticker(lags: list[float], stop: asyncio.Event, every_s: float = 0.005) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(every_s)
        lags.append((loop.time() - t - every_s) * 1e3)


async def bench_store(rate: int, seconds: float) -> str:
    with tempfile.TemporaryDirectory() as tmp, mosquitto(Path(tmp)) as broker:
        outputs = Outputs(Path(tmp) / "store", [], broker, None)
        lags: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticker(lags, stop))
        t0 = time.monotonic()
        pending: list[Event] = []
        n = 0
        while (now := time.monotonic()) - t0 < seconds:
            due = int((now - t0) * rate)
            wall = time.time()
            while n < due:
                ev = Event(f"cam{n % 8}", f"label{n % 5}", wall, 0.9, wall, id=f"{n:09d}")
                outputs.output.changed(EventChange("new", None, ev))
                pending.append(ev)
                n += 1
            while pending and pending[0].start_s < wall - 1.0:
                ev = pending.pop(0)
                outputs.output.changed(EventChange("end", ev, Event(ev.source, ev.label, ev.start_s, 0.9,
                                                                    ev.start_s, wall, id=ev.id)))
            await asyncio.sleep(0.01)
        stop.set()
        await ticker
        queued = outputs.store.status()["queued"]
        t_flush = time.monotonic()
        outputs.store.flush(60.0)
        flush_s = time.monotonic() - t_flush
        summary = outputs.summary()
        await outputs.close()
    lag = np.asarray(lags)
    return (f"store: {n} events in {seconds:.0f} s ({n / seconds:.0f}/s, each a new and an end); event-loop lag "
            f"p50 {np.percentile(lag, 50):.2f} ms, p99 {np.percentile(lag, 99):.2f} ms, max {lag.max():.2f} ms, "
            f"{int((lag >= 20).sum())} of {len(lag)} ticks of 5 ms late by 20 ms or more; writes queued at the end "
            f"{queued} (flushed in {flush_s:.2f} s); {summary}")


async def bench_api(count: int, requests: int) -> str:
    import aiohttp
    from aiohttp import web

    from edge_app.events.api import add_routes

    with tempfile.TemporaryDirectory() as tmp:
        store = EventStore(Path(tmp))
        store.open()
        t_end = time.time()
        for i in range(count):  # one a minute, back from now, 8 cameras, 5 labels
            start = t_end - (count - i) * 60.0
            store.put(Event(f"cam{i % 8}", f"label{i % 5}", start, 0.5 + (i % 50) / 100, start, start + 20,
                            id=f"{int(start * 1000)}-{i}"), "bench")
        store.flush(300.0)
        app = web.Application()
        add_routes(app, store)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/api/events"  # type: ignore[union-attr]
        mid = t_end - count * 30.0
        kinds: dict[str, list[float]] = {}
        try:
            async with aiohttp.ClientSession() as http:
                for kind, query in (("newest 50", ""), ("camera", "?camera=cam3"), ("label", "?label=label2"),
                                    ("time range", f"?after={mid}&before={mid + 86400}"),
                                    ("camera+label 200", "?camera=cam1&label=label1&limit=200")):
                    kinds[kind] = [await _timed(http, base + query) for _ in range(requests)]
                pages: list[float] = []
                for _ in range(requests // 4):
                    nxt = None
                    for page in range(5):
                        t0 = time.perf_counter()
                        async with http.get(base + ("" if nxt is None else f"?cursor={nxt}")) as r:
                            body = await r.json()
                        if page:
                            pages.append((time.perf_counter() - t0) * 1e3)
                        nxt = body["next"]
                kinds["cursor pages 2-5"] = pages
        finally:
            await runner.cleanup()
            store.close()
    out = [f"api: GET /api/events over {count} events, loopback HTTP, {requests} requests per kind"]
    for kind, ms in kinds.items():
        out.append(f"  {kind:<18} p50 {np.percentile(ms, 50):6.2f} ms  p95 {np.percentile(ms, 95):6.2f} ms")
    every = [x for ms in kinds.values() for x in ms]
    out.append(f"  all                p50 {np.percentile(every, 50):6.2f} ms  p95 {np.percentile(every, 95):6.2f} ms")
    return "\n".join(out)


async def _timed(http: Any, url: str) -> float:
    t0 = time.perf_counter()
    async with http.get(url) as r:
        await r.read()
        assert r.status == 200, (url, r.status)
    return (time.perf_counter() - t0) * 1e3
