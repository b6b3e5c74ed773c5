"""The demo data recipe: splits disjoint by digit and by photo, deterministic, training-only steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.live import MNIST_CACHE

from exporter import demo_data


def test_no_photo_is_in_two_splits() -> None:
    seen: dict[str, str] = {}
    for split, names in demo_data.BACKGROUND_SPLITS.items():
        for name in names:
            assert name not in seen, f"{name} is in both {seen[name]} and {split}"
            seen[name] = split
    assert set(demo_data.BACKGROUND_SPLITS) == set(demo_data.SPLITS)


def test_no_digit_sample_is_in_two_splits(demo_digits: list[np.ndarray]) -> None:
    ids = {s: demo_data.make_split(s, 300, demo_digits) for s in demo_data.SPLITS}
    for a in demo_data.SPLITS:
        for b in demo_data.SPLITS:
            if a < b:
                for cls in range(10):
                    da = set(ids[a].digit_ids[ids[a].labels == cls])
                    db = set(ids[b].digit_ids[ids[b].labels == cls])
                    assert not da & db, f"class {cls}: digits {sorted(da & db)[:5]} in both {a} and {b}"
    assert all(((s.labels == demo_data.NO_DIGIT) == (s.digit_ids == -1)).all() for s in ids.values())


@pytest.mark.parametrize("knob", ["TRAIN_CLUTTER_P", "TRAIN_RESHAPE_P", "TRAIN_OBJECTS_P"])
def test_training_only_steps_touch_the_training_split_only(demo_digits: list[np.ndarray], knob: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with_clutter = {s: demo_data.make_split(s, 40, demo_digits) for s in ("train", "test")}
    monkeypatch.setattr(demo_data, knob, 0.0)
    without = {s: demo_data.make_split(s, 40, demo_digits) for s in ("train", "test")}
    # test (and calibration) frames are drawn exactly as before, so accuracies across recipes compare
    assert np.array_equal(with_clutter["test"].images, without["test"].images)
    assert not np.array_equal(with_clutter["train"].images, without["train"].images)


def test_every_listed_photo_loads() -> None:
    for split, names in demo_data.BACKGROUND_SPLITS.items():
        photos = demo_data.load_backgrounds(names)
        assert all(p.ndim == 3 and p.shape[2] == 3 and min(p.shape[:2]) >= 96 for p in photos), split


def test_recipes_change_training_frames_only(demo_digits: list[np.ndarray]) -> None:
    by_recipe = {r: {s: demo_data.make_split(s, 40, demo_digits, recipe=r) for s in demo_data.SPLITS}
                 for r in demo_data.RECIPES}
    skimage_only = sum(not n.startswith("mpl:") for n in demo_data.BACKGROUND_SPLITS["train"])
    for r in demo_data.RECIPES:
        for split in ("calibration", "test"):
            assert np.array_equal(by_recipe[r][split].images, by_recipe[demo_data.RECIPE][split].images)
            assert demo_data.background_names(split, r) == demo_data.BACKGROUND_SPLITS[split]
        if r != demo_data.RECIPE:
            assert not np.array_equal(by_recipe[r]["train"].images, by_recipe[demo_data.RECIPE]["train"].images)
        names = demo_data.background_names("train", r)
        if r < 4:  # matplotlib's photos joined with recipe 4; before it the training split drew from scikit-image's
            assert len(names) == skimage_only and by_recipe[r]["train"].backgrounds.max() < skimage_only
        generated = [n for n in names if n.startswith("proc:")]  # and the generated textures with recipe 5
        assert len(generated) == (demo_data.PROCEDURAL_TEXTURES if r >= 5 else 0)
    with pytest.raises(ValueError, match="unknown recipe 6"):
        demo_data.make_split("train", 1, demo_digits, recipe=6)


def test_generated_textures_are_deterministic_and_varied() -> None:
    textures = demo_data.load_backgrounds(tuple(f"proc:{i}" for i in range(demo_data.PROCEDURAL_TEXTURES)))
    assert all(t.shape == (384, 384, 3) and t.dtype == np.uint8 for t in textures)
    assert np.array_equal(textures[5], demo_data.procedural_texture(5))  # a pure function of the index
    assert all(t.std() > 5 for t in textures)  # none is a flat colour
    means = np.array([t.reshape(-1, 3).mean(0) for t in textures])
    assert len({tuple(np.round(m)) for m in means}) == len(textures)  # no two alike


def test_a_missing_photo_is_named() -> None:
    with pytest.raises(demo_data.DemoDataError, match=r"mpl:nope\.png is missing"):
        demo_data.load_backgrounds(("mpl:nope.png",))


def test_a_split_is_a_pure_function_of_its_seed(demo_digits: list[np.ndarray]) -> None:
    a, b = demo_data.make_split("calibration", 30, demo_digits), demo_data.make_split("calibration", 30, demo_digits)
    c = demo_data.make_split("calibration", 30, demo_digits, seed=1)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.images, c.images)


def test_unknown_split_is_refused(demo_digits: list[np.ndarray]) -> None:
    with pytest.raises(ValueError, match="unknown split 'val'"):
        demo_data.make_split("val", 1, demo_digits)


def test_a_redrawn_digit_is_a_new_glyph_in_range(demo_digits: list[np.ndarray]) -> None:
    rng = np.random.default_rng(3)
    glyph = demo_digits[4][0]
    redrawn = [demo_data._reshape_digit(rng, glyph) for _ in range(8)]
    for r in redrawn:
        assert r.shape == glyph.shape and r.dtype == np.float32
        assert r.min() >= 0.0 and r.max() <= 1.0 and r.sum() > 0.3 * glyph.sum()  # still ink, not erased
    assert sum(not np.allclose(r, glyph, atol=0.05) for r in redrawn) >= 6


def test_a_split_can_draw_another_splits_digits(demo_digits: list[np.ndarray]) -> None:
    own = demo_data.make_split("test", 80, demo_digits)
    seen = demo_data.make_split("test", 80, demo_digits, digit_split="train")
    assert np.array_equal(own.labels, seen.labels)  # the same frames to draw, the same test photos
    assert set(seen.backgrounds) <= set(range(len(demo_data.BACKGROUND_SPLITS["test"])))
    for cls in range(10):
        n = len(demo_digits[cls])  # shares of each class's digits: train [0, 70 %), test [85 %, 100 %)
        assert (seen.digit_ids[seen.labels == cls] < int(0.70 * n)).all()
        assert (own.digit_ids[own.labels == cls] >= int(0.85 * n)).all()


@pytest.mark.train
def test_diagnose_reads_accuracy_by_photo_and_by_digit_share(tiny_model_folder: Path, demo_data_dir: Path) -> None:
    from exporter.diagnose import per_photo, seen_vs_unseen

    table = per_photo(tiny_model_folder, demo_data_dir)
    rows = table.splitlines()
    assert all(any(r.split()[1] == photo for r in rows) for photo in demo_data.BACKGROUND_SPLITS["test"])
    with np.load(tiny_model_folder / "traces_test.npz") as z:
        final = (z["probs"][:, -1].argmax(-1) == z["labels"]).mean()
    all_row = next(r for r in rows if r.split()[:2] == ["clean", "all"])
    assert float(all_row.split()[-1].rstrip("%")) == pytest.approx(100 * final, abs=0.01)
    counts = [int(r.split()[2]) for r in rows if r.startswith("clean") and r.split()[1] != "all"]
    assert sum(counts) == int(all_row.split()[2])  # every test frame is on exactly one photo
    lines = seen_vs_unseen(tiny_model_folder, MNIST_CACHE, count=24).splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == ["seen", "unseen"]


@pytest.mark.train
def test_ensemble_reads_the_last_two_exits(tiny_model_folder: Path, demo_data_dir: Path) -> None:
    from exporter.diagnose import last_exits_ensemble

    lines = last_exits_ensemble(tiny_model_folder, demo_data_dir / "calibration.npz", weights=(0.0, 0.5, 1.0)
                                ).splitlines()
    with np.load(tiny_model_folder / "traces_calibration.npz") as z:
        probs, labels = z["probs"], z["labels"]
    acc = (probs.argmax(-1) == labels[:, None]).mean(axis=0)
    assert f"exit 2 alone {acc[1]:.2%}" in lines[0] and f"exit 3 alone (w = 0) {acc[2]:.2%}" in lines[0]
    rows = {float(r.split()[0]): [float(v.rstrip("%")) for v in r.split()[1:]] for r in lines[2:]}
    assert rows[0.0] == pytest.approx([100 * acc[2]] * 2, abs=0.01)  # w = 0: the final exit alone
    assert rows[1.0][1] == pytest.approx(100 * acc[1], abs=0.01)  # arithmetic, w = 1: exit 2 alone
    both = np.log(probs[:, 2]) + 0.5 * np.log(probs[:, 1])
    assert rows[0.5][0] == pytest.approx(100 * (both.argmax(-1) == labels).mean(), abs=0.01)


def test_a_sharded_split_is_its_shards_drawn_apart_and_joined(demo_digits: list[np.ndarray]) -> None:
    sharded = demo_data.draw_sharded("train", 7, demo_digits, seed=4, reshape_p=None, recipe=demo_data.RECIPE,
                                     size=64, shards=2)
    first = demo_data.make_split("train", 4, demo_digits, seed=4, size=64, shard=0)
    second = demo_data.make_split("train", 3, demo_digits, seed=4, size=64, shard=1)
    assert np.array_equal(sharded.images, np.concatenate([first.images, second.images]))
    assert np.array_equal(sharded.labels, np.concatenate([first.labels, second.labels]))
    assert not np.array_equal(first.images[:3], second.images)  # independent streams, not one drawn twice
    plain = demo_data.make_split("train", 4, demo_digits, seed=4, size=64)
    assert not np.array_equal(plain.images, first.images)
    with pytest.raises(ValueError, match="at least 1"):
        demo_data.draw_sharded("train", 7, demo_digits, 4, None, demo_data.RECIPE, 64, shards=0)
