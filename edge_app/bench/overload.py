"""``edge-app bench-overload``: more streams than full depth allows, with a fixed operating point and with the
load-adaptive one (``edge_app.decision.governor``), in one run.

S built-in demo cameras (labelled frames, 30 fps each) feed the real analysis pipelines, sharing one inference
thread on an emulated slower device (segments padded to ``--segment-ms``: the padding is a sleep, so the CPU
stays free as it does while an accelerator computes). The network is fixed and good (30 ms RTT), so what is
measured is compute: frames answered against frames that arrived per stream (a frame not answered was dropped as
stale behind the queue), deadline misses, depth, and accuracy against the frames' labels.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from edge_app.bench.emulation import EmulatedDevice
from edge_app.config import AppConfig
from edge_app.decision.decide import PipelineSettings
from edge_app.decision.governor import LoadGovernor
from edge_app.decision.scheduler import policy_from_config
from edge_app.metrics import Metrics
from edge_app.peer.monitor import JSON_RESULT_BYTES
from edge_app.pipeline import AnalysisPipeline, Engine
from edge_app.results import NetworkView
from edge_app.sources import DEMO_FRAMES
from models.operating import operating_points
from models.runtime import ModelRuntime
from models.service import InferenceService
from streams.demo import DemoCamera
from streams.netstats import BitrateEstimator, RttEstimator, snapshot


async def _run(cfg: AppConfig, rt: ModelRuntime, segment_ms: Sequence[float], streams: int, seconds: float,
               adaptive: bool) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    device = EmulatedDevice(rt, segment_ms=segment_ms)
    service = InferenceService(device, 1, cfg.model.cost_window)
    policy = policy_from_config(cfg.policy, cfg.model_path)
    media = ThreadPoolExecutor(2, thread_name_prefix="media")
    governor = LoadGovernor(operating_points(cfg.model_path, policy), cfg.policy.load_headroom, 1) if adaptive \
        else None
    engine = Engine(service=service, policy=policy, metrics=Metrics(rt.manifest.name, rt.providers, rt.num_exits),
                    media=media, load=governor)
    settings = PipelineSettings(budget=cfg.budget, smoothing=cfg.smoothing, truncate=True, probe=False,
                                uplink_from_frames=False)
    view = NetworkView(snapshot(RttEstimator(30.0), BitrateEstimator(5e6)), JSON_RESULT_BYTES)
    cams = [DemoCamera(f"s{i}", DEMO_FRAMES, fps=30.0, hold=15, size=192) for i in range(streams)]
    service.start()
    pipes = []
    for cam in cams:
        cam.start()
        assert cam.slot is not None
        pipes.append(AnalysisPipeline(cam.name, cam.name, cam.slot, engine, settings, view))
    for p in pipes:
        p.start()
    await asyncio.sleep(8.0)  # settle (the governor's first moves, the running costs)
    start = [(c.frames, p.tally.analysed, p.tally.deadline_misses, dict(p.tally.scored), p.tally.reused,
              list(service.segment_runs)) for c, p in zip(cams, pipes, strict=True)]
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - t0
    rows = []
    for (f0, a0, m0, s0, r0, _), cam, p in zip(start, cams, pipes, strict=True):
        rows.append({"arrived": cam.frames - f0, "answered": p.tally.analysed - a0,
                     "misses": p.tally.deadline_misses - m0,
                     "reused": p.tally.reused - r0, "raw_frames": p.tally.scored["raw_frames"] - s0["raw_frames"],
                     "raw_correct": p.tally.scored["raw_correct"] - s0["raw_correct"],
                     "smoothed_correct": p.tally.scored["smoothed_correct"] - s0["smoothed_correct"],
                     "scored": p.tally.scored["frames"] - s0["frames"]})
    runs = [a - b for a, b in zip(service.segment_runs, start[0][5], strict=True)]
    status = governor.status() if governor else None
    for p in pipes:
        await p.stop()
    for cam in cams:
        await cam.stop()
    await service.stop()
    media.shutdown(wait=False, cancel_futures=True)
    return {"rows": rows, "wall": wall, "segment_runs": runs, "governor": status}


def _line(name: str, r: dict[str, Any]) -> str:
    rows = r["rows"]
    arrived, answered = sum(x["arrived"] for x in rows), sum(x["answered"] for x in rows)
    worst = min(x["answered"] / max(1, x["arrived"]) for x in rows)
    misses = sum(x["misses"] for x in rows)
    raw = sum(x["raw_correct"] for x in rows) / max(1, sum(x["raw_frames"] for x in rows))
    smoothed = sum(x["smoothed_correct"] for x in rows) / max(1, sum(x["scored"] for x in rows))
    reused = sum(x["reused"] for x in rows)
    runs = r["segment_runs"]
    depth = sum(runs) / max(1, runs[0])
    g = r["governor"]
    point = f"point {g['index']} of {g['points'] - 1} (cost {100 * g['cost_fraction']:.0f} %)" if g else "fitted lam"
    return (f"| {name} | {point} | {arrived / r['wall']:.0f} | {answered / r['wall']:.0f} | "
            f"{100 * answered / max(1, arrived):.1f} % (worst stream {100 * worst:.1f} %) | "
            f"{100 * misses / max(1, answered):.2f} % | {reused} | {depth:.2f} | {100 * raw:.1f} % | "
            f"{100 * smoothed:.1f} % |")


async def bench(cfg: AppConfig, streams: int, seconds: float, segment_ms: Sequence[float]) -> str:
    m = cfg.model
    rt = ModelRuntime.load(cfg.model_path, m.providers, m.threads, m.warmup_runs, m.cuda_device)
    fixed = await _run(cfg, rt, segment_ms, streams, seconds, adaptive=False)
    adaptive = await _run(cfg, rt, segment_ms, streams, seconds, adaptive=True)
    head = (f"{streams} streams x 30 fps of labelled demo frames, one inference thread on an emulated device "
            f"(segments {'/'.join(f'{x:g}' for x in segment_ms)} ms), {seconds:g} s each, deadline "
            f"{cfg.budget.total_budget_ms:g} ms, RTT 30 ms")
    return "\n".join([head, "", "| operating point | at the end | frames/s in | answered/s | answered of arrived | "
                      "deadline misses | reused answers | mean exits run | raw accuracy | smoothed accuracy |",
                      "|---|---|---|---|---|---|---|---|---|---|", _line("fixed", fixed),
                      _line("load-adaptive", adaptive)])
