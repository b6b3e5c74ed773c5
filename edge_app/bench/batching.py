"""``edge-app bench-batching``: the inference service frame by frame against batched across streams, on this box.

S streams (8 by default) each send a frame as soon as their previous one is answered (closed loop: what the box
can do) and then, for the same mode, at 30 fps each (open loop: whether it keeps up). Frames are the demo camera's
labelled frames; each stream starts at another one. The dynamic index decides per frame in both modes, with the
full horizon, so the exit mix is the policy's. Printed per mode: frames/s, latency p50/p95 (request to outcome),
the exits used, batches and mean batch size, and the process CPU per frame. Then each segment alone, run through
IOBinding at batch sizes 1, 8 and 32: its time per frame, which says what a batch can save on this device.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edge_app.config import AppConfig, PolicyConfig
from edge_app.decision.scheduler import policy_from_config
from models.runtime import ModelRuntime
from models.service import ChainRequest, InferenceService

DEMO = Path(__file__).resolve().parents[1] / "demo"


def demo_inputs(rt: ModelRuntime) -> list[np.ndarray]:
    index = json.loads((DEMO / "labels.json").read_text())["frames"]
    return [rt.preprocess(cv2.cvtColor(np.asarray(cv2.imread(str(DEMO / f["file"]))), cv2.COLOR_BGR2RGB))
            for f in index]


async def _streams(service: InferenceService, reqs: list[ChainRequest], streams: int, seconds: float,
                   fps: float | None) -> dict[str, Any]:
    lat: list[float] = []
    exits = [0] * (service.num_exits + 1)

    async def stream(s: int) -> None:
        i, t_end = s * 7, time.perf_counter() + seconds
        next_t = time.perf_counter()
        while time.perf_counter() < t_end:
            if fps is not None:
                await asyncio.sleep(max(0.0, next_t - time.perf_counter()))
                next_t += 1 / fps
            t0 = time.perf_counter()
            out = await service.run(reqs[i % len(reqs)])
            lat.append((time.perf_counter() - t0) * 1e3)
            exits[len(out.results)] += 1
            i += 1

    b0, f0 = service.batches, service.batched_frames
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(stream(s) for s in range(streams)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = len(lat)
    batches = service.batches - b0
    return {"frames": n, "fps": n / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)),
            "exits_run": exits[1:], "batches": batches,
            "mean_batch": (service.batched_frames - f0) / batches if batches else 1.0,
            "cpu_ms_per_frame": 1e3 * cpu / max(n, 1), "cpu_share": cpu / wall}


async def bench(cfg: AppConfig, streams: int, seconds: float, window_ms: float, fps: float,
                threads: int | None = None) -> str:
    m = cfg.model
    threads = m.threads if threads is None else threads
    rt = ModelRuntime.load(cfg.model_path, m.providers, threads, m.warmup_runs, m.cuda_device)
    if not rt.batchable:
        raise SystemExit(f"{cfg.model_path}: its segments take one frame (python -m exporter batchify --model ...)")
    policy = policy_from_config(PolicyConfig(), cfg.model_path)
    xs = demo_inputs(rt)
    reqs = [ChainRequest(x, policy, 1, rt.num_exits) for x in xs]
    rows = []
    for name, window in (("frame by frame", 0.0), (f"batched ({window_ms:g} ms window)", window_ms)):
        service = InferenceService(rt, 1, batch_window_ms=window, max_batch=max(streams, 1))
        service.start()
        try:
            await _streams(service, reqs, streams, 1.0, None)  # warm-up
            closed = await _streams(service, reqs, streams, seconds, None)
            opened = await _streams(service, reqs, streams, seconds, fps)
        finally:
            await service.stop()
        rows.append((name, closed, opened))
    per_frame = segment_ms_per_frame(rt, xs[0], (1, 8, 32))
    base = rows[0][1]["fps"]
    lines = [f"{streams} streams, model {rt.manifest.name} on {rt.device_name} ({threads} intra-op thread(s)), "
             f"{seconds:g} s per run; dynamic index, full horizon", "",
             "| mode | load | frames/s | vs frame by frame | latency p50 / p95 ms | exits run (1 / 2 / 3) | "
             "mean batch | CPU ms per frame | CPU (cores) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, closed, opened in rows:
        for load, r in (("as fast as answered", closed), (f"{fps:g} fps each", opened)):
            lines.append(f"| {name} | {load} | {r['fps']:.0f} | {r['fps'] / base:.2f}× | {r['p50_ms']:.2f} / "
                         f"{r['p95_ms']:.2f} | {' / '.join(map(str, r['exits_run']))} | {r['mean_batch']:.1f} | "
                         f"{r['cpu_ms_per_frame']:.3f} | {r['cpu_share']:.2f} |")
    lines += ["", f"each segment alone on {rt.device_name}, ms per frame (median of 30 runs) at batch size:", "",
              "| segment | " + " | ".join(f"batch {b}" for b in per_frame) + " |",
              "|---|" + "---|" * len(per_frame)]
    for k in range(rt.num_exits):
        lines.append(f"| {k + 1} | " + " | ".join(f"{ms[k]:.3f}" for ms in per_frame.values()) + " |")
    return "\n".join(lines)


def segment_ms_per_frame(rt: ModelRuntime, x: np.ndarray, sizes: tuple[int, ...], runs: int = 30
                         ) -> dict[int, list[float]]:
    """Each segment's median time per frame at each batch size (IOBinding, features left on the device)."""
    out: dict[int, list[float]] = {}
    for b in sizes:
        value = rt.to_device(np.repeat(x, b, axis=0))
        per_segment = []
        for k in range(rt.num_exits):
            times = []
            for _ in range(runs + 3):
                nxt, _, ms = rt.run_segment(k, value)
                times.append(ms)
            per_segment.append(float(np.median(times[3:])) / b)
            if nxt is not None:
                value = nxt
        out[b] = per_segment
    return out
