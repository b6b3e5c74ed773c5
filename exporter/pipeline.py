"""The steps behind ``python -m exporter``: data, train, export."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from exporter import demo_data
from exporter.datasets import demo_split_dataset, image_folder_dataset
from exporter.errors import ExporterError
from exporter.train import DeviceError, EpochStats, TrainConfig, evaluate, resolve_device, train
from exporter.vgg import ArchSpec, ThreeExitVGG

log = logging.getLogger(__name__)


class ExportError(ExporterError, RuntimeError):
    """A step of the exporter failed for a reason the user can act on."""


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    arch: ArchSpec
    train: TrainConfig
    #: Take the input size from the demo data's frames (``arch.input_size`` is then only the ImageFolder size).
    size_from_data: bool = False


def train_options(args: argparse.Namespace) -> TrainOptions:
    try:
        arch = ArchSpec(config=args.config, width=args.width, input_size=args.input_size or demo_data.IMAGE_SIZE)
        device = resolve_device(args.device)
    except (ValueError, DeviceError) as exc:
        raise ExportError(str(exc)) from exc
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                      loss_weights=tuple(args.loss_weights), seed=args.seed, threads=args.threads, device=device,
                      workers=args.workers)
    return TrainOptions(arch, cfg, size_from_data=args.input_size is None)


def build_data(out: Path, cache: Path, counts: dict[str, int] | None, seed: int,
               reshape_p: float | None = None, recipe: int = demo_data.RECIPE,
               size: int = demo_data.IMAGE_SIZE, shards: int = 1) -> None:
    try:
        demo_data.build_demo_dataset(out, cache, counts, seed, reshape_p, recipe, size, shards)
    except (demo_data.DemoDataError, ValueError) as exc:
        raise ExportError(str(exc)) from exc


def load_dataset(root: Path, split: str, input_size: int | None) -> tuple[Dataset[Any], list[str], str]:
    """A split of the demo data (``root/split.npz``, whose frames must be ``input_size`` px square unless that is
    None) or of an ImageFolder tree (``root/split/CLASS/*``, resized to ``input_size``, 96 px if None)."""
    npz = root / f"{split}.npz"
    ds: Dataset[Any]
    if npz.is_file():
        try:
            ds, names = demo_split_dataset(npz)
        except demo_data.DemoDataError as exc:
            raise ExportError(str(exc)) from exc
        side = frame_size(ds)
        if input_size is not None and side != input_size:
            raise ExportError(f"{npz}: its frames are {side} px, the model takes {input_size} px; draw frames of "
                              f"that size (python -m exporter data --size {input_size} --out DIR) and pass --data DIR")
        return ds, names, f"demo:{npz}"
    folder = root / split
    if folder.is_dir():
        ds, names = image_folder_dataset(folder, input_size or demo_data.IMAGE_SIZE)
        return ds, names, f"imagefolder:{folder}"
    raise ExportError(f"{root}: no {split}.npz (demo data) and no {split}/ folder (ImageFolder); "
                      "build the demo data with 'python -m exporter data' or point --data at your frames")


def frame_size(ds: Dataset[Any]) -> int:
    """The side of a demo split's (square) frames."""
    return int(ds.images.shape[1])  # type: ignore[attr-defined]


def train_checkpoint(data_root: Path, out: Path, opts: TrainOptions,
                     progress: Any = print, init: Path | None = None) -> ThreeExitVGG:
    ds, names, source = load_dataset(data_root, "train", None if opts.size_from_data else opts.arch.input_size)
    size = frame_size(ds) if opts.size_from_data and source.startswith("demo:") else opts.arch.input_size
    try:
        arch = dataclasses.replace(opts.arch, input_size=size, num_classes=len(names))
    except ValueError as exc:
        raise ExportError(f"{data_root / 'train.npz'}: {exc}; draw the frames at such a size "
                          "(python -m exporter data --size N)") from exc
    model = ThreeExitVGG(arch)
    history: list[Any] = []
    lineage: list[dict[str, Any]] = []
    seconds = 0.0
    if init is not None:
        start, ckpt = load_checkpoint(init)
        if dataclasses.replace(start.spec, input_size=arch.input_size) != arch:
            raise ExportError(f"{init} holds {start.spec}, not the requested {arch}")
        if start.spec.input_size != arch.input_size:  # every exit pools globally: the weights fit any input size
            log.info("fine-tuning %s's %d px weights at %d px", init, start.spec.input_size, arch.input_size)
        model.load_state_dict(start.state_dict())
        history, seconds = list(ckpt["history"]), float(ckpt["train_seconds"])
        lineage = list(ckpt.get("lineage", [{"dataset": ckpt["dataset"], "epochs": len(history)}]))
        log.info("fine-tuning from %s (%d epochs already)", init, len(history))
    log.info("training %s width %.3g at %d px on %s (%d samples, on %s), exits at %s of backbone FLOPs",
             arch.config, arch.width, arch.input_size, source, len(ds),  # type: ignore[arg-type]
             opts.train.device, [round(f, 3) for f in model.backbone_fractions[:2]])
    t0 = time.perf_counter()
    step = {"dataset": source, "epochs": opts.train.epochs, "lr": opts.train.lr,
            "fine_tuned_from": str(init) if init else None, "seed": opts.train.seed}
    if source.startswith("demo:") and (recipe := demo_data.split_recipe(data_root / "train.npz")) is not None:
        step["recipe"] = recipe  # how the demo frames were drawn (python -m exporter data --recipe N)

    def save(net: ThreeExitVGG, done: list[EpochStats]) -> None:
        """Written after every epoch (atomically: a reader never sees half a file), so nothing trained is lost."""
        partial = {"epochs_completed": len(done)} if len(done) < opts.train.epochs else {}
        payload = {
            "arch": dataclasses.asdict(arch),
            "state_dict": {k: v.detach().cpu() for k, v in net.state_dict().items()},
            "class_names": names,
            "train_config": dataclasses.asdict(opts.train),
            "history": history + [dataclasses.asdict(h) for h in done],
            "train_seconds": seconds + time.perf_counter() - t0,
            "dataset": source,
            "lineage": [*lineage, {**step, **partial}],
        }
        save_checkpoint(payload, out)
        if partial:
            log.info("epoch %d of %d saved to %s", len(done), opts.train.epochs, out)

    train(model, ds, opts.train, progress, on_epoch=save)  # the last epoch's save is the checkpoint
    log.info("saved checkpoint %s", out)
    return model


def save_checkpoint(payload: dict[str, Any], out: Path) -> None:
    """Write a checkpoint with the torch version and host that made it, atomically (a reader never sees half a
    file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    torch.save({**payload, "torch_version": torch.__version__, "host": platform.node()}, tmp)
    tmp.replace(out)


def load_checkpoint(path: Path) -> tuple[ThreeExitVGG, dict[str, Any]]:
    if not path.is_file():
        raise ExportError(f"checkpoint {path} does not exist; train one with 'python -m exporter train'")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    arch = dict(ckpt["arch"])
    arch["exit_fractions"] = tuple(arch["exit_fractions"])
    model = ThreeExitVGG(ArchSpec(**arch))
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    return model, ckpt


def at_input_size(model: ThreeExitVGG, size: int) -> ThreeExitVGG:
    """The same weights in a network that takes ``size`` px frames (every exit pools globally, so they fit)."""
    try:
        resized = ThreeExitVGG(dataclasses.replace(model.spec, input_size=size))
    except ValueError as exc:
        raise ExportError(str(exc)) from exc
    resized.load_state_dict(model.state_dict())
    return resized.eval()


def score_checkpoints(paths: list[Path], data_root: Path, splits: tuple[str, ...] = ("calibration", "test"),
                      input_size: int | None = None) -> str:
    """A table of each checkpoint's per-exit accuracy on ``splits`` (eager PyTorch, eval mode): what decides which
    of several candidates to export (choose on the calibration split; the test split is reported, not chosen on).
    ``input_size`` scores the weights at another input size than they were trained at."""
    models = [(p, *load_checkpoint(p)) for p in paths]
    if input_size is not None:
        models = [(p, at_input_size(m, input_size), c) for p, m, c in models]
    sizes = sorted({m.spec.input_size for _, m, _ in models})
    if len(sizes) != 1:
        raise ExportError(f"the checkpoints take different input sizes {sizes}; score them one at a time")
    lines = [f"{'checkpoint':<32} {'split':<12} {'epochs':>6}  " + "  ".join(f"exit {k + 1:>2}" for k in range(3))]
    for split in splits:
        data, names, _ = load_dataset(data_root, split, sizes[0])
        for path, model, ckpt in models:
            if names != ckpt["class_names"]:
                raise ExportError(f"class names of {data_root} differ from {path}'s {ckpt['class_names']}")
            acc, _, _ = evaluate(model, data)
            lines.append(f"{path!s:<32} {split:<12} {len(ckpt['history']):>6}  "
                         + "  ".join(f"{a:7.2%}" for a in acc))
    return "\n".join(lines)


def export_checkpoint(ckpt_path: Path, data_root: Path, out: Path, weights: str | None = None) -> None:
    from exporter.onnx_export import DEFAULT_WEIGHTS, export_model_folder

    model, ckpt = load_checkpoint(ckpt_path)
    calib, names, calib_src = load_dataset(data_root, "calibration", model.spec.input_size)
    test, _, test_src = load_dataset(data_root, "test", model.spec.input_size)
    if names != ckpt["class_names"]:
        raise ExportError(f"class names of {data_root} {names} differ from the checkpoint's {ckpt['class_names']}")
    torch_acc, _, _ = evaluate(model, test)
    log.info("eager per-exit test accuracy: %s", [round(a, 4) for a in torch_acc])
    provenance = {
        "dataset": ckpt["dataset"],
        "lineage": ckpt.get("lineage", []),
        "calibration_set": calib_src,
        "test_set": test_src,
        "train_config": ckpt["train_config"],
        "history": ckpt["history"],
        "train_seconds": round(ckpt["train_seconds"], 1),
        "torch_version": ckpt["torch_version"],
        "recipe": "python -m exporter all (see exporter/demo_data.py)",
    }
    export_model_folder(model, names, calib, test, out, provenance, weights or DEFAULT_WEIGHTS)
    log.info("model folder written: %s", json.dumps(str(out)))


#: Training frames whose statistics set an averaged checkpoint's batch norms.
AVERAGE_BN_FRAMES = 8192


def average_checkpoints(paths: list[Path], data_root: Path, out: Path, bn_frames: int = AVERAGE_BN_FRAMES
                        ) -> ThreeExitVGG:
    """Average the weights of checkpoints fine-tuned from one starting point (a "model soup", Wortsman et al.
    2022; stochastic weight averaging, Izmailov et al. 2018) and re-derive the batch norms' running statistics on
    ``bn_frames`` frames of ``data_root``'s training split with :func:`torch.optim.swa_utils.update_bn` (averaged
    weights do not produce the averaged statistics).  Weights only average into a good network when the
    checkpoints lie in one basin, so they must share their first lineage step (where training started)."""
    from torch.optim.swa_utils import update_bn
    from torch.utils.data import DataLoader, Subset

    if len(paths) < 2:
        raise ExportError("averaging needs at least two checkpoints")
    models = [(p, *load_checkpoint(p)) for p in paths]
    first_path, first, first_ckpt = models[0]
    for path, model, ckpt in models[1:]:
        if model.spec != first.spec:
            raise ExportError(f"{path} holds {model.spec}, {first_path} holds {first.spec}: only one architecture "
                              "averages")
        if ckpt["class_names"] != first_ckpt["class_names"]:
            raise ExportError(f"{path} has classes {ckpt['class_names']}, {first_path} has "
                              f"{first_ckpt['class_names']}")
    lineages = [list(ckpt.get("lineage", [])) for _, _, ckpt in models]
    shared = 0
    while all(len(lin) > shared for lin in lineages) and all(lin[shared] == lineages[0][shared] for lin in lineages):
        shared += 1
    if shared == 0:
        raise ExportError(f"{', '.join(map(str, paths))} share no training step (their lineages start apart): "
                          "averaging the weights of unrelated networks gives a broken one; fine-tune each from "
                          "one checkpoint (python -m exporter train --init) before averaging")
    soup = ThreeExitVGG(first.spec)
    states = [model.state_dict() for _, model, _ in models]
    mean = {k: (torch.stack([s[k] for s in states]).mean(0) if v.is_floating_point() else v)
            for k, v in states[0].items()}
    soup.load_state_dict(mean)
    frames, _, source = load_dataset(data_root, "train", first.spec.input_size)
    stats = Subset(frames, range(min(bn_frames, len(frames))))  # type: ignore[arg-type]
    update_bn((x for x, _ in DataLoader(stats, batch_size=256)), soup)
    soup.eval()
    longest = max(models, key=lambda m: len(m[2]["history"]))[2]
    payload = {
        "arch": dataclasses.asdict(first.spec),
        "state_dict": soup.state_dict(),
        "class_names": first_ckpt["class_names"],
        "train_config": longest["train_config"],
        "history": longest["history"],  # the longest ingredient's epochs; each one's own steps are in the lineage
        "train_seconds": _distinct_epoch_seconds([c["history"] for _, _, c in models]),
        "dataset": longest["dataset"],
        "lineage": [*lineages[0][:shared], {
            "averaged": [{"checkpoint": str(p), "steps": lin[shared:]} for p, lin in zip(paths, lineages, strict=True)],
            "batch_norm_stats": source, "batch_norm_stats_frames": len(stats)}],
    }
    save_checkpoint(payload, out)
    log.info("averaged %d checkpoints into %s (batch norms from %d frames of %s)", len(paths), out, len(stats), source)
    return soup


def _distinct_epoch_seconds(histories: list[list[dict[str, Any]]]) -> float:
    """Training time behind a set of checkpoints: each epoch once, though every checkpoint fine-tuned from another
    repeats its ancestor's epochs in its own history."""
    seen = {(h["epoch"], h["loss"], h["seconds"]) for history in histories for h in history}
    return round(sum(s for _, _, s in seen), 1)
