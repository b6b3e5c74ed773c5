"""A model folder turns back into a trainable checkpoint: same outputs, batch norms that train sensibly."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the train extra")

from exporter.onnx_export import PARITY_ATOL  # noqa: E402
from exporter.pipeline import TrainOptions, load_checkpoint, load_dataset, train_checkpoint  # noqa: E402
from exporter.recover import RecoverError, recover_checkpoint  # noqa: E402
from exporter.train import TrainConfig  # noqa: E402

pytestmark = pytest.mark.train


def test_recovered_checkpoint_computes_the_exported_model(tiny_checkpoint: Path, tiny_model_folder: Path,
                                                          demo_data_dir: Path, tmp_path: Path) -> None:
    frames, _, _ = load_dataset(demo_data_dir, "train", 96)
    out = tmp_path / "recovered.pt"
    _, err = recover_checkpoint(tiny_model_folder, frames, out)
    assert err <= PARITY_ATOL
    original, _ = load_checkpoint(tiny_checkpoint)
    recovered, ckpt = load_checkpoint(out)
    assert recovered.spec == original.spec
    assert ckpt["lineage"][-1]["recovered_from"] == str(tiny_model_folder)
    x = torch.stack([frames[i][0] for i in range(32)])
    with torch.no_grad():
        for a, b in zip(original(x), recovered(x), strict=True):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3)
        # in train mode the batch norms normalise with batch statistics: close to the eval-mode outputs, not the
        # wild rescaling an identity batch norm (mean 0, var 1) would give on these un-normalised activations
        eval_logits = recovered(x)[-1]
        recovered.train()
        for m in recovered.modules():  # dropout off, so only the batch norms differ from eval mode
            if isinstance(m, torch.nn.Dropout):
                m.eval()
        train_logits = recovered(x)[-1]
    agree = (eval_logits.argmax(-1) == train_logits.argmax(-1)).float().mean().item()
    assert agree >= 0.9


def test_recovered_checkpoint_fine_tunes(tiny_model_folder: Path, demo_data_dir: Path, tmp_path: Path) -> None:
    frames, _, _ = load_dataset(demo_data_dir, "train", 96)
    start = tmp_path / "recovered.pt"
    model, _ = recover_checkpoint(tiny_model_folder, frames, start)
    opts = TrainOptions(model.spec, TrainConfig(epochs=1, batch_size=32, max_steps=3, threads=2))
    out = tmp_path / "next.pt"
    train_checkpoint(demo_data_dir, out, opts, progress=lambda _: None, init=start)
    _, ckpt = load_checkpoint(out)
    assert ckpt["lineage"][-1]["fine_tuned_from"] == str(start)
    assert any("recovered_from" in step for step in ckpt["lineage"])


def test_a_damaged_folder_is_named(tiny_model_folder: Path, demo_data_dir: Path, tmp_path: Path) -> None:
    frames, _, _ = load_dataset(demo_data_dir, "calibration", 96)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_folder, broken)
    (broken / "segment2.onnx").write_bytes(b"not a model")
    with pytest.raises(RecoverError, match=r"segment2\.onnx"):
        recover_checkpoint(broken, frames, tmp_path / "x.pt")
    (broken / "manifest.json").write_text("{}")
    with pytest.raises(RecoverError, match=r"manifest\.json"):
        recover_checkpoint(broken, frames, tmp_path / "x.pt")


def test_score_reads_each_exit_on_calibration_and_test(tiny_checkpoint: Path, tiny_model_folder: Path,
                                                       demo_data_dir: Path) -> None:
    from exporter.pipeline import ExportError, score_checkpoints

    rows = [r.split() for r in score_checkpoints([tiny_checkpoint, tiny_checkpoint], demo_data_dir).splitlines()[1:]]
    assert [r[1] for r in rows] == ["calibration", "calibration", "test", "test"]
    for split in ("calibration", "test"):  # what the export traced, so the table and the model folder agree
        with np.load(tiny_model_folder / f"traces_{split}.npz") as z:
            acc = (z["probs"].argmax(-1) == z["labels"][:, None]).mean(axis=0)
            one_frame = 100 / len(z["labels"])  # torch (the score) and ONNX Runtime (the traces) may part on a
            # near-tie: one frame either way, at most
        row = next(r for r in rows if r[1] == split)
        assert [float(v.rstrip("%")) for v in row[3:]] == pytest.approx(100 * acc, abs=one_frame + 0.01)
    with pytest.raises(ExportError, match="does not exist"):
        score_checkpoints([demo_data_dir / "none.pt"], demo_data_dir)


def test_score_one_split_from_the_command_line(tiny_checkpoint: Path, demo_data_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.__main__ import main

    assert main(["score", "--checkpoint", str(tiny_checkpoint), "--data", str(demo_data_dir),
                 "--split", "calibration"]) == 0
    rows = [r.split() for r in capsys.readouterr().out.splitlines()[1:]]
    assert [r[1] for r in rows] == ["calibration"]  # a selection split's folder has no test frames worth a row
