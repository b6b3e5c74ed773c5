"""Rebuild a trainable PyTorch checkpoint from an exported model folder.

The export folds every batch norm into the convolution before it, so the ONNX
segments hold one weight and one bias per convolution and linear layer, under
the PyTorch parameter names.  ``recover_checkpoint`` loads those into a fresh
:class:`~exporter.vgg.ThreeExitVGG` built from the manifest's architecture and
gives each batch norm the statistics of the (folded) convolution's output on
real frames, ``mean = mu, var = sigma^2, weight = sqrt(sigma^2 + eps),
bias = mu``:

* in eval mode the batch norm is then exactly the identity, so the recovered
  network computes what the ONNX segments compute (checked against ONNX
  Runtime before the checkpoint is written);
* in train mode it normalises with batch statistics close to ``mu`` and
  ``sigma``, so fine-tuning starts from the exported model instead of from a
  network whose batch norms suddenly rescale every channel.

So a model folder is enough to fine-tune further (``python -m exporter train
--init``): on more epochs of the demo data, or on a user's own camera frames.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from google.protobuf.message import DecodeError
from onnx import numpy_helper
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from exporter.errors import ExporterError
from exporter.onnx_export import ParityError, check_parity, cpu_sessions
from exporter.pipeline import save_checkpoint
from exporter.vgg import ArchSpec, ThreeExitVGG
from models.errors import ModelFolderError
from models.manifest import Manifest, read_manifest, verify_file

log = logging.getLogger(__name__)

#: Frames whose activations set the recovered batch-norm statistics.
STAT_FRAMES = 2048


class RecoverError(ExporterError, RuntimeError):
    """The model folder cannot be turned back into a checkpoint (which file, what is wrong)."""


def read_model_folder(folder: Path) -> tuple[Manifest, ArchSpec]:
    """The folder's validated manifest and the architecture it records (errors name the file)."""
    try:
        manifest = read_manifest(folder)
    except ModelFolderError as exc:
        raise RecoverError(str(exc)) from exc
    a = manifest.architecture
    try:
        if a.get("family") != "three-exit VGG" or not a.get("batch_norm", False):
            raise RecoverError(f"{folder / 'manifest.json'}: architecture {a.get('family')!r} (batch_norm="
                               f"{a.get('batch_norm')}) is not this exporter's three-exit VGG with batch norm")
        spec = ArchSpec(config=a["config"], width=float(a["width"]), input_size=int(a["input_size"]),
                        num_classes=len(manifest.class_names), exit_fractions=tuple(a["exit_fractions_target"]),
                        final_hidden=int(a["final_hidden"]), dropout=float(a["dropout"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise RecoverError(f"{folder / 'manifest.json'}: cannot rebuild the architecture ({exc!r})") from exc
    return manifest, spec


def _load_folded_weights(model: ThreeExitVGG, folder: Path, manifest: Manifest) -> list[nn.BatchNorm2d]:
    """Copy every conv / linear parameter from the ONNX initializers; return the batch norms they fold."""
    folded: list[nn.BatchNorm2d] = []
    for k, (segment, spec) in enumerate(zip(model.segments, manifest.exits, strict=True)):
        try:
            path = verify_file(folder, spec.file, spec.sha256)  # present and unchanged, as the runtime checks
            graph = onnx.load(str(path)).graph
        except ModelFolderError as exc:
            raise RecoverError(str(exc)) from exc
        except (OSError, DecodeError) as exc:
            raise RecoverError(f"{folder / spec.file}: not a readable ONNX model ({exc})") from exc
        weights = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        for node in graph.node:  # weights stored as float16 reach their layer through a Cast (store_weights_float16)
            if node.op_type == "Cast" and node.input and node.input[0] in weights:
                weights[node.output[0]] = weights[node.input[0]].astype(np.float32)
        modules = dict(segment.named_modules())
        for name, module in modules.items():
            if not isinstance(module, nn.Conv2d | nn.Linear):
                continue
            for pname in ("weight", "bias"):
                key = f"{name}.{pname}"
                if key not in weights:
                    raise RecoverError(f"{path} has no initializer {key!r}: segment {k + 1} was not written by "
                                       "this exporter (or by another version of it)")
                param = getattr(module, pname)
                value = torch.from_numpy(np.array(weights[key], dtype=np.float32))
                if value.shape != param.shape:
                    raise RecoverError(f"{path}: {key} has shape {tuple(value.shape)}, the manifest's "
                                       f"architecture needs {tuple(param.shape)}")
                with torch.no_grad():
                    param.copy_(value)
        for parent in segment.modules():  # a batch norm right after a conv in a Sequential was folded into it
            if isinstance(parent, nn.Sequential):
                layers = list(parent)
                folded += [b for a, b in itertools.pairwise(layers)
                           if isinstance(a, nn.Conv2d) and isinstance(b, nn.BatchNorm2d)]
    return folded


def _running_stats(bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    if bn.running_mean is None or bn.running_var is None:  # track_running_stats=False: not this exporter's layers
        raise RecoverError("a batch norm of the rebuilt network keeps no running statistics")
    return bn.running_mean, bn.running_var


@torch.no_grad()
def _set_identity_batch_norms(model: ThreeExitVGG, norms: list[nn.BatchNorm2d], data: Dataset[Any]) -> None:
    """Give each batch norm its input's per-channel statistics on ``data``, as an exact eval-mode identity."""
    for bn in norms:  # first an exact identity everywhere, so the statistics are those of the folded network
        bn.reset_parameters()
        _running_stats(bn)[1].fill_(1 - bn.eps)
    sums: dict[int, list[torch.Tensor]] = {id(bn): [] for bn in norms}
    hooks = [bn.register_forward_pre_hook(
        lambda m, args: sums[id(m)].append(torch.stack([args[0].mean((0, 2, 3)), (args[0] ** 2).mean((0, 2, 3))])))
        for bn in norms]
    model.eval()
    try:
        for x, _ in DataLoader(data, batch_size=256):
            model(x)
    finally:
        for h in hooks:
            h.remove()
    for bn in norms:
        m1, m2 = torch.stack(sums[id(bn)]).mean(0)
        var = (m2 - m1**2).clamp_min(0)
        running_mean, running_var = _running_stats(bn)
        running_mean.copy_(m1)
        running_var.copy_(var)
        bn.weight.copy_(torch.sqrt(var + bn.eps))
        bn.bias.copy_(m1)


def check_recovered(model: ThreeExitVGG, folder: Path, manifest: Manifest, data: Dataset[Any], frames: int = 32
                    ) -> float:
    """Largest difference between the recovered network (eval) and ONNX Runtime, segment by segment, on the first
    ``frames`` frames of ``data``; raises :class:`RecoverError` past the export's own parity tolerance."""
    x = torch.stack([data[i][0] for i in range(min(frames, len(data)))])  # type: ignore[arg-type]
    model.eval()
    try:
        return check_parity(model, cpu_sessions([folder / e.file for e in manifest.exits]), x)
    except ParityError as exc:
        raise RecoverError(f"the recovered network does not compute what {folder}'s ONNX segments compute ({exc}); "
                           "the export may use other layers than this exporter") from exc


def recover_checkpoint(folder: Path, data: Dataset[Any], out: Path,
                       model_folder: tuple[Manifest, ArchSpec] | None = None) -> tuple[ThreeExitVGG, float]:
    """Write a checkpoint that ``python -m exporter train --init`` and ``export`` accept; returns it and the
    parity error against ONNX Runtime.  ``model_folder``: what :func:`read_model_folder` returned, if the caller
    has read it already."""
    manifest, spec = model_folder or read_model_folder(folder)
    model = ThreeExitVGG(spec)
    norms = _load_folded_weights(model, folder, manifest)
    stats = Subset(data, range(min(STAT_FRAMES, len(data))))  # type: ignore[arg-type]
    _set_identity_batch_norms(model, norms, stats)
    err = check_recovered(model, folder, manifest, data)
    prov = manifest.provenance
    save_checkpoint({
        "arch": dataclasses.asdict(spec),
        "state_dict": model.state_dict(),
        "class_names": list(manifest.class_names),
        "train_config": prov.get("train_config", {}),
        "history": prov.get("history", []),
        "train_seconds": float(prov.get("train_seconds", 0.0)),
        "dataset": prov.get("dataset", f"recovered:{folder}"),
        "lineage": [*prov.get("lineage", []), {"recovered_from": str(folder), "manifest_name": manifest.name,
                                               "batch_norm_stats_frames": len(stats)}],
    }, out)
    log.info("recovered %s from %s (%d batch norms re-derived on %d frames; max logit difference to ONNX "
             "Runtime %.2e)", out, folder, len(norms), len(stats), err)
    return model, err
