"""``edge-app bench-uplink-size``: does the smaller frame a results-only browser is asked to send cost accuracy?

The demo test split goes through VP8 twice, as a browser would send it: at 640x480 (1 Mbit/s) and at twice the
model's input height (256x192 for the shipped 96 px model), at the bits the server asks of a browser that wants only
results (``UplinkController.UPLINK_BPP``). The same images are analysed at every exit both ways; the difference in
per-exit accuracy comes with a 95 % paired-bootstrap interval (resampling images, both sizes together).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_app.bench.codec_traces import codec_traces
from models.runtime import ModelRuntime
from streams.uplink import UplinkController


def paired_bootstrap(diff: np.ndarray, rounds: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The 2.5 and 97.5 percentiles of the mean of ``diff`` (N, ...) over images resampled with replacement."""
    rng = np.random.default_rng(seed)
    means = np.stack([diff[rng.integers(0, len(diff), len(diff))].mean(0) for _ in range(rounds)])
    low, high = np.percentile(means, [2.5, 97.5], axis=0)
    return low, high


def bench_uplink_size(model: Path, data: Path, full_kbps: float = 1000.0) -> str:
    rt = ModelRuntime.load(model, ("cpu",), 1)
    with np.load(data) as z:
        images, labels = z["images"], z["labels"]
    small = 2 * rt.manifest.input.height
    small_kbps = UplinkController.ceiling_for(small) / 1000  # what the server asks such a browser for
    runs = {}
    for height, kbps in ((480, full_kbps), (small, small_kbps)):
        probs = codec_traces(rt, images, labels, kbps, height=height)
        runs[height] = (probs.argmax(-1) == labels[:, None]).astype(float)
    diff = runs[small] - runs[480]
    low, high = paired_bootstrap(diff)
    lines = [f"{len(images)} images of {data}, VP8, one coded frame of each; accuracy per exit (%)", "",
             "| sent as | " + " | ".join(f"exit {k + 1}" for k in range(rt.num_exits)) + " |",
             "|---|" + "---|" * rt.num_exits]
    for height, kbps in ((480, full_kbps), (small, small_kbps)):
        lines.append(f"| {height * 4 // 3}x{height}, {kbps:.0f} kbit/s | "
                     + " | ".join(f"{100 * a:.2f}" for a in runs[height].mean(0)) + " |")
    lines.append("| difference (95 % paired bootstrap) | "
                 + " | ".join(f"{100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"
                              for d, lo, hi in zip(diff.mean(0), low, high, strict=True)) + " |")
    return "\n".join(lines)
