"""The three-exit VGG family.

Declared as data, like torchvision's ``models/vgg.py``: the layer configs are
torchvision's own (``cfgs``), one builder turns a config into layers, and the
backbone is cut into three segments at the layer boundaries whose cumulative
convolution FLOPs come closest to the requested fractions (one third and two
thirds by default).  Each side exit is a light branch (3x3 conv, BN, ReLU,
global average pooling, linear); the final exit is global average pooling
followed by a small MLP (torchvision's 4096-wide classifier would dwarf a
64 px backbone).

Segment ``k`` maps the previous segment's feature map (the normalised image
for ``k = 1``) to ``(features_k, logits_k)``; the last segment returns only
its logits.  That is the unit the ONNX exporter writes to disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torchvision.models.vgg import cfgs as TORCHVISION_VGG_CFGS

#: Our names for torchvision's VGG configs.
VGG_CONFIGS: dict[str, str] = {"vgg11": "A", "vgg13": "B", "vgg16": "D"}

DEFAULT_EXIT_FRACTIONS: tuple[float, float] = (1 / 3, 2 / 3)


@dataclass(frozen=True)
class ArchSpec:
    """Everything needed to rebuild the network (recorded in the manifest)."""

    config: str = "vgg11"
    width: float = 0.5
    input_size: int = 64
    num_classes: int = 11
    exit_fractions: tuple[float, float] = DEFAULT_EXIT_FRACTIONS
    final_hidden: int = 128
    dropout: float = 0.2

    def __post_init__(self) -> None:
        if self.config not in VGG_CONFIGS:
            raise ValueError(f"unknown VGG config {self.config!r}; choose one of {sorted(VGG_CONFIGS)}")
        if not 0.05 <= self.width <= 4.0:
            raise ValueError(f"width multiplier {self.width} is outside [0.05, 4]")
        if self.input_size < 32 or self.input_size % 32:
            raise ValueError(f"input_size {self.input_size} must be a multiple of 32 (VGG pools five times)")
        lo, hi = self.exit_fractions
        if not 0.0 < lo < hi < 1.0:
            raise ValueError(f"exit fractions {self.exit_fractions} must satisfy 0 < f1 < f2 < 1")


def scaled_channels(v: int, width: float) -> int:
    return max(8, round(v * width))


def make_layers(cfg: Sequence[str | int], width: float) -> list[nn.Module]:
    """torchvision's ``make_layers`` with batch norm and a width multiplier, as a flat list."""
    layers: list[nn.Module] = []
    in_ch = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            out_ch = scaled_channels(int(v), width)
            layers += [nn.Conv2d(in_ch, out_ch, 3, padding=1), nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True)]
            in_ch = out_ch
    return layers


@dataclass(frozen=True)
class LayerShape:
    """Output of one backbone layer: its kind, channels, side length, and the conv FLOPs spent in it."""

    kind: str  # "conv", "bn", "relu" or "pool"
    channels: int
    side: int
    flops: int


def trace_shapes(layers: Sequence[nn.Module], input_size: int) -> list[LayerShape]:
    """Per-layer output shapes and FLOPs (2 x multiply-accumulates of each convolution)."""
    shapes: list[LayerShape] = []
    ch, side = 3, input_size
    for layer in layers:
        flops = 0
        if isinstance(layer, nn.Conv2d):
            kind = "conv"
            flops = 2 * layer.in_channels * layer.out_channels * 9 * side * side
            ch = layer.out_channels
        elif isinstance(layer, nn.MaxPool2d):
            kind = "pool"
            side //= 2
        elif isinstance(layer, nn.BatchNorm2d):
            kind = "bn"
        else:
            kind = "relu"
        shapes.append(LayerShape(kind, ch, side, flops))
    return shapes


def split_candidates(shapes: Sequence[LayerShape]) -> list[tuple[int, float]]:
    """(cut index, cumulative FLOPs fraction) for every place the backbone may be cut.

    A cut may follow a max-pool, or a ReLU that no max-pool follows (cutting
    after the pool passes a smaller feature map for the same FLOPs).
    """
    total = sum(s.flops for s in shapes)
    cum = 0
    out: list[tuple[int, float]] = []
    for i, s in enumerate(shapes[:-1]):
        cum += s.flops
        nxt = shapes[i + 1].kind
        if (s.kind == "pool" or (s.kind == "relu" and nxt != "pool")) and 0 < cum < total:
            out.append((i + 1, cum / total))
    return out


