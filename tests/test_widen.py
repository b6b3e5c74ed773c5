"""Widening a checkpoint (Net2WiderNet): a wider network of the same config that computes what the narrow one did."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the train extra")

from exporter.__main__ import main as exporter_main  # noqa: E402
from exporter.pipeline import TrainOptions, load_checkpoint, train_checkpoint  # noqa: E402
from exporter.train import TrainConfig  # noqa: E402
from exporter.vgg import ArchSpec, ThreeExitVGG  # noqa: E402
from exporter.widen import WidenError, widen_model  # noqa: E402

pytestmark = pytest.mark.train


def _trained_looking(spec: ArchSpec, seed: int) -> ThreeExitVGG:
    """A network with non-trivial batch-norm parameters and statistics (fresh ones are 1 and 0, which would hide a
    wrong copy)."""
    torch.manual_seed(seed)
    model = ThreeExitVGG(spec)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
            m.running_mean.uniform_(-0.3, 0.3)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize("config,old,new", [("vgg11", 0.125, 0.25), ("vgg13", 0.125, 0.3), ("vgg16", 0.125, 0.2)])
def test_widened_network_computes_the_same_logits(config: str, old: float, new: float) -> None:
    narrow = _trained_looking(ArchSpec(config=config, width=old, input_size=64), seed=0)
    wide = widen_model(narrow, new, noise=0.0)
    assert wide.spec.width == new and wide.spec.config == config
    assert wide.segment_flops[2] > narrow.segment_flops[2] * (new / old) ** 2 * 0.8  # it really is wider
    assert [len(s.body) for s in wide.segments] == [len(s.body) for s in narrow.segments]  # exits stay in place
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(narrow(x), wide(x), strict=True):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_noise_breaks_the_replicas_symmetry_but_keeps_the_function_close() -> None:
    narrow = _trained_looking(ArchSpec(config="vgg11", width=0.125, input_size=64), seed=1)
    wide = widen_model(narrow, 0.25, noise=0.01, seed=3)
    first_old, first_new = narrow.segments[0].body[0], wide.segments[0].body[0]
    assert isinstance(first_old, torch.nn.Conv2d) and isinstance(first_new, torch.nn.Conv2d)
    n = first_old.out_channels
    torch.testing.assert_close(first_new.weight[:n], first_old.weight)  # the original channels keep their filters
    # every added channel is a noisy copy of an old one, never an exact one
    for j in range(n, first_new.out_channels):
        dist = (first_old.weight - first_new.weight[j]).detach().flatten(1).abs().amax(1)
        assert dist.min() > 0 and dist.min() < 0.1 * float(first_old.weight.detach().abs().max())
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        final_narrow, final_wide = narrow(x)[2], wide(x)[2]
    assert float((final_wide - final_narrow).abs().max()) < 0.1 * float(final_narrow.abs().max())
    assert not torch.equal(final_wide, final_narrow)


def test_widening_refuses_to_shrink_or_negative_noise() -> None:
    narrow = _trained_looking(ArchSpec(config="vgg11", width=0.25, input_size=64), seed=2)
    with pytest.raises(WidenError, match="needs a larger one"):
        widen_model(narrow, 0.125)
    with pytest.raises(WidenError, match="noise"):
        widen_model(narrow, 0.5, noise=-1.0)


def test_widen_command_writes_a_checkpoint_that_fine_tunes(tiny_checkpoint: Path, demo_data_dir: Path,
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wide.pt"
    assert exporter_main(["widen", "--checkpoint", str(tiny_checkpoint), "--width", "0.25", "--out", str(out)]) == 0
    assert "train --init" in capsys.readouterr().out
    wide, ckpt = load_checkpoint(out)
    assert wide.spec.width == 0.25 and ckpt["lineage"][-1]["method"] == "Net2WiderNet"
    assert ckpt["lineage"][-1]["width"] == [0.125, 0.25]
    assert ckpt["history"] == load_checkpoint(tiny_checkpoint)[1]["history"]  # it keeps what trained it
    tuned = tmp_path / "tuned.pt"
    opts = TrainOptions(wide.spec, TrainConfig(epochs=1, batch_size=32, max_steps=2, threads=2))
    train_checkpoint(demo_data_dir, tuned, opts, progress=lambda _: None, init=out)
    assert load_checkpoint(tuned)[1]["lineage"][-2]["method"] == "Net2WiderNet"
    # a width below the checkpoint's is refused with the file's name
    assert exporter_main(["widen", "--checkpoint", str(tiny_checkpoint), "--width", "0.1", "--out",
                          str(tmp_path / "narrow.pt")]) == 2
    err = capsys.readouterr().err
    assert str(tiny_checkpoint) in err and "larger" in err
