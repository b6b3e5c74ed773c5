"""Checks that mean something: a check recording never reaches training or calibration, a recording is labelled in
spans, a check's wrong frames move to training, a region's square is what capture keeps, captures keep the rate
asked for, and a taught policy's floor keeps it off exit 1 when the check says exit 1 is not good enough."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import cv2
import numpy as np
import pytest
from support.teach import call_json, train_job

from edge_app.config.cameras import check_region
from edge_app.teach.capture import Pace
from edge_app.teach.frames import DatasetError
from edge_app.teach.store import DatasetStore
from models.chain import ChainSolution
from models.policies import DynamicIndex, run_on_trace
from models.preprocess import crop_region, region_box


def _store(tmp_path: Path) -> DatasetStore:
    store = DatasetStore(tmp_path, block_s=2.0)
    store.create("d")
    for cls in ("open", "closed"):
        store.add_class("d", cls)
    return store


def test_a_check_recording_is_never_trained_or_calibrated_on(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rgb = np.zeros((48, 64, 3), np.uint8)
    t = 1000.0
    for cls in ("open", "closed"):
        for _ in range(140):
            store.add_frame("d", cls, rgb, "camera:x", t, recording=f"r-{cls}")
            t += 0.1
        t += 10
    check = [store.add_frame("d", cls, rgb, "camera:x", t + 0.1 * i, role="check", recording=f"c-{cls}")
             for cls in ("open", "closed") for i in range(30)]
    counts = store.check_trainable("d", 20)
    assert {c: v["check"] for c, v in counts.items()} == {"open": 30, "closed": 30}
    written = store.materialize("d", tmp_path / "out")
    on_disk = {s: {p.stem for p in (tmp_path / "out" / s).rglob("*.jpg")} for s in ("train", "calibration", "test",
                                                                                     "check")}
    ids = {f.id for f in check}
    assert on_disk["check"] == ids and len(ids) == 60
    assert not ids & (on_disk["train"] | on_disk["calibration"] | on_disk["test"]), "check frames leaked"
    assert sum(written["check"].values()) == 60 and sum(written["train"].values()) == 200
    summary = store.summary("d")
    assert summary["check"] == {"frames": 60, "classes_without": []}

    # one click adds a check's wrong frames to training: they leave the check and always train
    store.set_role("d", [check[0].id, check[1].id], "train")
    split = store.split(store.frames("d"))
    assert split[check[0].id] == split[check[1].id] == "train" and split[check[2].id] == "check"
    with pytest.raises(DatasetError, match="role 'nope'"):
        store.set_role("d", [check[2].id], "nope")
    with pytest.raises(DatasetError, match="no frame"):
        store.set_role("d", ["missing"], "train")


def test_a_recording_is_labelled_in_spans(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rgb = np.zeros((48, 64, 3), np.uint8)
    frames = [store.add_frame("d", "open", rgb, "camera:x", 1000.0 + 0.1 * i, recording="rec-1") for i in range(100)]
    moved = store.label_span("d", "rec-1", 1004.0, 1007.95, "closed")  # "this part was the gate closed"
    assert len(moved) == 40
    by_id = {f.id: f for f in store.frames("d")}
    assert [by_id[f.id].cls for f in frames] == ["open"] * 40 + ["closed"] * 40 + ["open"] * 20
    assert (tmp_path / "d" / "closed" / f"{frames[50].id}.jpg").is_file()
    assert not (tmp_path / "d" / "open" / f"{frames[50].id}.jpg").exists()
    rec = store.summary("d")["recordings"]
    assert [r["classes"] for r in rec] == [["closed", "open"]]  # type: ignore[index]
    with pytest.raises(DatasetError, match="no frame between"):
        store.label_span("d", "rec-1", 2000.0, 2001.0, "closed")
    with pytest.raises(DatasetError, match="no recording"):
        store.label_span("d", "rec-2", 1000.0, 1001.0, "closed")
    with pytest.raises(DatasetError, match="has no class"):
        store.label_span("d", "rec-1", 1000.0, 1001.0, "ajar")


def test_a_region_is_cut_as_the_square_that_holds_it() -> None:
    frame = np.arange(480 * 640 * 3, dtype=np.uint32).reshape(480, 640, 3).astype(np.uint8)
    assert region_box(480, 640, (0.75, 0.7, 0.2, 0.25)) == (480, 332, 128)  # the square centred on it
    assert region_box(480, 640, (0.8, 0.8, 0.2, 0.2)) == (512, 352, 128)  # moved inside the frame
    assert region_box(480, 640, (0.0, 0.0, 1.0, 1.0)) == (80, 0, 480)  # the whole frame: the centre square
    view = crop_region(frame, (0.5, 0.5, 0.25, 0.25))
    x0, y0, side = region_box(480, 640, (0.5, 0.5, 0.25, 0.25))
    assert view.shape == (side, side, 3) and np.shares_memory(view, frame)
    assert (view == frame[y0 : y0 + side, x0 : x0 + side]).all()
    assert crop_region(frame, None) is frame
    for bad in ([0.9, 0.0, 0.2, 0.5], [0, 0, 0.01, 0.5], [0, 0, 1], "x", [0, 0, True, 1]):
        with pytest.raises(ValueError):
            check_region(bad)


def test_a_capture_keeps_the_rate_asked_for() -> None:
    for camera_fps, asked in ((15, 10), (30, 10), (25, 10), (30, 7), (5, 10), (15, 15)):
        pace = Pace(asked)
        rng = np.random.default_rng(0)
        times = np.arange(0, 20, 1 / camera_fps) + rng.uniform(-0.004, 0.004, int(np.ceil(20 * camera_fps)))
        taken = sum(pace.take(float(t)) for t in times)
        assert abs(taken / 20 - min(asked, camera_fps)) <= 0.3, (camera_fps, asked, taken / 20)


def _index(min_exit: int) -> DynamicIndex:
    """A chain whose calibration said exit 1 is never wrong: sigma lets it stop at once everywhere."""
    sols = [ChainSolution(np.full((k, 1), np.inf) if k == 1 else np.vstack([np.full((k - 1, 1), 10.0),
                                                                           np.full((1, 1), np.inf)]),
                          0.0, np.full((k, 1), 0.001), 0.5) for k in (1, 2, 3)]
    return DynamicIndex(np.zeros((3, 0)), sols, min_exit=min_exit)


def test_a_floor_keeps_a_perfect_calibration_from_stopping_at_exit_1() -> None:
    probs = np.array([[0.9, 0.1], [0.4, 0.6], [0.2, 0.8]])  # exit 1 wrong, exits 2 and 3 right (class 1)
    assert run_on_trace(_index(1), probs, 3) == (1, 0), "without a floor it trusts exit 1"
    ran, choice = run_on_trace(_index(2), probs, 3)
    assert ran == 2 and choice == 1, "with the floor at 2 it runs exit 2 and answers from it"
    assert run_on_trace(_index(3), probs, 3) == (3, 2)
    assert run_on_trace(_index(3), probs, 1) == (1, 0), "a deadline that allows one exit still gets an answer"


@pytest.mark.live
@pytest.mark.slow
async def test_a_cameras_region_is_what_capture_keeps_and_training_learns(
        app_config: Callable[..., Any], serve: Any, camera_frames: Path, tmp_path: Path) -> None:
    """A real RTSP camera with a region: the API reads and moves it, captures keep the region's square (not the
    centre square), and a training job trains on exactly those crops."""
    from edge_app.bench.rtsp_camera import RtspServer, free_port
    from edge_app.bench.scene import render
    from edge_app.teach.jobs import missing_train_extra

    server = RtspServer(camera_frames, free_port(), fps=15, size="640x480")
    server.start()
    region = (0.55, 0.5, 0.4, 0.45)
    cfg = app_config(cameras=[{"name": "door", "url": server.url, "region": list(region)}],
                     training={"data_dir": str(tmp_path / "data"), "models_dir": str(tmp_path / "models"),
                               "epochs": 2})
    try:
        async with serve(cfg) as base, aiohttp.ClientSession() as http:
            status, body = await call_json(http, "GET", f"{base}/api/cameras/door/region")
            assert status == 200 and body["region"] == list(region) and body["config"].startswith("region = ")
            status, body = await call_json(http, "PUT", f"{base}/api/cameras/door/region", {"region": [0.9, 0, 0.5, 1]})
            assert status == 400 and "crosses the frame's edge" in body["error"], body
            assert (await call_json(http, "PUT", f"{base}/api/cameras/nope/region", {"region": None}))[0] == 404
            moved = (0.5, 0.45, 0.45, 0.5)
            status, body = await call_json(http, "PUT", f"{base}/api/cameras/door/region", {"region": list(moved)})
            assert status == 200 and body["region"] == list(moved)
            for _ in range(300):  # the camera streams
                _, st = await call_json(http, "GET", f"{base}/status")
                if st["cameras"][0]["frames_analysed"] > 15:
                    break
                await asyncio.sleep(0.1)
            assert st["cameras"][0]["region"] == list(moved)
            for cls in ("empty", "cat"):
                await call_json(http, "POST", f"{base}/api/datasets", {"name": "gate"})
                await call_json(http, "POST", f"{base}/api/datasets/gate/classes", {"name": cls})
            status, rec = await call_json(http, "POST", f"{base}/api/datasets/gate/classes/cat/capture",
                                      {"source": "camera:door", "seconds": 2, "fps": 10, "wait": True})
            assert status == 200 and rec["saved"] >= 15, rec  # 10 fps from a 15 fps camera: not every other frame
            side = region_box(480, 640, moved)[2]
            store = DatasetStore(tmp_path / "data", 2.0)
            captured = [f for f in store.frames("gate") if f.id in rec["frames"]]
            assert captured and all((f.width, f.height) == (side, side) and f.region == moved for f in captured)
            assert all(f.recording == rec["recording"] for f in captured)
            if missing_train_extra():
                pytest.skip(f"the train extra is not installed ({missing_train_extra()})")

            def filler() -> None:  # the rest of 14 s of each class, cut as the camera's region cuts
                rng = np.random.default_rng(0)
                for k, cls in enumerate(("empty", "cat")):
                    for i in range(140):
                        store.add_frame("gate", cls, np.ascontiguousarray(crop_region(render(cls, rng), moved)),
                                        "camera:door", 1000.0 + 100 * k + 0.1 * i, region=moved)

            await asyncio.to_thread(filler)
            status, job = await call_json(http, "POST", f"{base}/api/training", {"dataset": "gate", "input_size": 100})
            assert status == 400 and "input_size" in job["error"]
            job = await train_job(http, base, {"dataset": "gate", "input_size": 128})  # a larger input
            assert job["state"] == "succeeded", job
            trained = {p.stem: p for p in (tmp_path / "models" / ".data" / job["model"] / "train").rglob("*.jpg")}
            used = [f for f in captured if f.id in trained]
            assert used, "the captured frames are in the training folder"
            for f in used:
                img = cv2.imread(str(trained[f.id]))
                assert img.shape[:2] == (side, side), "training reads the region's square as it was captured"
            assert job["result"]["check"] is None and job["result"]["operating_points"]["on"].startswith("calib")
            assert job["result"]["input_size"] == 128 and len(job["result"]["costs_ms"]) == 3
            _, models = await call_json(http, "GET", f"{base}/api/models")
            assert next(m for m in models["models"] if m["name"] == job["model"])["input_size"] == 128

            # before deploy, a shadow run: the candidate answers the live camera next to the model in use
            status, run = await call_json(http, "POST", f"{base}/api/models/{job['model']}/shadow",
                                      {"source": "camera:door", "seconds": 3})
            assert status == 202, run
            status, body = await call_json(http, "POST", f"{base}/api/models/{job['model']}/shadow",
                                       {"source": "camera:door", "seconds": 3})
            assert status == 409, body
            while run["state"] == "running":
                await asyncio.sleep(0.5)
                _, run = await call_json(http, "GET", f"{base}/api/shadow/{run['id']}")
            assert run["state"] == "done" and run["compared"] >= 5, run
            # the shipped model answers digits, the candidate "cat" or "empty": every frame disagrees
            assert run["agreed"] == 0 and len(run["disagreements"]) == min(run["compared"], 48)
            assert {p["candidate"] for p in run["pairs"]} <= {"cat", "empty"}
            async with http.get(f"{base}/api/shadow/{run['id']}/frames/0.jpg") as r:
                img = cv2.imdecode(np.frombuffer(await r.read(), np.uint8), cv2.IMREAD_COLOR)
            assert r.status == 200 and img.shape[:2] == (side, side), "the frame as the model saw it"
            status, body = await call_json(http, "POST", f"{base}/api/shadow/{run['id']}/frames/0/keep",
                                       {"dataset": "gate", "class": "empty"})
            assert status == 201 and store.split(store.frames("gate"))[body["added"]] == "train", body
            _, st = await call_json(http, "GET", f"{base}/status")
            assert st["model_in_use"] == "default", "a shadow run deploys nothing"
    finally:
        server.stop()


def test_the_floor_is_the_shallowest_exit_within_a_point_of_full_depth_and_classes_are_drawn_equally() -> None:
    teach = pytest.importorskip("exporter.teach", reason="the train extra (torch)")
    assert teach.depth_floor([0.811, 0.906, 0.994]) == 3  # the night bench's first training: exits 1, 2 not enough
    assert teach.depth_floor([0.95, 1.0, 1.0]) == 2
    assert teach.depth_floor([1.0, 1.0, 1.0]) == 1  # a check that cannot tell the exits apart: exit 1 is enough
    assert teach.depth_floor([0.99, 0.98, 0.995]) == 1
    labels = np.array([0] * 10 + [1] * 3 + [2] * 6)
    index = teach.balanced_index(labels, np.random.default_rng(0))
    assert np.bincount(labels[index]).tolist() == [10, 10, 10]
    assert set(index[labels[index] == 1]) == {10, 11, 12}, "the rare class's frames repeat, nothing else stands in"
