"""``edge-app bench-model``: per-segment latency and pre-processing time, printed as a table."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from models.runtime import ModelRuntime


@dataclass(frozen=True)
class Timing:
    name: str
    median_ms: float
    p95_ms: float


def _summary(name: str, samples: list[float]) -> Timing:
    return Timing(name, statistics.median(samples), float(np.percentile(samples, 95)))


def bench_model(rt: ModelRuntime, frames: int = 300, frame_size: tuple[int, int] = (480, 640),
                seed: int = 0) -> list[Timing]:
    """Time pre-processing of a ``frame_size`` RGB frame and every segment, over ``frames`` random frames."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, 256, (*frame_size, 3), dtype=np.uint8) for _ in range(8)]
    pre: list[float] = []
    seg: list[list[float]] = [[] for _ in range(rt.num_exits)]
    total: list[float] = []
    for i in range(frames):
        t0 = time.perf_counter()
        x = rt.preprocess(pool[i % len(pool)])
        t1 = time.perf_counter()
        run = rt.start(x)
        while not run.done:
            res = run.advance()
            seg[res.exit_index].append(res.segment_ms)
        total.append((time.perf_counter() - t1) * 1e3)
        pre.append((t1 - t0) * 1e3)
    rows = [_summary(f"pre-process {frame_size[1]}x{frame_size[0]}", pre)]
    rows += [_summary(f"segment {k + 1} (-> exit {k + 1})", s) for k, s in enumerate(seg)]
    cum = np.cumsum([statistics.median(s) for s in seg])
    rows += [Timing(f"exit {k + 1} cumulative (sum of medians)", float(c), float("nan")) for k, c in enumerate(cum)]
    rows.append(_summary("full depth (all segments, one frame)", total))
    return rows


def format_table(rows: list[Timing]) -> str:
    width = max(len(r.name) for r in rows)
    lines = [f"{'stage':<{width}}  {'median ms':>9}  {'p95 ms':>8}"]
    for r in rows:
        p95 = "" if np.isnan(r.p95_ms) else f"{r.p95_ms:8.3f}"
        lines.append(f"{r.name:<{width}}  {r.median_ms:9.3f}  {p95:>8}")
    return "\n".join(lines)


def bench_policy(folder: Path, frames: int = 2000) -> str:
    """Microseconds per frame that each policy spends deciding, replaying the test traces."""
    from models.folder import load_traces
    from models.manifest import read_manifest
    from models.policies import ConfidenceThreshold, ExitPolicy, FixedExit, Patience, run_on_trace
    from models.policy_store import load_policy

    manifest = read_manifest(folder)
    probs, _ = load_traces(folder, manifest, "test")
    probs = probs[:frames].astype(np.float32)
    n = probs.shape[1]
    policies: list[ExitPolicy] = [load_policy(folder, n), ConfidenceThreshold(0.9), Patience(1), FixedExit(n)]
    lines = [f"{len(probs)} test frames of {manifest.name}; decision time per frame (all exits it looks at):",
             f"{'policy':<16}{'median us':>10}{'p95 us':>9}{'mean exits':>11}"]
    for pol in policies:
        per_frame, exits = [], 0
        for i in range(len(probs)):
            t0 = time.perf_counter_ns()
            ran, _ = run_on_trace(pol, probs[i], n)
            per_frame.append((time.perf_counter_ns() - t0) / 1e3)
            exits += ran
        lines.append(f"{pol.name:<16}{statistics.median(per_frame):>10.2f}{np.percentile(per_frame, 95):>9.2f}"
                     f"{exits / len(probs):>11.2f}")
    lines.append(exit0_line(folder, min(frames, 1000)))
    lines.append(governor_cost(folder, manifest.costs_ms))
    seg = ", ".join(f"{e.name} {e.cpu_cost.median_ms * 1e3:.0f} us" for e in manifest.exits)
    lines.append(f"segment cost for comparison (manifest, CPU median): {seg}")
    return "\n".join(lines)


def exit0_line(folder: Path, frames: int = 1000) -> str:
    """Exit 0 against exit 1, measured as the serve path runs them (``models.video_fit.exit0_cost``)."""
    from models.manifest import read_manifest
    from models.policy_store import load_policy
    from models.video_fit import exit0_cost

    tables = load_policy(folder, len(read_manifest(folder).exits)).exit0
    if tables is None:
        return "exit 0: the model's policy.json has none (edge-app clip-traces, then edge-app fit-policy)"
    e0, e1 = exit0_cost(folder, tables, frames)
    return (f"exit 0 (thumbnail, change, decision) per frame: median {1e3 * e0:.1f} us; exit 1 on the same frames: "
            f"{1e3 * e1:.0f} us; exit 0 = {100 * e0 / e1:.1f} % of exit 1")


def governor_cost(folder: Path, costs_ms: list[float], frames: int = 3000, fps: float = 30.0) -> str:
    """What the load governor adds per frame (``LoadGovernor.arrived`` and ``policy``: the point re-evaluated every
    ``EVERY_S``), and what re-solving the dynamic index for new segment costs takes (``build_policy``; done in a
    worker thread when the shares move, at most every ``RESOLVE_EVERY_S``)."""
    from edge_app.config import PolicyConfig
    from edge_app.decision.governor import LoadGovernor
    from edge_app.decision.scheduler import policy_from_config
    from models.fit import build_policy, fit_chain
    from models.folder import load_traces, policy_meta
    from models.manifest import read_manifest
    from models.operating import operating_points
    from models.policy_store import stored_exit0

    policy = policy_from_config(PolicyConfig(kind="dynamic-index"), folder)
    g = LoadGovernor(operating_points(folder, policy), 0.85, 1)
    per_frame = []
    for i in range(frames):
        now = i / fps
        t0 = time.perf_counter_ns()
        g.arrived("cam", now)
        g.policy(now, lambda: costs_ms)
        per_frame.append((time.perf_counter_ns() - t0) / 1e3)
    manifest = read_manifest(folder)
    meta = policy_meta(folder)
    probs, labels = load_traces(folder, manifest, str(meta["calibration_traces"]))
    chain = replace(fit_chain(probs, labels, costs_ms, loss_kind=str(meta["loss_kind"])), exit0=stored_exit0(meta))
    solves = []
    for _ in range(30):
        t0 = time.perf_counter_ns()
        build_policy(chain, float(meta["lam"]))
        solves.append((time.perf_counter_ns() - t0) / 1e3)
    solve = statistics.median(solves)
    exit1 = costs_ms[0] * 1e3
    worst = solve / (g.RESOLVE_EVERY_S * fps)  # a re-solve every RESOLVE_EVERY_S, spread over its frames
    return (f"load governor per frame: median {statistics.median(per_frame):.2f} us, p95 "
            f"{np.percentile(per_frame, 95):.2f} us ({100 * statistics.median(per_frame) / exit1:.2f} % of exit 1); "
            f"re-solving the index for new costs: {solve:.0f} us, at most every {g.RESOLVE_EVERY_S:g} s "
            f"= {worst:.1f} us a frame at {fps:g} fps ({100 * worst / exit1:.2f} % of exit 1; in a worker thread)")
