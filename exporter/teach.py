"""Teach a model a user's scene: fine-tune a model folder's network on captured frames, export it, fit its policy.

    python -m exporter teach --data DIR --base models/default --out MODELS/VERSION [--epochs 12] [--json]

``DIR`` holds ``train/``, ``calibration/`` and ``test/`` ImageFolders (``CLASS/*.jpg``; edge-app writes them from
its captured frames, split by contiguous time blocks). The base's weights are recovered from its ONNX segments
(``exporter.recover``); its three exit heads are replaced when the class set differs, the backbone is kept, and
all of it is fine-tuned jointly. Frames are prepared exactly as the runtime prepares them (centre crop, area
resize: ``models.preprocess``), and training frames are jittered in light, contrast, noise and position, since a
fixed camera's scene changes mostly in those. The export writes segments, manifest and traces (calibration and
test blocks); the dynamic index's policy is fitted on the calibration traces.

With ``--json`` every step is one JSON line on stdout (``{"event": "epoch", ...}``, ``{"event": "done", ...}``):
edge-app runs this in its own process and reads them for the page.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from exporter.datasets import normalise_uint8
from exporter.errors import ExporterError
from exporter.onnx_export import export_model_folder
from exporter.pipeline import save_checkpoint
from exporter.recover import read_model_folder, recover_checkpoint
from exporter.train import TrainConfig, evaluate, train
from exporter.vgg import ThreeExitVGG
from models.fit import fit_policy
from models.manifest import read_manifest
from models.preprocess import crop_resize

log = logging.getLogger(__name__)
Progress = Callable[[dict[str, Any]], None]


class TeachError(ExporterError, ValueError):
    """The frames or the base model cannot be used; the message says what to change."""


class SceneFrames(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Model-sized uint8 frames and labels; ``augment`` jitters light, contrast and noise per item."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, augment: bool = False, seed: int = 0) -> None:
        self.images, self.labels, self.augment = images, labels, augment
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.images[i]
        if self.augment:
            x = img.astype(np.float32)
            gain, offset = self.rng.uniform(0.6, 1.4), self.rng.uniform(-25, 25)
            mean = x.mean()
            x = (x - mean) * self.rng.uniform(0.7, 1.3) + mean  # contrast
            x = x * gain + offset + self.rng.normal(0, self.rng.uniform(0, 8), x.shape)
            x = x * self.rng.uniform(0.9, 1.1, (1, 1, 3))  # white balance
            img = np.clip(x, 0, 255).astype(np.uint8)
            if self.rng.random() < 0.5:
                img = np.ascontiguousarray(img[:, ::-1])
        return normalise_uint8(img[None])[0], torch.tensor(int(self.labels[i]))


def load_split(folder: Path, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``folder/CLASS/*.jpg`` -> (N, h, w, 3) uint8 as the runtime crops and resizes them, labels, class names."""
    if not folder.is_dir():
        raise TeachError(f"{folder} does not exist: the data folder needs train/, calibration/ and test/")
    names = sorted(p.name for p in folder.iterdir() if p.is_dir())
    images, labels = [], []
    for k, name in enumerate(names):
        for path in sorted((folder / name).glob("*.jpg")):
            bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if bgr is None:
                raise TeachError(f"{path}: not a readable JPEG")
            images.append(crop_resize(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), size))
            labels.append(k)
    if not images:
        raise TeachError(f"{folder} holds no frames")
    return np.ascontiguousarray(np.stack(images)), np.asarray(labels, np.int64), names