def choose_split_points(shapes: Sequence[LayerShape], fractions: Sequence[float]) -> list[int]:
    """Layer indices (exclusive ends) where the backbone is cut: for each target
    fraction, the candidate whose cumulative FLOPs fraction is closest; cuts
    strictly increase."""
    candidates = split_candidates(shapes)
    cuts: list[int] = []
    for f in fractions:
        allowed = [c for c in candidates if not cuts or c[0] > cuts[-1]]
        if not allowed:
            raise ValueError("backbone too short to place the exits")
        cuts.append(min(allowed, key=lambda c: abs(c[1] - f))[0])
    return cuts


class SideExit(nn.Module):
    """Light exit branch: two strided 3x3 convs (BN, ReLU), global average pooling, linear.

    The strided convs widen the receptive field cheaply (they run at 1/4 and
    1/16 of the feature map's area), so an early exit can see a whole digit.
    """

    def __init__(self, in_ch: int, num_classes: int) -> None:
        super().__init__()
        self.branch = nn.Sequential(
            nn.Conv2d(in_ch, in_ch, 3, stride=2, padding=1), nn.BatchNorm2d(in_ch), nn.ReLU(inplace=True),
            nn.Conv2d(in_ch, in_ch, 3, stride=2, padding=1), nn.BatchNorm2d(in_ch), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.branch(x))


class FinalExit(nn.Module):
    def __init__(self, in_ch: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_ch, hidden), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Segment(nn.Module):
    """One exportable unit: a slice of the backbone and the exit that reads it."""

    def __init__(self, body: nn.Sequential, head: nn.Module, is_last: bool) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.is_last = is_last

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        feats = self.body(x)
        logits = self.head(feats)
        if self.is_last:
            return logits
        return feats, logits


def head_flops(head: nn.Module, side: int) -> int:
    """FLOPs of an exit head reading a ``side`` x ``side`` feature map."""
    flops = 0
    for m in head.modules():
        if isinstance(m, nn.Conv2d):
            pad = int(m.padding[0])  # ints here, never "same"
            side = (side + 2 * pad - m.kernel_size[0]) // m.stride[0] + 1
            flops += 2 * m.in_channels * m.out_channels * m.kernel_size[0] * m.kernel_size[1] * side**2
        elif isinstance(m, nn.Linear):
            flops += 2 * m.in_features * m.out_features
    return flops


class ThreeExitVGG(nn.Module):
    """A VGG backbone cut into three segments, each ending in an exit."""

    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        self.spec = spec
        layers = make_layers(TORCHVISION_VGG_CFGS[VGG_CONFIGS[spec.config]], spec.width)
        shapes = trace_shapes(layers, spec.input_size)
        cuts = choose_split_points(shapes, spec.exit_fractions)
        bounds = [0, *cuts, len(layers)]
        total = sum(s.flops for s in shapes)
        segments = []
        self.backbone_fractions: list[float] = []
        self.segment_flops: list[int] = []
        self.feature_shapes: list[tuple[int, int, int]] = []
        for k in range(3):
            lo, hi = bounds[k], bounds[k + 1]
            out = shapes[hi - 1]
            is_last = k == 2
            head: nn.Module = (
                FinalExit(out.channels, spec.final_hidden, spec.num_classes, spec.dropout)
                if is_last
                else SideExit(out.channels, spec.num_classes)
            )
            segments.append(Segment(nn.Sequential(*layers[lo:hi]), head, is_last))
            body_flops = sum(s.flops for s in shapes[lo:hi])
            self.backbone_fractions.append(sum(s.flops for s in shapes[:hi]) / total)
            self.segment_flops.append(body_flops + head_flops(head, out.side))
            self.feature_shapes.append((out.channels, out.side, out.side))
        self.segments = nn.ModuleList(segments)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Logits of every exit, in order."""
        logits: list[torch.Tensor] = []
        for seg in self.segments:
            out = seg(x)
            if isinstance(out, tuple):
                x, lg = out
            else:
                lg = out
            logits.append(lg)
        return logits


def build(config: str = "vgg11", width: float = 0.5, input_size: int = 64, num_classes: int = 11,
          **kwargs: object) -> ThreeExitVGG:
    return ThreeExitVGG(ArchSpec(config=config, width=width, input_size=input_size, num_classes=num_classes,
                                 **kwargs))  # type: ignore[arg-type]


def vgg11(**kwargs: object) -> ThreeExitVGG:
    return build("vgg11", **kwargs)  # type: ignore[arg-type]


def vgg13(**kwargs: object) -> ThreeExitVGG:
    return build("vgg13", **kwargs)  # type: ignore[arg-type]


def vgg16(**kwargs: object) -> ThreeExitVGG:
    return build("vgg16", **kwargs)  # type: ignore[arg-type]
