"""Teach a model a user's scene: fine-tune a model folder's network on captured frames, export it, fit its policy.

    python -m exporter teach --data DIR --base models/default --out MODELS/VERSION [--epochs 12] [--json]

``DIR`` holds ``train/``, ``calibration/``, ``test/`` and, optionally, ``check/`` ImageFolders (``CLASS/*.jpg``;
edge-app writes them from its captured frames: the first three split by contiguous time blocks of the same
recordings, ``check/`` from check recordings captured apart). The base's weights are recovered from its ONNX
segments (``exporter.recover``); its three exit heads are replaced when the class set differs, the backbone is
kept, and all of it is fine-tuned jointly, every class drawn equally often. Frames are prepared exactly as the
runtime prepares them (the region's square, area resize: ``models.preprocess``), and training frames are jittered
as a fixed camera's view changes (``Jitter``). The epoch kept is the best on the jittered calibration frames (the
later one on a tie); training stops when that has not improved for ``patience`` epochs. The check's accuracy is
shown every epoch but never chooses: on a check in new light the epochs' accuracy swung from 50 to 98 %, and
keeping the best of them would report luck as skill.

Calibration frames are near copies of training frames, so on them every exit looks perfect and the dynamic index
would stop at exit 1 everywhere. The policy is therefore fitted on jittered copies of them, and it has a floor:
the shallowest exit whose accuracy on the check frames is within a point of full depth's. ``report.json`` holds
what the page shows before deploy: held-out (same recordings) and check accuracy per exit, what the policy as
served does on the check (accuracy, exits, cost, confusion, the frames it got wrong) and the operating points.

Exit 0 (the last answer while the picture has not changed) is fitted from the recordings themselves, played in
time order as a camera shows a scene that changes state (``exporter.teach_clips``); ``served`` in the report is
what the policy as served, exit 0 included, does on the held-out test blocks and the check recordings in time
order.

With ``--json`` every step is one JSON line on stdout (``{"event": "epoch", ...}``, ``{"event": "done", ...}``):
edge-app runs this in its own process and reads them for the page.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from exporter.datasets import normalise_uint8
from exporter.errors import ExporterError
from exporter.onnx_export import cpu_sessions, export_model_folder, traces
from exporter.pipeline import save_checkpoint
from exporter.recover import read_model_folder, recover_checkpoint
from exporter.teach_clips import served_on_clips, write_recording_clips
from exporter.train import TrainConfig, evaluate, train
from exporter.vgg import ThreeExitVGG
from exporter.widen import widen_model
from models.fit import LAM_GRID, FittedChain, build_policy, fit_chain, replay_index
from models.folder import load_traces
from models.manifest import list_traces, read_manifest, trace_spec
from models.policies import DynamicIndex, run_on_trace
from models.policy_store import fit_policy, load_policy
from models.preprocess import crop_resize
from models.registry import REPORT_FILE  # held-out, check, policy and operating points, for the page before deploy

log = logging.getLogger(__name__)
Progress = Callable[[dict[str, Any]], None]
AUGMENTED_CALIBRATION = 4  # jittered copies of each calibration frame the policy is fitted on



class TeachError(ExporterError, ValueError):
    """The frames or the base model cannot be used; the message says what to change."""


class Jitter:
    """What changes in a fixed camera's view: light (level, contrast, a gradient from one side), white balance,
    sensor noise, codec artefacts and a small shift; never a mirror image (a gate on the left is not one on the
    right)."""

    def __init__(self, max_shift: float = 0.06) -> None:
        self.max_shift = max_shift  # of the side

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = img.shape[:2]
        x: np.ndarray = img.astype(np.float32)
        mean = float(x.mean())
        x = (x - mean) * rng.uniform(0.7, 1.3) + mean  # contrast
        x = x * rng.uniform(0.55, 1.45) + rng.uniform(-25, 25)  # light level
        if rng.random() < 0.5:  # light from one side
            angle = rng.uniform(0, 2 * np.pi)
            yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
            ramp = (np.cos(angle) * (xx / w - 0.5) + np.sin(angle) * (yy / h - 0.5))[..., None]
            x = x * (1 + rng.uniform(0.2, 0.6) * ramp)
        x = x * rng.uniform(0.88, 1.12, (1, 1, 3))  # white balance
        x = x + rng.normal(0, rng.uniform(0, 10), x.shape)  # sensor noise
        out = np.clip(x, 0, 255).astype(np.uint8)
        if rng.random() < 0.4:  # a codec's blocks and ringing
            ok, jpeg = cv2.imencode(".jpg", out, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(30, 90))])
            if ok:
                out = cv2.imdecode(jpeg, cv2.IMREAD_UNCHANGED)
        if self.max_shift > 0:
            dx, dy = rng.uniform(-self.max_shift, self.max_shift, 2) * (w, h)
            shift = np.array([[1, 0, dx], [0, 1, dy]], np.float32)
            out = cv2.warpAffine(out, shift, (w, h), borderMode=cv2.BORDER_REFLECT)
        return np.ascontiguousarray(out)


class SceneFrames(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Model-sized uint8 frames and labels; ``jitter`` changes each item as a fixed camera's view changes;
    ``balance`` draws every class equally often (the rarer classes' frames repeat)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, jitter: Jitter | None = None, seed: int = 0,
                 balance: bool = False) -> None:
        self.images, self.labels, self.jitter = images, labels, jitter
        self.rng = np.random.default_rng(seed)
        self.index = balanced_index(labels, self.rng) if balance else np.arange(len(labels))

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = int(self.index[i])
        img = self.images[j] if self.jitter is None else self.jitter(self.images[j], self.rng)
        return normalise_uint8(img[None])[0], torch.tensor(int(self.labels[j]))


def balanced_index(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices in which every class appears as often as the largest one (rarer classes' frames repeat)."""
    classes = np.unique(labels)
    most = max(int((labels == c).sum()) for c in classes)
    parts = []
    for c in classes:
        mine = np.flatnonzero(labels == c)
        parts.append(np.concatenate([mine, rng.choice(mine, most - len(mine))]) if len(mine) < most else mine)
    return np.concatenate(parts)