def teach(data: Path, base: Path, out: Path, epochs: int = 12, lr: float = 2e-3, batch_size: int = 32,
          threads: int = 0, progress: Progress = lambda e: None) -> dict[str, Any]:
    t0 = time.perf_counter()
    manifest, spec = read_model_folder(base)
    spec_in = read_manifest(base).input
    splits = {s: load_split(data / s, (spec_in.width, spec_in.height)) for s in ("train", "calibration", "test")}
    names = splits["train"][2]
    for s, (_, _, n) in splits.items():
        if n != names:
            raise TeachError(f"{data / s} has classes {n}, train/ has {names}: every split needs every class")
    if len(names) < 2:
        raise TeachError(f"{data / 'train'} has {len(names)} class(es); a model needs at least two")
    progress({"event": "frames", "classes": names, **{s: len(v[1]) for s, v in splits.items()}})
    train_ds = SceneFrames(splits["train"][0], splits["train"][1], augment=True)
    cal_ds = SceneFrames(splits["calibration"][0], splits["calibration"][1])
    test_ds = SceneFrames(splits["test"][0], splits["test"][1])
    work = out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    base_model, err = recover_checkpoint(base, SceneFrames(splits["train"][0], splits["train"][1]),
                                         work / "base.pt", (manifest, spec))
    arch = dataclasses.replace(spec, num_classes=len(names))
    model = ThreeExitVGG(arch)
    own = model.state_dict()
    kept = {k: v for k, v in base_model.state_dict().items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(kept, strict=False)
    progress({"event": "start", "base": str(base), "kept_tensors": len(kept), "new_tensors": len(own) - len(kept),
              "epochs": epochs, "recovery_error": err})
    cfg = TrainConfig(epochs=epochs, batch_size=min(batch_size, len(train_ds)), lr=lr, threads=threads,
                      max_shift=6)

    def on_epoch(net: ThreeExitVGG, done: list[Any]) -> None:
        acc, _, _ = evaluate(net, cal_ds)
        net.train()
        h = done[-1]
        progress({"event": "epoch", "epoch": h.epoch, "epochs": epochs, "loss": round(h.loss, 4),
                  "train_accuracy": [round(a, 4) for a in h.train_accuracy],
                  "calibration_accuracy": [round(a, 4) for a in acc], "seconds": round(h.seconds, 2)})

    result = train(model, train_ds, cfg, progress=lambda line: None, on_epoch=on_epoch)
    train_s = time.perf_counter() - t0
    history = [dataclasses.asdict(h) for h in result.history]
    save_checkpoint({"arch": dataclasses.asdict(arch), "state_dict": model.state_dict(), "class_names": names,
                     "train_config": dataclasses.asdict(cfg), "history": history, "train_seconds": train_s,
                     "dataset": f"imagefolder:{data}", "lineage": []}, work / "taught.pt")
    progress({"event": "export"})
    provenance = {"dataset": f"imagefolder:{data}", "fine_tuned_from": str(base), "calibration_set": str(data /
                  "calibration"), "test_set": str(data / "test"), "train_config": dataclasses.asdict(cfg),
                  "history": history, "train_seconds": round(train_s, 1),
                  "torch_version": torch.__version__, "recipe": "python -m exporter teach (exporter/teach.py)"}
    exported = export_model_folder(model, names, cal_ds, test_ds, out, provenance, "float32")
    manifest_file = out / "manifest.json"  # named after its version, so /status and the page tell models apart
    manifest_json = json.loads(manifest_file.read_text())
    manifest_json["name"] = out.name
    manifest_file.write_text(json.dumps(manifest_json, indent=2))
    progress({"event": "policy"})
    fitted = fit_policy(out)
    done = {"event": "done", "model": str(out), "classes": names,
            "test_accuracy": [round(e.test_accuracy, 4) for e in exported.exits],
            "costs_ms": [round(c, 3) for c in exported.costs_ms], "policy": fitted,
            "frames": {s: len(v[1]) for s, v in splits.items()}, "seconds": round(time.perf_counter() - t0, 1)}
    progress(done)
    return done


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m exporter.teach", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--base", type=Path, default=Path("models/default"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON line per step on stdout")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def emit(event: dict[str, Any]) -> None:
        print(json.dumps(event, default=float) if args.json else event, flush=True)

    try:
        teach(args.data, args.base, args.out, args.epochs, args.lr, args.batch_size, args.threads, emit)
    except (TeachError, ExporterError, OSError, ValueError) as exc:
        emit({"event": "error", "error": str(exc)})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
