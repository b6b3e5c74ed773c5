"""VP8 round trip (PyAV's libvpx) and the policy fitted on VP8-coded traces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edge_app.bench.codec import vp8_roundtrip
from edge_app.bench.testvideo import LabelledVideo
from models.errors import ModelFolderError
from models.folder import trace_names
from models.manifest import read_manifest


def _video(n: int = 12) -> LabelledVideo:
    rng = np.random.default_rng(3)
    # smooth images with some detail: blocks of colour with a bright bar, like a digit on a photo
    imgs = np.repeat(np.repeat(rng.integers(0, 255, (n, 12, 12, 3), np.uint8), 8, 1), 8, 2)
    imgs[:, 30:66, 44:52] = 250
    return LabelledVideo(imgs, np.zeros(n, int), hold=3)


def _mae(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def test_vp8_roundtrip_returns_each_frame_degraded_by_bitrate_and_repeatably() -> None:
    video = _video()
    src = np.stack(list(video.frames()))
    hi = np.stack(list(vp8_roundtrip(video.frames(), 2000)))
    lo = np.stack(list(vp8_roundtrip(video.frames(), 100)))
    assert hi.shape == lo.shape == src.shape  # one decoded frame per frame sent, in order
    assert _mae(src, hi) < 6
    assert _mae(src, lo) > _mae(src, hi) + 1  # fewer bits, more loss: the codec really ran
    # the same frames give the same decoded frames (the speed is fixed, not picked from the wall clock)
    assert np.array_equal(lo, np.stack(list(vp8_roundtrip(video.frames(), 100))))
    with pytest.raises(ValueError, match="kbps"):
        list(vp8_roundtrip(video.frames(), 0))


@pytest.mark.train
def test_codec_traces_are_listed_and_the_policy_is_fitted_on_them(tiny_model_folder: Path,
                                                                  demo_data_dir: Path, tmp_path: Path) -> None:
    from edge_app.bench.codec_traces import write_codec_traces
    from edge_app.config import PolicyConfig
    from edge_app.decision.scheduler import policy_from_config
    from models.policy_store import fit_policy
    from models.runtime import ModelRuntime

    folder = tmp_path / "m"
    shutil.copytree(tiny_model_folder, folder)
    with pytest.raises(ModelFolderError, match="codec-traces"):
        trace_names(read_manifest(folder), "vp8")
    assert trace_names(read_manifest(folder)) == ("calibration", "test")  # auto: clean until coded ones exist

    written = write_codec_traces(folder, demo_data_dir, 250.0, height=240)
    manifest = read_manifest(folder)  # still valid, sha256 of each new file checked
    assert set(written) == {"calibration-vp8", "test-vp8"} <= set(manifest.traces)
    with np.load(folder / "traces_calibration-vp8.npz") as z, np.load(folder / "traces_calibration.npz") as clean:
        assert z["probs"].shape == clean["probs"].shape and np.array_equal(z["labels"], clean["labels"])
        np.testing.assert_allclose(z["probs"].sum(-1), 1.0, atol=1e-4)
        assert np.abs(z["probs"] - clean["probs"]).max() > 1e-5  # other pixels, other outputs (an untrained model)
        codec = json.loads(str(z["codec"]))
        assert codec["kbps"] == 250.0 and codec["height"] == 240

    info = fit_policy(folder, bins=4, target_accuracy=0.05)
    assert info["calibration_traces"] == "calibration-vp8"
    assert json.loads((folder / "policy.json").read_text())["calibration_sha256"] == \
        manifest.traces["calibration-vp8"].sha256
    rt = ModelRuntime.load(folder, warmup=0)
    index = policy_from_config(PolicyConfig(kind="dynamic-index"), rt.folder)  # ("auto" may pick a threshold)
    assert index.lam == pytest.approx(info["lam"])  # loads, sha256 matches
    assert fit_policy(folder, bins=4, target_accuracy=0.05, traces="clean")["calibration_traces"] == "calibration"
