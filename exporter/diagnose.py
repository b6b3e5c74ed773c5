"""``python -m exporter diagnose``: where the final exit loses accuracy on the demo test split.

Two readings, printed as tables:

* by background photo: each exit's accuracy on the test traces (clean, and
  VP8-coded when the model folder has them), per test photo;
* seen or unseen digits: fresh test-photo frames drawn the same way with
  digits from the *training* share of the MNIST package against digits from
  the test share, run through the model (ONNX Runtime).  A large gap means
  the model learnt its training digits more than digit shapes; a small one
  puts the blame on the photos.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from exporter.demo_data import BACKGROUND_SPLITS, NO_DIGIT, fetch_mnist, load_digits, make_split
from models.manifest import read_manifest

log = logging.getLogger(__name__)


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    out: np.ndarray = (probs.argmax(-1) == labels[:, None]).mean(axis=0)
    return out


def per_photo(folder: Path, data: Path) -> str:
    """Per-exit accuracy on each test photo, from the model's test traces and the split's photo index."""
    from models.folder import CODEC_SUFFIX, load_traces

    manifest = read_manifest(folder)
    src = data / "test.npz"
    if not src.is_file():
        raise FileNotFoundError(f"{src} is missing: build the demo data with 'python -m exporter data --out {data}'")
    with np.load(src) as z:
        labels, photos = z["labels"], z["backgrounds"]
    names = BACKGROUND_SPLITS["test"]
    lines = [f"{'traces':<10} {'photo':<12} {'frames':>6}  " + "  ".join(f"exit {k + 1:>2}" for k in
                                                                          range(len(manifest.exits)))]
    for name in ("test", "test" + CODEC_SUFFIX):
        if name not in manifest.traces:
            continue
        probs, trace_labels = load_traces(folder, manifest, name)
        if not np.array_equal(trace_labels, labels):
            raise ValueError(f"{folder}'s {name} traces were not taken from {src} (labels differ): rebuild the "
                             "data with the recipe's defaults or re-export")
        kind = "vp8" if name.endswith(CODEC_SUFFIX) else "clean"
        for i, photo in enumerate(names):
            sel = photos == i
            acc = _accuracy(probs[sel], labels[sel])
            lines.append(f"{kind:<10} {photo:<12} {sel.sum():>6}  " + "  ".join(f"{a:7.2%}" for a in acc))
        lines.append(f"{kind:<10} {'all':<12} {len(labels):>6}  " + "  ".join(
            f"{a:7.2%}" for a in _accuracy(probs, labels)))
    return "\n".join(lines)


def seen_vs_unseen(folder: Path, cache: Path, count: int = 2000, seed: int = 1) -> str:
    """Final-exit accuracy on fresh test-photo frames with training digits vs with unseen (test) digits."""
    from models.runtime import ModelRuntime

    rt = ModelRuntime.load(folder, providers=("cpu",), warmup=1)
    digits = load_digits(fetch_mnist(cache))
    lines = [f"{'digits':<28} {'frames':>6}  " + "  ".join(f"exit {k + 1:>2}" for k in range(rt.num_exits))]
    for title, digit_split in (("seen in training", "train"), ("unseen (the test share)", "test")):
        split = make_split("test", count, digits, seed=seed, digit_split=digit_split,
                           size=rt.manifest.input.height)
        probs = np.stack([rt.all_exits(img) for img in split.images])
        has_digit = split.labels != NO_DIGIT
        acc = _accuracy(probs[has_digit], split.labels[has_digit])
        lines.append(f"{title:<28} {has_digit.sum():>6}  " + "  ".join(f"{a:7.2%}" for a in acc))
        log.info("%s digits: %d frames analysed", digit_split, count)
    return "\n".join(lines)


ENSEMBLE_WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)


def last_exits_ensemble(folder: Path, split: Path, weights: tuple[float, ...] = ENSEMBLE_WEIGHTS) -> str:
    """Would the final exit gain from also reading the exit before it?  Final-exit accuracy on ``split``
    (a written demo split) when its answer combines the last two exits' softmax outputs p_K and p_(K-1), as
    Zero Time Waste (Wołczyk et al., 2021) combines exits, for each weight w:

    * geometric: argmax of log p_K + w log p_(K-1)
    * arithmetic: argmax of (1 - w) p_K + w p_(K-1)

    w = 0 is the plain final exit.  Both are free at run time (exit K-1 always runs before exit K), so a
    clear gain here would be worth building into the model; this only measures it."""
    from exporter.demo_data import load_split
    from models.runtime import ModelRuntime

    rt = ModelRuntime.load(folder, providers=("cpu",), warmup=1)
    if rt.num_exits < 2:
        raise ValueError(f"{folder}: one exit, nothing to combine")
    images, labels, _ = load_split(split)
    probs = np.empty((len(labels), rt.num_exits, len(rt.class_names)), np.float32)
    for n, img in enumerate(images):
        probs[n] = rt.all_exits(img)
        if (n + 1) % 2000 == 0:
            log.info("%d of %d frames analysed", n + 1, len(labels))
    last, before = probs[:, -1].astype(np.float64), probs[:, -2].astype(np.float64)
    log_last, log_before = np.log(np.maximum(last, 1e-30)), np.log(np.maximum(before, 1e-30))

    def acc(scores: np.ndarray) -> float:
        return float((scores.argmax(-1) == labels).mean())

    lines = [f"{split}: {len(labels)} frames; exit {rt.num_exits - 1} alone {acc(before):.2%}, "
             f"exit {rt.num_exits} alone (w = 0) {acc(last):.2%}",
             f"{'w':>5}  {'geometric':>10}  {'arithmetic':>10}"]
    for w in weights:
        lines.append(f"{w:>5.2f}  {acc(log_last + w * log_before):>10.2%}  {acc((1 - w) * last + w * before):>10.2%}")
    return "\n".join(lines)
