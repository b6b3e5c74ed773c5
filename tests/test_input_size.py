"""Other input sizes and the training device: demo frames drawn at any multiple of 32, a model whose input size
follows its data, fine-tuning a checkpoint at a new input size, and CUDA training (skipped without a GPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the train extra")

from exporter.__main__ import main as exporter_main  # noqa: E402
from exporter.pipeline import ExportError, TrainOptions, load_checkpoint, score_checkpoints, train_checkpoint  # noqa: E402
from exporter.train import DeviceError, TrainConfig, resolve_device  # noqa: E402
from exporter.vgg import ArchSpec  # noqa: E402

MNIST_CACHE = Path(__file__).resolve().parents[1] / "data" / "cache"


@pytest.fixture(scope="module")
def data64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo64")
    assert exporter_main(["data", "--size", "64", "--count", "128", "32", "32", "--seed", "2", "--shards", "2",
                          "--cache", str(MNIST_CACHE), "--out", str(out)]) == 0
    return out


def test_frames_are_drawn_at_the_size_asked(data64: Path, demo_digits: list[np.ndarray]) -> None:
    from exporter.demo_data import make_split

    with np.load(data64 / "train.npz") as z:
        assert z["images"].shape == (128, 64, 64, 3) and int(z["shards"]) == 2  # drawn in two processes
    with np.load(data64 / "test.npz") as z:
        assert z["images"].shape == (32, 64, 64, 3) and int(z["shards"]) == 1
    big = make_split("test", 12, demo_digits, seed=3, size=192)
    assert big.images.shape == (12, 192, 192, 3)
    # the same kind of scene with more pixels: lighting and noise are drawn the same way, so the mean brightness of
    # many frames is about the same at every size
    small = make_split("test", 12, demo_digits, seed=3, size=96)
    assert abs(float(big.images.mean()) - float(small.images.mean())) < 25
    with pytest.raises(ValueError, match="too small"):
        make_split("test", 1, demo_digits, size=16)


def test_a_size_no_model_can_take_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert exporter_main(["data", "--size", "100", "--count", "1", "1", "1", "--out", str(tmp_path)]) == 2
    assert "--size 100" in capsys.readouterr().err and not (tmp_path / "train.npz").exists()


def test_training_takes_its_input_size_from_the_frames_and_fine_tunes_across_sizes(
        data64: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    start, _ = load_checkpoint(tiny_checkpoint)
    assert start.spec.input_size == 96
    opts = TrainOptions(start.spec, TrainConfig(epochs=1, batch_size=32, max_steps=2, threads=2, workers=1),
                        size_from_data=True)  # a worker process prepares the batches
    out = tmp_path / "at64.pt"
    train_checkpoint(data64, out, opts, progress=lambda _: None, init=tiny_checkpoint)
    model, ckpt = load_checkpoint(out)
    assert model.spec.input_size == 64 and ckpt["lineage"][-1]["fine_tuned_from"] == str(tiny_checkpoint)
    assert ckpt["train_config"]["device"] == "cpu" and ckpt["train_config"]["workers"] == 1
    # two steps from the 96 px weights, not from scratch: every tensor is still close to where it started
    before, after = start.state_dict(), model.state_dict()
    for name, w in after.items():
        if w.is_floating_point() and w.dim() > 1:
            assert torch.nn.functional.cosine_similarity(w.flatten(), before[name].flatten(), dim=0) > 0.9, name
    # and it exports and runs like any model: the runtime resizes a camera frame to its 64 px input
    from exporter.pipeline import export_checkpoint
    from models.runtime import ModelRuntime

    export_checkpoint(out, data64, tmp_path / "model64")
    rt = ModelRuntime.load(tmp_path / "model64", providers=("cpu",), warmup=1)
    assert rt.manifest.input.height == 64
    probs = rt.all_exits(np.zeros((480, 640, 3), np.uint8))
    assert probs.shape == (3, 11) and np.allclose(probs.sum(-1), 1, atol=1e-3)


def test_frames_of_the_wrong_size_are_named(data64: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    opts = TrainOptions(ArchSpec(config="vgg11", width=0.125, input_size=96),
                        TrainConfig(epochs=1, batch_size=32, max_steps=1, threads=2))
    with pytest.raises(ExportError, match=r"train\.npz: its frames are 64 px, the model takes 96 px.*--size 96"):
        train_checkpoint(data64, tmp_path / "x.pt", opts, progress=lambda _: None)
    with pytest.raises(ExportError, match="its frames are 64 px"):
        score_checkpoints([tiny_checkpoint], data64, ("test",))
    table = score_checkpoints([tiny_checkpoint], data64, ("test",), input_size=64)
    assert str(tiny_checkpoint) in table and "%" in table


def test_device_names() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceError, match="choose auto, cpu"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="sees no CUDA GPU"):
            resolve_device("cuda")


def test_train_cli_refuses_cuda_without_a_gpu(data64: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    rc = exporter_main(["train", "--data", str(data64), "--device", "cuda", "--epochs", "1",
                        "--out", str(tmp_path / "x.pt")])
    assert rc == 2 and "sees no CUDA GPU" in capsys.readouterr().err and not (tmp_path / "x.pt").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch here")
def test_training_on_cuda_saves_a_cpu_checkpoint(data64: Path, tmp_path: Path) -> None:
    opts = TrainOptions(ArchSpec(config="vgg11", width=0.125, input_size=64),
                        TrainConfig(epochs=1, batch_size=32, max_steps=3, threads=2, device="cuda"))
    model = train_checkpoint(data64, tmp_path / "cuda.pt", opts, progress=lambda _: None)
    assert next(model.parameters()).device.type == "cpu"
    _, ckpt = load_checkpoint(tmp_path / "cuda.pt")
    assert ckpt["train_config"]["device"] == "cuda"
    assert all(v.device.type == "cpu" for v in ckpt["state_dict"].values())