def jittered_copies(images: np.ndarray, labels: np.ndarray, copies: int, seed: int = 1
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``copies`` fixed jittered versions of every frame: calibration that resembles new conditions."""
    rng = np.random.default_rng(seed)
    jitter = Jitter()
    out = np.stack([jitter(img, rng) for img in images for _ in range(copies)])
    return out, np.repeat(labels, copies)


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # (N, h, w, 3) uint8 as the runtime prepares them
    labels: np.ndarray
    names: list[str]  # class names
    ids: list[str]  # frame ids (file stems)


def load_split(folder: Path, size: tuple[int, int], optional: bool = False) -> Split | None:
    """``folder/CLASS/*.jpg`` -> frames as the runtime crops and resizes them, labels, class names, frame ids.
    ``optional``: None when the folder is absent or holds no frame (a check recording is optional)."""
    if not folder.is_dir():
        if optional:
            return None
        raise TeachError(f"{folder} does not exist: the data folder needs train/, calibration/ and test/")
    names = sorted(p.name for p in folder.iterdir() if p.is_dir())
    images, labels, ids = [], [], []
    for k, name in enumerate(names):
        for path in sorted((folder / name).glob("*.jpg")):
            bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if bgr is None:
                raise TeachError(f"{path}: not a readable JPEG")
            images.append(crop_resize(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), size))
            labels.append(k)
            ids.append(path.stem)
    if not images:
        if optional:
            return None
        raise TeachError(f"{folder} holds no frames")
    return Split(np.ascontiguousarray(np.stack(images)), np.asarray(labels, np.int64), names, ids)


def depth_floor(accuracy: Sequence[float], tolerance: float = 0.01) -> int:
    """The shallowest exit (1-based) whose accuracy is within ``tolerance`` of full depth's."""
    return next(k + 1 for k, a in enumerate(accuracy) if a >= accuracy[-1] - tolerance)


def check_report(policy: DynamicIndex, probs: np.ndarray, labels: np.ndarray, ids: list[str], names: list[str],
                 costs_ms: Sequence[float], max_wrong: int = 200) -> dict[str, Any]:
    """What the policy as served answers on the check frames: accuracy, exits used, cost, the confusion (rows:
    the true class, columns: the answer) and the frames it got wrong."""
    cum = np.cumsum(costs_ms)
    confusion = np.zeros((len(names), len(names)), int)
    exits = [0] * probs.shape[1]
    wrong, spent = [], 0.0
    for i in range(len(labels)):
        ran, choice = run_on_trace(policy, probs[i], probs.shape[1])
        answer = int(probs[i, choice].argmax())
        confusion[labels[i], answer] += 1
        exits[ran - 1] += 1
        spent += float(cum[ran - 1])
        if answer != labels[i]:
            wrong.append({"id": ids[i], "class": names[labels[i]], "answer": names[answer], "exit": choice + 1,
                          "per_exit": [names[int(p.argmax())] for p in probs[i]]})
    return {"frames": len(labels), "accuracy": round(float(np.trace(confusion) / max(len(labels), 1)), 4),
            "per_exit_accuracy": [round(float(a), 4) for a in (probs.argmax(-1) == labels[:, None]).mean(0)],
            "exits_used": exits, "mean_cost_ms": round(spent / max(len(labels), 1), 3),
            "confusion": confusion.tolist(), "wrong": wrong[:max_wrong], "wrong_count": len(wrong)}


def policy_points(chain: FittedChain, floor: int, probs: np.ndarray, labels: np.ndarray, costs_ms: Sequence[float]
                  ) -> list[dict[str, Any]]:
    """Operating points of the fitted chain (with its floor) and the fixed exits, each with its accuracy and mean
    cost on ``probs`` (the check frames): what the page shows beside the chosen policy."""
    total = float(sum(costs_ms))
    points: list[dict[str, Any]] = []
    for lam in LAM_GRID[::6]:
        acc, cost = replay_index(build_policy(chain, lam, floor), probs, labels, chain.cost)
        if not points or abs(cost - points[-1]["cost_fraction"]) > 0.005 or acc > points[-1]["accuracy"]:
            points.append({"kind": "dynamic-index", "lam": round(lam, 6), "accuracy": round(acc, 4),
                           "cost_fraction": round(cost, 4), "cost_ms": round(cost * total, 3)})
    cum = np.cumsum(costs_ms)
    for k in range(probs.shape[1]):
        acc = float((probs[:, k].argmax(-1) == labels).mean())
        points.append({"kind": f"exit {k + 1} always", "lam": None, "accuracy": round(acc, 4),
                       "cost_fraction": round(float(cum[k]) / total, 4), "cost_ms": round(float(cum[k]), 3)})
    return points


def write_check_traces(out: Path, check: SceneFrames, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Check traces as ONNX Runtime computes them, saved beside the others and listed in the manifest."""
    probs, labels = traces(cpu_sessions([out / e.file for e in read_manifest(out).exits]), check)
    path = out / "traces_check.npz"
    np.savez_compressed(path, probs=probs, labels=labels, class_names=np.array(names))
    list_traces(out, {"check": trace_spec(path, len(labels))})
    return probs, labels


def teach(data: Path, base: Path, out: Path, epochs: int = 12, lr: float = 2e-3, batch_size: int = 32,
          threads: int = 0, progress: Progress = lambda e: None, input_size: int | None = None,
          patience: int = 4, width: float | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    manifest, spec = read_model_folder(base)
    size = input_size or read_manifest(base).input.width
    if size < 32 or size % 32:
        raise TeachError(f"input size {size}: a multiple of 32 (the VGG pools five times), e.g. 96, 128 or 160")
    loaded = {s: load_split(data / s, (size, size)) for s in ("train", "calibration", "test")}
    splits: dict[str, Split] = {s: v for s, v in loaded.items() if v is not None}
    check = load_split(data / "check", (size, size), optional=True)
    names = splits["train"].names
    for s, v in [*splits.items(), *([("check", check)] if check is not None else [])]:
        if v.names != names:
            raise TeachError(f"{data / s} has classes {v.names}, train/ has {names}: every split needs every class")
    if len(names) < 2:
        raise TeachError(f"{data / 'train'} has {len(names)} class(es); a model needs at least two")
    progress({"event": "frames", "classes": names, **{s: len(v.labels) for s, v in splits.items()},
              "check": 0 if check is None else len(check.labels)})
    train_ds = SceneFrames(splits["train"].images, splits["train"].labels, Jitter(), balance=True)
    cal_images, cal_labels = jittered_copies(splits["calibration"].images, splits["calibration"].labels,
                                             AUGMENTED_CALIBRATION)
    cal_ds = SceneFrames(cal_images, cal_labels)
    test_ds = SceneFrames(splits["test"].images, splits["test"].labels)
    check_ds = None if check is None else SceneFrames(check.images, check.labels)
    work = out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    base_size = read_manifest(base).input.width  # the base's segments are checked on frames of their own size
    probe = splits["train"].images if size == base_size else np.stack(
        [cv2.resize(img, (base_size, base_size), interpolation=cv2.INTER_AREA) for img in splits["train"].images])
    base_model, err = recover_checkpoint(base, SceneFrames(probe, splits["train"].labels), work / "base.pt",
                                         (manifest, spec))
    if width is not None and width != base_model.spec.width:  # a wider base, computing what the base computed
        base_model = widen_model(base_model, width)
    arch = dataclasses.replace(spec, num_classes=len(names), input_size=size, width=base_model.spec.width)
    torch.manual_seed(TrainConfig.seed)  # new exit heads start the same whatever ran before: a training is repeatable
    model = ThreeExitVGG(arch)
    own = model.state_dict()
    kept = {k: v for k, v in base_model.state_dict().items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(kept, strict=False)
    progress({"event": "start", "base": str(base), "kept_tensors": len(kept), "new_tensors": len(own) - len(kept),
              "epochs": epochs, "input_size": size, "width": arch.width, "recovery_error": err,
              "early_stopping_on": "calibration (jittered)"})
    cfg = TrainConfig(epochs=epochs, batch_size=min(batch_size, len(train_ds)), lr=lr, threads=threads,
                      max_shift=max(2, size // 16))
    best: dict[str, Any] = {"score": -1.0, "epoch": 0, "state": None}

    def on_epoch(net: ThreeExitVGG, done: list[Any]) -> bool:
        cal_acc, _, _ = evaluate(net, cal_ds)
        check_acc = None if check_ds is None else evaluate(net, check_ds)[0]  # shown, never used to choose
        net.train()
        h = done[-1]
        score = float(np.mean(cal_acc))
        if score >= best["score"]:  # a tie: the later epoch (further down the learning-rate schedule)
            best.update(score=score, epoch=h.epoch, state=copy.deepcopy(net.state_dict()))
        seconds = [e.seconds for e in done]
        stop = h.epoch - best["epoch"] >= patience
        progress({"event": "epoch", "epoch": h.epoch, "epochs": epochs, "loss": round(h.loss, 4),
                  "train_accuracy": [round(a, 4) for a in h.train_accuracy],
                  "calibration_accuracy": [round(a, 4) for a in cal_acc],
                  "check_accuracy": None if check_acc is None else [round(a, 4) for a in check_acc],
                  "best_epoch": best["epoch"], "seconds": round(h.seconds, 2),
                  "eta_s": 0 if stop else round(float(np.mean(seconds)) * (epochs - h.epoch), 1)})
        return stop

    result = train(model, train_ds, cfg, progress=lambda line: None, on_epoch=on_epoch)
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    model.eval()
    train_s = time.perf_counter() - t0
    history = [dataclasses.asdict(h) for h in result.history]
    save_checkpoint({"arch": dataclasses.asdict(arch), "state_dict": model.state_dict(), "class_names": names,
                     "train_config": dataclasses.asdict(cfg), "history": history, "train_seconds": train_s,
                     "dataset": f"imagefolder:{data}", "lineage": []}, work / "taught.pt")
    progress({"event": "export", "best_epoch": best["epoch"]})
    provenance = {"dataset": f"imagefolder:{data}", "fine_tuned_from": str(base), "calibration_set": str(data /
                  "calibration") + f" (each frame {AUGMENTED_CALIBRATION}x jittered)", "test_set": str(data / "test"),
                  "check_set": None if check is None else str(data / "check"),
                  "train_config": dataclasses.asdict(cfg), "history": history, "best_epoch": best["epoch"],
                  "train_seconds": round(train_s, 1), "torch_version": torch.__version__,
                  "recipe": "python -m exporter teach (exporter/teach.py)"}
    exported = export_model_folder(model, names, cal_ds, test_ds, out, provenance, "float32")
    manifest_file = out / "manifest.json"  # named after its version, so /status and the page tell models apart
    manifest_json = json.loads(manifest_file.read_text())
    manifest_json["name"] = out.name
    manifest_file.write_text(json.dumps(manifest_json, indent=2))
    progress({"event": "policy"})
    clips = write_recording_clips(out, {**splits, **({"check": check} if check is not None else {})}, threads)
    report = fit_and_report(out, names, exported.costs_ms, check, check_ds)
    report["policy"]["recording_clips"] = clips
    done = {"event": "done", "model": str(out), "classes": names, "input_size": size, "width": arch.width,
            "test_accuracy": [round(e.test_accuracy, 4) for e in exported.exits],
            "costs_ms": [round(c, 3) for c in exported.costs_ms], "policy": report["policy"],
            "check": report["check"], "served": report["served"], "operating_points": report["operating_points"],
            "frames": {**{s: len(v.labels) for s, v in splits.items()}, "check": 0 if check is None else
                       len(check.labels)},
            "best_epoch": best["epoch"], "epochs_run": len(result.history),
            "seconds": round(time.perf_counter() - t0, 1)}
    (out / REPORT_FILE).write_text(json.dumps({k: v for k, v in done.items() if k != "event"}, indent=1) + "\n")
    progress(done)
    return done


def fit_and_report(out: Path, names: list[str], costs_ms: Sequence[float], check: Split | None,
                   check_ds: SceneFrames | None) -> dict[str, Any]:
    """The floor from the check (else the jittered calibration), the policy fitted on the jittered calibration
    with it, and what that policy does on the check frames."""
    manifest = read_manifest(out)
    cal_probs, cal_labels = load_traces(out, manifest, "calibration")
    if check is not None and check_ds is not None:
        probs, labels = write_check_traces(out, check_ds, names)
        ids = check.ids
    else:
        probs, labels, ids = cal_probs, cal_labels, []
    per_exit = (probs.argmax(-1) == labels[:, None]).mean(0)
    floor = depth_floor([float(a) for a in per_exit])
    fitted = fit_policy(out, min_exit=floor)
    fitted["floor_from"] = "check" if check is not None else "calibration (jittered)"
    policy = load_policy(out, len(costs_ms))
    chain = fit_chain(cal_probs, cal_labels, costs_ms, loss_kind=str(fitted["loss_kind"]))
    report = check_report(policy, probs, labels, ids, names, costs_ms) if check is not None else None
    points = policy_points(chain, floor, probs, labels, costs_ms)
    return {"policy": fitted, "check": report, "served": served_on_clips(out, policy), "operating_points": {
        "on": "check" if check is not None else "calibration (jittered)", "points": points}}


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
    ap.add_argument("--input-size", type=int, default=None, help="the model's input side in pixels (a multiple of "
                    "32; default: the base's); larger sees small objects better and costs more per exit")
    ap.add_argument("--width", type=float, default=None, help="a wider base than the one given (Net2WiderNet: it "
                    "starts computing what the base computes), e.g. 0.5 for a 0.25-wide base; costs more per exit")
    ap.add_argument("--json", action="store_true", help="one JSON line per step on stdout")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def emit(event: dict[str, Any]) -> None:
        print(json.dumps(event, default=float) if args.json else event, flush=True)

    try:
        teach(args.data, args.base, args.out, args.epochs, args.lr, args.batch_size, args.threads, emit,
              args.input_size, width=args.width)
    except (TeachError, ExporterError, OSError, ValueError) as exc:
        emit({"event": "error", "error": str(exc)})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
