"""Averaging checkpoints fine-tuned from one start: the mean of their weights, batch norms re-derived on frames."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="needs the train extra")

from exporter.pipeline import (  # noqa: E402
    ExportError,
    TrainOptions,
    average_checkpoints,
    load_checkpoint,
    load_dataset,
    score_checkpoints,
    train_checkpoint,
)
from exporter.train import TrainConfig  # noqa: E402

pytestmark = pytest.mark.train


def _fine_tune(start: Path, demo_data_dir: Path, out: Path, seed: int, init: Path | None = None) -> Path:
    model, _ = load_checkpoint(start)
    opts = TrainOptions(model.spec, TrainConfig(epochs=1, batch_size=32, max_steps=3, threads=2, seed=seed))
    train_checkpoint(demo_data_dir, out, opts, progress=lambda _: None, init=init)
    return out


def test_average_is_the_mean_with_fresh_batch_norm_statistics(tiny_checkpoint: Path, demo_data_dir: Path,
                                                              tmp_path: Path) -> None:
    a = _fine_tune(tiny_checkpoint, demo_data_dir, tmp_path / "a.pt", seed=1, init=tiny_checkpoint)
    b = _fine_tune(tiny_checkpoint, demo_data_dir, tmp_path / "b.pt", seed=2, init=tiny_checkpoint)
    out = tmp_path / "soup.pt"
    average_checkpoints([a, b], demo_data_dir, out, bn_frames=128)
    soup, ckpt = load_checkpoint(out)
    sa, sb, ss = load_checkpoint(a)[0].state_dict(), load_checkpoint(b)[0].state_dict(), soup.state_dict()
    weights = [k for k in ss if k.endswith(".weight")]
    assert weights and any(not torch.equal(sa[k], sb[k]) for k in weights)  # the ingredients do differ
    for k in weights:
        torch.testing.assert_close(ss[k], (sa[k] + sb[k]) / 2)
    # every batch norm's running statistics are those of its input on the 128 frames, under the averaged weights
    frames, _, _ = load_dataset(demo_data_dir, "train", 96)
    x = torch.stack([frames[i][0] for i in range(128)])
    norms = [m for m in soup.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    seen: dict[int, Any] = {}

    def record(m: Any, args: tuple[Any, ...]) -> None:
        seen[id(m)] = args[0].mean((0, 2, 3))

    hooks = [bn.register_forward_pre_hook(record) for bn in norms]
    with torch.no_grad():
        soup.eval()
        soup(x)
    for h in hooks:
        h.remove()
    for bn in norms:
        torch.testing.assert_close(bn.running_mean, seen[id(bn)], atol=1e-4, rtol=1e-3)
    assert len(ckpt["lineage"]) == 2  # the shared start, then the average naming each ingredient's own step
    assert [i["checkpoint"] for i in ckpt["lineage"][-1]["averaged"]] == [str(a), str(b)]
    assert [i["steps"][0]["seed"] for i in ckpt["lineage"][-1]["averaged"]] == [1, 2]
    # training time counts the shared start once: a's history and b's both begin with tiny_checkpoint's epoch
    ha, hb = load_checkpoint(a)[1]["history"], load_checkpoint(b)[1]["history"]
    assert len(ha) == len(hb) == 2 and ha[0] == hb[0]
    assert ckpt["train_seconds"] == pytest.approx(ha[0]["seconds"] + ha[1]["seconds"] + hb[1]["seconds"], abs=0.1)
    assert score_checkpoints([out, a], demo_data_dir).count(str(out)) == 2  # scored like any checkpoint


def test_unrelated_or_mismatched_checkpoints_are_refused(tiny_checkpoint: Path, demo_data_dir: Path,
                                                         tmp_path: Path) -> None:
    scratch = _fine_tune(tiny_checkpoint, demo_data_dir, tmp_path / "scratch.pt", seed=5)  # no --init: from scratch
    with pytest.raises(ExportError, match="share no training step"):
        average_checkpoints([tiny_checkpoint, scratch], demo_data_dir, tmp_path / "x.pt")
    from exporter.vgg import ArchSpec

    wide = tmp_path / "wide.pt"
    train_checkpoint(demo_data_dir, wide, TrainOptions(ArchSpec(config="vgg11", width=0.25, input_size=96),
                                                      TrainConfig(epochs=1, batch_size=32, max_steps=1, threads=2)),
                     progress=lambda _: None)
    with pytest.raises(ExportError, match="only one architecture"):
        average_checkpoints([tiny_checkpoint, wide], demo_data_dir, tmp_path / "x.pt")
    with pytest.raises(ExportError, match="at least two"):
        average_checkpoints([tiny_checkpoint], demo_data_dir, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()
