"""Joint training of the three exits: loss = sum_k w_k * CE(exit_k), default weights (0.3, 0.3, 1.0)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from exporter.datasets import random_shift
from exporter.errors import ExporterError
from exporter.vgg import ThreeExitVGG

log = logging.getLogger(__name__)

DEFAULT_LOSS_WEIGHTS: tuple[float, float, float] = (0.3, 0.3, 1.0)


def joint_loss(logits: Sequence[torch.Tensor], target: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """Weighted sum of each exit's cross-entropy."""
    if len(logits) != len(weights):
        raise ValueError(f"{len(logits)} exits but {len(weights)} loss weights")
    return sum((w * nn.functional.cross_entropy(lg, target) for lg, w in zip(logits, weights, strict=True)),
               start=torch.zeros((), device=target.device))


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 20
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 5e-4
    loss_weights: tuple[float, float, float] = DEFAULT_LOSS_WEIGHTS
    max_shift: int = 4
    seed: int = 0
    threads: int = 0  # 0: torch's default
    max_steps: int = 0  # 0: no cap (tests cap it)
    device: str = "cpu"  # a torch device ("cuda" trains on the GPU; see resolve_device)
    workers: int = 0  # DataLoader worker processes (0: frames are prepared in the training process)


class DeviceError(ExporterError, RuntimeError):
    """The training device asked for is not there."""


def resolve_device(name: str) -> str:
    """``auto``: CUDA when this torch sees a GPU, else the CPU; ``cuda``/``cuda:N``: that GPU or an error (never a
    silent fall back to a CPU run many times slower); ``cpu``: the CPU."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {name}: this torch ({torch.__version__}, CUDA build "
                              f"{torch.version.cuda or 'none'}) sees no CUDA GPU; use --device cpu or auto")
        index = torch.device(name).index or 0
        if index >= torch.cuda.device_count():
            raise DeviceError(f"--device {name}: only {torch.cuda.device_count()} CUDA GPU(s) visible")
        return name
    if name == "cpu":
        return name
    raise DeviceError(f"--device {name!r}: choose auto, cpu, cuda or cuda:N")


@dataclass
class EpochStats:
    epoch: int
    loss: float
    train_accuracy: list[float]
    seconds: float


@dataclass
class TrainResult:
    history: list[EpochStats] = field(default_factory=list)
    step_losses: list[float] = field(default_factory=list)


@torch.no_grad()
def evaluate(model: ThreeExitVGG, data: Dataset[tuple[torch.Tensor, torch.Tensor]], batch_size: int = 256
             ) -> tuple[list[float], torch.Tensor, torch.Tensor]:
    """Per-exit accuracy, and the softmax of every exit (N, 3, C) with the labels (N,)."""
    model.eval()
    probs, labels = [], []
    for x, y in DataLoader(data, batch_size=batch_size):
        probs.append(torch.stack([lg.softmax(-1) for lg in model(x)], dim=1))
        labels.append(torch.as_tensor(y))
    p, t = torch.cat(probs), torch.cat(labels)
    acc = [(p[:, k].argmax(-1) == t).float().mean().item() for k in range(p.shape[1])]
    return acc, p, t


def train(model: ThreeExitVGG, data: Dataset[tuple[torch.Tensor, torch.Tensor]], cfg: TrainConfig,
          progress: Callable[[str], None] = print,
          on_epoch: Callable[[ThreeExitVGG, list[EpochStats]], bool | None] | None = None) -> TrainResult:
    """Train all exits jointly on ``cfg.device``; ``progress`` gets one line per logging step and per epoch,
    ``on_epoch`` the model (in train mode, on that device) and the epochs so far after each epoch (to save it, so an
    interrupted run keeps them); when it returns True, training stops there (early stopping).  The model is back
    on the CPU, in eval mode, when this returns."""
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    model.to(device)
    gen = torch.Generator().manual_seed(cfg.seed)
    loader = DataLoader(data, batch_size=cfg.batch_size, shuffle=True, generator=gen, drop_last=True,
                        pin_memory=device.type == "cuda", num_workers=cfg.workers,
                        persistent_workers=cfg.workers > 0)
    steps_per_epoch = len(loader) if not cfg.max_steps else min(len(loader), cfg.max_steps)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.epochs * steps_per_epoch)
    result = TrainResult()
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        t0 = time.perf_counter()
        total, correct, seen = 0.0, [0, 0, 0], 0
        for step, (x, y) in enumerate(loader, 1):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            x = random_shift(x, cfg.max_shift, gen)
            logits = model(x)
            loss = joint_loss(logits, y, cfg.loss_weights)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            value = loss.item()
            result.step_losses.append(value)
            total += value * len(y)
            seen += len(y)
            for k, lg in enumerate(logits):
                correct[k] += int((lg.argmax(-1) == y).sum())
            if step % 20 == 0 or step == steps_per_epoch:
                accs = " ".join(f"exit{k + 1}={c / seen:.3f}" for k, c in enumerate(correct))
                progress(f"epoch {epoch}/{cfg.epochs} step {step}/{steps_per_epoch} "
                         f"loss={total / seen:.4f} train-acc {accs} ({time.perf_counter() - t0:.0f}s)")
            if step >= steps_per_epoch:
                break
        stats = EpochStats(epoch, total / seen, [c / seen for c in correct], time.perf_counter() - t0)
        result.history.append(stats)
        log.info("epoch %d done: loss %.4f", epoch, stats.loss)
        if on_epoch is not None and on_epoch(model, result.history):
            log.info("stopped early after epoch %d of %d", epoch, cfg.epochs)
            break
    model.to("cpu")
    model.eval()
    return result
