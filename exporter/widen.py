"""Widen a trained three-exit VGG without losing what it learned (Net2WiderNet, Chen, Goodfellow & Shlens,
"Net2Net: Accelerating Learning via Knowledge Transfer", ICLR 2016).

A wider network of the same config starts as a copy of the narrow one: every new channel of a convolution
replicates one old channel (its filters, bias and batch-norm parameters and statistics), and the layer reading
those channels splits each old channel's weights among its replicas, so the wider network computes the same
function.  Exactly equal replicas would stay equal under any gradient step (same inputs, same gradients; Adam's
per-weight normalisation even cancels unequal split factors), so the copy is not exact: the split factors are
drawn at random (they still sum to one) and the replicated filters get a little noise (``noise`` times the
layer's weight standard deviation).  Fine-tune the result with ``python -m exporter train --init``.

Widening keeps the depth, the layers the exits follow and the final exit's hidden width (``final_hidden`` does not
scale).  The exits' FLOPs fractions move a little (the first convolution reads 3 colour channels at any width); a
width at which the nearest cuts fall on other layers is refused.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from exporter.errors import ExporterError
from exporter.vgg import ArchSpec, FinalExit, Segment, SideExit, ThreeExitVGG

log = logging.getLogger(__name__)


class WidenError(ExporterError, ValueError):
    """The checkpoint cannot be widened as asked."""


@dataclasses.dataclass(frozen=True)
class ChannelMap:
    """Which old channel each new channel copies (``source``), and the share of the old channel's outgoing weight
    each replica carries (``share``; the shares of one old channel's replicas sum to one)."""

    source: torch.Tensor  # (new,) int64
    share: torch.Tensor  # (new,) float32

    @staticmethod
    def identity(n: int) -> ChannelMap:
        return ChannelMap(torch.arange(n), torch.ones(n))

    @staticmethod
    def draw(old: int, new: int, gen: torch.Generator) -> ChannelMap:
        """The first ``old`` channels keep their places; each extra one copies an old channel drawn at random."""
        if new < old:
            raise WidenError(f"a layer would shrink from {old} to {new} channels: widening only adds channels")
        extra = torch.randint(0, old, (new - old,), generator=gen)
        source = torch.cat([torch.arange(old), extra])
        # random shares within each old channel's replicas (a Dirichlet(1, ..., 1) draw: positive, summing to 1)
        raw = -torch.log(torch.rand(new, generator=gen).clamp_min(1e-6))
        total = torch.zeros(old).index_add_(0, source, raw)
        return ChannelMap(source, raw / total[source])


def _copy_conv(old: nn.Conv2d, new: nn.Conv2d, inp: ChannelMap, out: ChannelMap, noise: float,
               gen: torch.Generator) -> None:
    w = old.weight.detach()[out.source][:, inp.source] * inp.share.view(1, -1, 1, 1)
    replica = torch.ones(len(out.source), dtype=torch.bool)
    replica[: old.out_channels] = False
    if noise > 0 and replica.any():
        scale = noise * float(old.weight.detach().std())
        w[replica] += scale * torch.randn(w[replica].shape, generator=gen)
    new.weight.data.copy_(w)
    if old.bias is not None and new.bias is not None:
        new.bias.data.copy_(old.bias.detach()[out.source])


def _copy_bn(old: nn.BatchNorm2d, new: nn.BatchNorm2d, m: ChannelMap) -> None:
    for name in ("weight", "bias", "running_mean", "running_var"):
        getattr(new, name).data.copy_(getattr(old, name).detach()[m.source])
    if old.num_batches_tracked is not None and new.num_batches_tracked is not None:
        new.num_batches_tracked.copy_(old.num_batches_tracked)


def _copy_linear(old: nn.Linear, new: nn.Linear, inp: ChannelMap) -> None:
    new.weight.data.copy_(old.weight.detach()[:, inp.source] * inp.share.view(1, -1))
    new.bias.data.copy_(old.bias.detach())


def _widen_sequence(old_mods: list[nn.Module], new_mods: list[nn.Module], inp: ChannelMap, noise: float,
                    gen: torch.Generator) -> ChannelMap:
    """Copy a chain of conv / BN / ReLU / pool / linear layers; returns the channel map of its output."""
    m = inp
    for o, n in zip(old_mods, new_mods, strict=True):
        if type(o) is not type(n):
            raise WidenError(f"layer {o} has no counterpart in the wider network ({n})")
        if isinstance(o, nn.Conv2d):
            assert isinstance(n, nn.Conv2d)
            out = ChannelMap.draw(o.out_channels, n.out_channels, gen)
            _copy_conv(o, n, m, out, noise, gen)
            m = out
        elif isinstance(o, nn.BatchNorm2d):
            assert isinstance(n, nn.BatchNorm2d)
            _copy_bn(o, n, m)
        elif isinstance(o, nn.Linear):
            assert isinstance(n, nn.Linear)
            _copy_linear(o, n, m)
            m = ChannelMap.identity(n.out_features)
    return m


def _segments(net: ThreeExitVGG) -> list[Segment]:
    return [s for s in net.segments if isinstance(s, Segment)]


def widen_model(old: ThreeExitVGG, width: float, noise: float = 0.01, seed: int = 0) -> ThreeExitVGG:
    """A ``width``-wide copy of ``old`` computing (up to ``noise``) the same function."""
    if width <= old.spec.width:
        raise WidenError(f"the checkpoint's width is {old.spec.width:g}; widening needs a larger one, not {width:g}")
    if noise < 0:
        raise WidenError(f"noise {noise} must be >= 0")
    spec: ArchSpec = dataclasses.replace(old.spec, width=width)
    new = ThreeExitVGG(spec)
    cuts_old, cuts_new = ([len(seg.body) for seg in _segments(net)] for net in (old, new))
    if cuts_old != cuts_new:
        raise WidenError(f"at width {width:g} the exits would follow other layers (segments of {cuts_new} layers, not "
                         f"{cuts_old}): widening keeps the exits in place; choose another width")
    gen = torch.Generator().manual_seed(seed)
    m = ChannelMap.identity(3)  # the image's colour channels
    for seg_old, seg_new in zip(_segments(old), _segments(new), strict=True):
        body = _widen_sequence(list(seg_old.body), list(seg_new.body), m, noise, gen)
        if isinstance(seg_old.head, SideExit):
            assert isinstance(seg_new.head, SideExit)
            _widen_sequence([*seg_old.head.branch, seg_old.head.fc], [*seg_new.head.branch, seg_new.head.fc],
                            body, noise, gen)
        else:
            assert isinstance(seg_old.head, FinalExit) and isinstance(seg_new.head, FinalExit)
            _widen_sequence(list(seg_old.head.net), list(seg_new.head.net), body, noise, gen)
        m = body
    new.eval()
    return new


def widen_checkpoint(src: Path, out: Path, width: float, noise: float = 0.01, seed: int = 0) -> ThreeExitVGG:
    """``python -m exporter widen``: write a checkpoint of ``src`` widened to ``width`` (its lineage records it)."""
    from exporter.pipeline import load_checkpoint, save_checkpoint

    old, ckpt = load_checkpoint(src)
    new = widen_model(old, width, noise, seed)
    step: dict[str, Any] = {"widened_from": str(src), "width": [old.spec.width, width], "noise": noise, "seed": seed,
                            "method": "Net2WiderNet"}
    payload = {**{k: v for k, v in ckpt.items() if k not in ("torch_version", "host")},
               "arch": dataclasses.asdict(new.spec), "state_dict": new.state_dict(),
               "lineage": [*ckpt.get("lineage", []), step]}
    save_checkpoint(payload, out)
    log.info("widened %s from width %g to %g (%d -> %d parameters) into %s", src, old.spec.width, width,
             sum(p.numel() for p in old.parameters()), sum(p.numel() for p in new.parameters()), out)
    return new
