"""``edge-app bench-smoothing``: label flips and quality jumps with temporal smoothing off and on.

A "camera" shows demo test images, each for ``hold_s`` seconds, with fresh
sensor noise, a small jitter and a brightness flicker on every frame (so
consecutive frames differ the way a real camera's do), while the RTT has
bursts (245 ms for 0.3 s, starting on ~2 % of frames: ``rtt_schedule``)
that cut the compute budget to one exit.  The real model, scheduler and policy analyse
every frame twice: with smoothing off (alpha 1, no hysteresis, depth may
jump any number of exits) and with the ``[smoothing]`` settings.  Printed:
flips of the shown label per minute (the video's own label changes per
minute for reference), mean quality jump between consecutive frames (|test
accuracy of the answering exit now - before|), accuracy of what is shown,
and mean exits run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_app.config import AppConfig, SmoothingConfig
from edge_app.decision.budget import frame_budget
from edge_app.decision.scheduler import FrameScheduler, policy_from_config
from edge_app.decision.smoothing import TemporalSmoother, flicker_stats
from models.runtime import ModelRuntime
from models.service import InferenceService

FPS = 30


def rtt_schedule(n_frames: int, seed: int = 0, base_ms: float = 20.0, burst_ms: float = 245.0,
                 burst_frames: int = 9, start_probability: float = 0.02) -> np.ndarray:
    """Per-frame RTT: ``base_ms`` with bursts of ``burst_ms`` lasting ``burst_frames`` frames."""
    rng = np.random.default_rng(seed)
    rtt = np.full(n_frames, base_ms)
    i = 0
    while i < n_frames:
        if rng.random() < start_probability:
            rtt[i : i + burst_frames] = burst_ms
            i += burst_frames
        i += 1
    return rtt


def camera_frame(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``img`` as a camera would deliver it again: shifted a little, brighter or darker, noisy."""
    dy, dx = rng.integers(-3, 4, 2)
    out = np.roll(img, (int(dy), int(dx)), axis=(0, 1)).astype(np.float32) * rng.uniform(0.9, 1.1)
    out += rng.normal(0, 10, img.shape)
    frame: np.ndarray = np.clip(out, 0, 255).astype(np.uint8)
    return frame


@dataclass(frozen=True)
class ModeResult:
    name: str
    flips_per_min: float
    quality_jump: float
    accuracy: float
    mean_exits_run: float
    raw_flips_per_min: float


def run_mode(name: str, cfg: AppConfig, rt: ModelRuntime, sm: SmoothingConfig, images: np.ndarray,
             labels: np.ndarray, hold: int, rtt: np.ndarray, seed: int) -> ModeResult:
    policy = policy_from_config(cfg.policy, rt.folder)
    sched = FrameScheduler(InferenceService(rt), policy, sm.max_depth_step)
    quality = [ex.test_accuracy for ex in rt.manifest.exits]
    smoother = TemporalSmoother(quality, sm.alpha, sm.hysteresis)
    b = cfg.budget
    shown, raw, exits, truth, ran = [], [], [], [], []
    for i in range(len(rtt)):
        k = (i // hold) % len(images)
        rng = np.random.default_rng([seed, i])  # the same camera noise in every mode
        x = rt.preprocess(camera_frame(images[k], rng))
        budget = frame_budget(b.total_budget_ms, float(rtt[i]), b.bitrate_prior_kbps * 1e3 / 8 / FPS,
                              b.bitrate_prior_kbps * 1e3, waited_ms=2.0, margin_ms=b.safety_margin_ms + 1.0)
        dec = sched.analyse_now(x, budget.compute_ms)
        s = smoother.update(dec.result.probs, dec.exit_index)
        shown.append(s.label)
        raw.append(dec.result.label)
        exits.append(dec.exit_index)
        ran.append(dec.exits_run)
        truth.append(int(labels[k]))
    st = flicker_stats(shown, exits, FPS, quality)
    raw_st = flicker_stats(raw, exits, FPS, quality)
    acc = float(np.mean(np.asarray(shown) == np.asarray(truth)))
    return ModeResult(name, st.label_flips_per_min, st.mean_quality_jump, acc, float(np.mean(ran)),
                      raw_st.label_flips_per_min)


def bench_smoothing(cfg: AppConfig, rt: ModelRuntime, npz: Path, seconds: float = 120.0, hold_s: float = 1.0,
                    seed: int = 0) -> str:
    with np.load(npz) as z:
        images, labels = z["images"], z["labels"]
    hold = max(1, round(hold_s * FPS))
    n = int(seconds * FPS)
    rtt = rtt_schedule(n, seed)
    off = SmoothingConfig(alpha=1.0, hysteresis=0.0, max_depth_step=None)
    modes = [run_mode("smoothing off", cfg, rt, off, images, labels, hold, rtt, seed),
             run_mode("smoothing on", cfg, rt, cfg.smoothing, images, labels, hold, rtt, seed)]
    truth_changes = float(np.count_nonzero(np.diff(labels[(np.arange(n) // hold) % len(images)])) / (n / FPS / 60))
    sm = cfg.smoothing
    lines = [f"{n} frames ({seconds:.0f} s at {FPS} fps) of {npz}, each image held {hold_s:.1f} s, fresh noise per "
             f"frame; RTT 20 ms with 245 ms bursts ({float(np.mean(rtt > 100)) * 100:.0f} % of frames); policy "
             f"{cfg.policy.kind}; 'on' = alpha {sm.alpha}, hysteresis {sm.hysteresis}, max depth step "
             f"{sm.max_depth_step or 'off'}",
             f"the video's own label changes: {truth_changes:.1f} per minute",
             f"{'mode':<15}{'shown-label flips/min':>22}{'mean quality jump':>19}{'accuracy shown':>16}"
             f"{'mean exits run':>16}"]
    for m in modes:
        lines.append(f"{m.name:<15}{m.flips_per_min:>22.1f}{m.quality_jump:>19.4f}{m.accuracy:>16.3f}"
                     f"{m.mean_exits_run:>16.2f}")
    lines.append(f"(raw per-frame labels flip {modes[1].raw_flips_per_min:.1f} per minute with smoothing on; "
                 "the shown label is the smoothed one)")
    return "\n".join(lines)
