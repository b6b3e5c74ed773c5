"""A taught model fits its exit 0 from its own recordings: the recordings played in time order as a camera shows a
scene that changes state, through the exported model, and the report says what the policy as served (exit 0
included) does on the held-out blocks and the check recordings, in time order."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from edge_app.teach.jobs import missing_train_extra
from edge_app.teach.store import DatasetStore
from exporter.teach_clips import CLIPS_CHECK, play_order, recording_fps
from models.folder import CLIPS_CALIBRATION, CLIPS_TEST, load_clips, policy_meta
from models.manifest import read_manifest
from models.policy_store import load_policy
from models.video_fit import smoother_for
from models.video_replay import replay_index

REPO = Path(__file__).resolve().parents[1]


def test_the_play_order_shows_every_frame_once_each_class_in_time_order_entered_twice() -> None:
    ids = [f"{1_000_000_000_000 + 100 * i:013d}-{i:06x}" for i in range(30)]
    labels = np.array([i % 3 for i in range(30)])  # interleaved on purpose: the order comes from the ids
    order = play_order(ids, labels)
    assert sorted(order.tolist()) == list(range(30))
    shown = labels[order]
    runs = [int(shown[0])] + [int(b) for a, b in itertools.pairwise(shown) if a != b]
    assert runs == [0, 1, 2, 1, 2, 0], runs  # first halves in class order, second halves rotated
    for c in range(3):
        mine = [ids[i] for i in order if labels[i] == c]
        assert mine == sorted(mine), "a class's frames play in time order"
    assert recording_fps(ids, labels) == pytest.approx(1000 / 300, abs=0.01)  # a class's frames are 300 ms apart


def _scene(state: int, t: int, rng: np.random.Generator) -> np.ndarray:
    """A fixed camera's 64 x 64 view: a grey wall with a box whose place is the state, sensor noise, slow light."""
    img = np.full((64, 64, 3), 110.0)
    x = 8 + 20 * state
    img[20:44, x:x + 14] = (200, 60, 40)
    img *= 1.0 + 0.05 * np.sin(t / 40)
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


@pytest.mark.slow
def test_a_taught_model_fits_exit_0_on_its_recordings_and_reports_it_as_served(tmp_path: Path) -> None:
    if missing_train_extra():
        pytest.skip(f"needs the train extra ({missing_train_extra()})")
    from exporter.teach import teach

    store = DatasetStore(tmp_path / "datasets", block_s=2.0)
    store.create("shelf")
    rng = np.random.default_rng(0)
    t = 1_700_000_000.0
    for state, cls in enumerate(("left", "middle", "right")):
        store.add_class("shelf", cls)
        for i in range(150):  # 15 s at 10 fps: blocks of 2 s dealt out (5 train, 1 calibration, 1 test)
            store.add_frame("shelf", cls, _scene(state, i, rng), "camera:shelf", t, recording=f"r-{cls}")
            t += 0.1
        t += 5.0
    for state, cls in enumerate(("left", "middle", "right")):
        for i in range(30):
            store.add_frame("shelf", cls, _scene(state, 200 + i, rng), "camera:shelf", t, role="check",
                            recording=f"c-{cls}")
            t += 0.1
    counts = store.materialize("shelf", tmp_path / "data")
    out = tmp_path / "models" / "shelf-1"
    done = teach(tmp_path / "data", REPO / "models" / "default", out, epochs=6, threads=2)

    manifest = read_manifest(out)
    assert {CLIPS_CALIBRATION, CLIPS_TEST, CLIPS_CHECK} <= set(manifest.traces)
    clips = load_clips(out, manifest, CLIPS_CALIBRATION)
    trained = sum(counts["train"].values()) + sum(counts["calibration"].values())
    assert len(clips.labels) == trained and clips.fps == pytest.approx(10.0, rel=0.05)
    assert len(clips.changes()) == 5  # three classes, each entered twice
    policy = load_policy(out, len(manifest.exits))
    assert policy.exit0 is not None, "the taught policy has exit 0"
    costs = np.asarray(manifest.costs_ms) / sum(manifest.costs_ms)
    assert policy_meta(out)["video"]["clips"] == CLIPS_CALIBRATION

    served = done["served"]
    assert set(served) == {CLIPS_TEST, CLIPS_CHECK}
    for name, frames in ((CLIPS_TEST, sum(counts["test"].values())), (CLIPS_CHECK, 90)):
        s = served[name]
        assert s["frames"] == frames and sum(s["exits_used"]) == frames, s  # every frame answered, once
        assert s["changes"] == 5 and s["changes_noticed"] == 5, s
        # what the report shows is what the policy as saved does on the clips as saved
        run = replay_index(policy, load_clips(out, manifest, name), costs, smoother_for(manifest))
        assert s["exits_used"] == [int((run.exit == k).sum()) for k in range(4)], (s, name)
        assert s["accuracy"] == round(run.accuracy, 4) and s["exit0_share"] == round(run.exit0_share, 4)
    # whether exit 0 answers is the fit's choice on the calibration clips (the index with exit 0 at the cheapest lam
    # and hold within a point of full depth that notices changes within 3 frames at p95); the report says it
    video = policy_meta(out)["video"]
    assert video["exit0_share"] == pytest.approx(
        replay_index(policy, clips, costs, smoother_for(manifest)).exit0_share), video
    assert done["policy"]["recording_clips"][CLIPS_CALIBRATION]["frames"] == trained
    assert (out / "report.json").is_file()
