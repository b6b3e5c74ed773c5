"""The three-exit VGG family: builds, exit placement by FLOPs, joint loss, training."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs the train extra")

from torchvision.models.vgg import cfgs  # noqa: E402

from exporter.train import TrainConfig, joint_loss, train  # noqa: E402
from exporter.vgg import (  # noqa: E402
    DEFAULT_EXIT_FRACTIONS,
    VGG_CONFIGS,
    ArchSpec,
    ThreeExitVGG,
    make_layers,
    split_candidates,
    trace_shapes,
)

pytestmark = pytest.mark.train


@pytest.mark.parametrize("config", sorted(VGG_CONFIGS))
@pytest.mark.parametrize("width", [0.125, 0.25])
def test_family_builds_and_runs(config: str, width: float) -> None:
    model = ThreeExitVGG(ArchSpec(config=config, width=width, input_size=64, num_classes=11)).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        logits = model(x)
    assert [tuple(lg.shape) for lg in logits] == [(2, 11)] * 3
    # every conv of torchvision's config is in exactly one segment
    convs = sum(isinstance(m, torch.nn.Conv2d) for seg in model.segments for m in seg.body.modules())
    assert convs == sum(1 for v in cfgs[VGG_CONFIGS[config]] if v != "M")
    # segments chain: segment k+1 takes segment k's features
    with torch.no_grad():
        feats, _ = model.segments[0](x)
        assert tuple(feats.shape[1:]) == model.feature_shapes[0]


@pytest.mark.parametrize("config", sorted(VGG_CONFIGS))
def test_exits_sit_at_the_flops_fractions(config: str) -> None:
    spec = ArchSpec(config=config, width=0.25, input_size=96)
    model = ThreeExitVGG(spec)
    shapes = trace_shapes(make_layers(cfgs[VGG_CONFIGS[config]], spec.width), spec.input_size)
    fractions = [f for _, f in split_candidates(shapes)]
    for target, got in zip(DEFAULT_EXIT_FRACTIONS, model.backbone_fractions[:2], strict=True):
        best = min(fractions, key=lambda f: abs(f - target))
        assert got == pytest.approx(best), "the cut is the block boundary closest to the target"
        assert abs(got - target) < 0.1, f"{config}: exit at {got:.3f} of FLOPs, target {target:.3f}"
    assert model.backbone_fractions[2] == pytest.approx(1.0)
    # by FLOPs, not by layer count: the segment FLOPs add up to the backbone plus the heads
    assert sum(model.segment_flops) > sum(s.flops for s in shapes)


def test_exit_fractions_follow_the_spec() -> None:
    early = ThreeExitVGG(ArchSpec(config="vgg16", width=0.25, input_size=64, exit_fractions=(0.2, 0.5)))
    assert early.backbone_fractions[0] < 0.3 and 0.4 < early.backbone_fractions[1] < 0.6


def test_joint_loss_applies_the_weights() -> None:
    torch.manual_seed(0)
    logits = [torch.randn(8, 11) for _ in range(3)]
    y = torch.randint(0, 11, (8,))
    ce = [torch.nn.functional.cross_entropy(lg, y) for lg in logits]
    assert joint_loss(logits, y, (0.3, 0.3, 1.0)).item() == pytest.approx((0.3 * ce[0] + 0.3 * ce[1] + ce[2]).item())
    assert joint_loss(logits, y, (0.0, 0.0, 1.0)).item() == pytest.approx(ce[2].item())
    with pytest.raises(ValueError, match="3 exits but 2"):
        joint_loss(logits, y, (1.0, 1.0))


def test_zero_weight_leaves_that_head_untrained() -> None:
    model = ThreeExitVGG(ArchSpec(config="vgg11", width=0.125, input_size=32))
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 11, (4,))
    joint_loss(model(x), y, (0.0, 1.0, 1.0)).backward()
    head1 = model.segments[0].head.fc.weight.grad
    assert head1 is not None and torch.count_nonzero(head1) == 0
    assert torch.count_nonzero(model.segments[1].head.fc.weight.grad) > 0


def test_short_training_reduces_the_loss(demo_data_dir) -> None:  # type: ignore[no-untyped-def]
    from torch.utils.data import Subset

    from exporter.datasets import demo_split_dataset

    ds, names = demo_split_dataset(demo_data_dir / "train.npz")
    model = ThreeExitVGG(ArchSpec(config="vgg11", width=0.125, input_size=96, num_classes=len(names)))
    lines: list[str] = []
    small = Subset(ds, range(64))  # a model this size can fit 64 frames in a few epochs
    result = train(model, small, TrainConfig(epochs=10, batch_size=32, lr=3e-3, max_shift=0, threads=2),
                   progress=lines.append)
    first, last = result.history[0].loss, result.history[-1].loss
    assert last < 0.9 * first, f"loss went {first:.3f} -> {last:.3f}"
    assert any("exit1=" in ln and "loss=" in ln for ln in lines), "progress shows loss and per-exit accuracy"


class _Interrupted(Exception):
    pass


def test_an_interrupted_run_keeps_its_finished_epochs(demo_data_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from exporter.demo_data import RECIPE
    from exporter.pipeline import TrainOptions, load_checkpoint, train_checkpoint

    out = tmp_path / "vgg.pt"
    opts = TrainOptions(ArchSpec(config="vgg11", width=0.125, input_size=96),
                        TrainConfig(epochs=3, batch_size=32, max_steps=2, threads=2))

    def stop_in_epoch_two(line: str) -> None:
        if line.startswith("epoch 2/3"):
            raise _Interrupted(line)

    with pytest.raises(_Interrupted):
        train_checkpoint(demo_data_dir, out, opts, progress=stop_in_epoch_two)
    _, ckpt = load_checkpoint(out)
    assert len(ckpt["history"]) == 1 and ckpt["lineage"][-1]["epochs_completed"] == 1
    assert not out.with_name(out.name + ".partial").exists()
    train_checkpoint(demo_data_dir, out, opts, progress=lambda _: None)
    _, ckpt = load_checkpoint(out)
    assert len(ckpt["history"]) == 3 and "epochs_completed" not in ckpt["lineage"][-1]
    assert ckpt["lineage"][-1]["recipe"] == RECIPE  # provenance: how the demo frames were drawn
