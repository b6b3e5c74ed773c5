"""The teaching API refuses bad input with a 4xx and a reason, splits by time blocks, and swaps models in a
running server without dropping its viewers (the real app on loopback; frames from a real aiortc peer)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from edge_app.bench.scene import render
from edge_app.teach.frames import DatasetError
from edge_app.teach.jobs import missing_train_extra
from edge_app.teach.store import DatasetStore

pytestmark = [pytest.mark.slow, pytest.mark.live]


def test_split_deals_contiguous_time_blocks_never_frame_by_frame(tmp_path: Path) -> None:
    store = DatasetStore(tmp_path, block_s=2.0)
    store.create("d")
    store.add_class("d", "a")
    rgb = np.zeros((48, 64, 3), np.uint8)
    frames = [store.add_frame("d", "a", rgb, "camera:x", 1000.0 + 0.1 * i) for i in range(140)]  # 14 s at 10 fps
    split = store.split(store.frames("d"))
    runs = [split[f.id] for f in frames]
    changes = sum(1 for a, b in itertools.pairwise(runs) if a != b)
    assert changes <= 7 and set(runs) == {"train", "calibration", "test"}, "a few whole blocks, not interleaved"
    assert runs[:20] == ["train"] * 20 and runs.count("test") == 20 and runs.count("calibration") == 20
    later = store.add_frame("d", "a", rgb, "camera:x", 1100.0)  # after a pause: a block of its own
    assert store.split(store.frames("d"))[later.id] == "train"
    with pytest.raises(DatasetError, match="at least two"):
        store.check_trainable("d", 20)
    store.add_class("d", "b")
    with pytest.raises(DatasetError, match="class 'b' is empty"):
        store.check_trainable("d", 20)
    for i in range(25):
        store.add_frame("d", "b", rgb, "camera:x", 2000.0 + 0.1 * i)
    with pytest.raises(DatasetError, match="too few frames for the split"):
        store.check_trainable("d", 20)
    with pytest.raises(DatasetError, match="dataset name"):
        store.create("../etc")


async def _json(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with http.request(method, url, json=body) as r:
        return r.status, await r.json()


class Viewer:
    """A real aiortc peer sending labelled video and keeping every data-channel message."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        from aiortc import RTCPeerConnection
        from test_live_session import VideoFileTrack

        from edge_app.bench.testvideo import LabelledVideo

        self.pc = RTCPeerConnection()
        self.pc.addTrack(VideoFileTrack(LabelledVideo(images, labels, hold=3)))
        self.messages: list[dict[str, Any]] = []
        channel = self.pc.createDataChannel("results", ordered=False, maxRetransmits=0)

        @channel.on("message")  # type: ignore[untyped-decorator]
        def on_message(message: str) -> None:
            msg = json.loads(message)
            if msg["type"] == "ping":
                channel.send(json.dumps({"type": "pong", "id": msg["id"]}))
            self.messages.append(msg)

    @property
    def results(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == "result"]


def _add_frames(root: str, source: str, n: int) -> None:
    store = DatasetStore(Path(root))
    rgb = np.zeros((24, 32, 3), np.uint8)
    for _ in range(n):
        store.add_frame("d", "a", rgb, source)


def test_two_processes_capture_into_one_dataset_while_a_third_rewrites_its_index(tmp_path: Path) -> None:
    """``serve --workers``: each camera's worker writes its frames into the shared dataset while another process
    changes frames' roles (which rewrites the index): no frame is lost (the dataset's ``flock``)."""
    import multiprocessing

    store = DatasetStore(tmp_path)
    store.create("d")
    store.add_class("d", "a")
    first = store.add_frame("d", "a", np.zeros((24, 32, 3), np.uint8), "camera:x")
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_add_frames, args=(str(tmp_path), f"camera:{k}", 150)) for k in range(2)]
    for w in writers:
        w.start()
    rewrites = 0
    while any(w.is_alive() for w in writers):
        store.set_role("d", [first.id], "train" if rewrites % 2 else "check")
        rewrites += 1
    for w in writers:
        w.join()
    frames = store.frames("d")
    print(f"{len(frames)} frames after 2 x 150 written from two processes and {rewrites} index rewrites here")
    assert all(w.exitcode == 0 for w in writers) and rewrites > 10
    assert len(frames) == 301 and len({f.id for f in frames}) == 301



async def test_api_refuses_bad_input_and_swaps_models_under_a_viewer(
        app_config: Callable[..., Any], serve: Any, tmp_path: Path,
        demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    from test_live_session import connect

    cfg = app_config(training={"data_dir": str(tmp_path / "data"), "models_dir": str(tmp_path / "models"),
                               "epochs": 2, "min_frames_per_class": 20})
    viewer = Viewer(*demo_test_split)
    async with serve(cfg) as base, aiohttp.ClientSession() as http:
        answer = await connect(base, viewer.pc)
        assert (await _json(http, "POST", f"{base}/api/datasets", {"name": "a/b"}))[0] == 400
        assert (await _json(http, "POST", f"{base}/api/datasets", {"name": "door"}))[0] == 201
        status, body = await _json(http, "POST", f"{base}/api/datasets/door/classes/ghost/capture",
                                   {"source": "camera:none"})
        assert status == 404 and "no class 'ghost'" in body["error"], body
        for cls in ("empty", "cat"):
            assert (await _json(http, "POST", f"{base}/api/datasets/door/classes", {"name": cls}))[0] == 201
        status, body = await _json(http, "POST", f"{base}/api/datasets/door/classes/cat/capture",
                                   {"source": "camera:none"})
        assert status == 404 and "GET /api/sources" in body["error"], body
        status, body = await _json(http, "POST", f"{base}/api/datasets/door/classes/cat/capture",
                                   {"source": "camera:none", "seconds": 1e6})
        assert status == 400 and "max_record_s" in body["error"], body
        _, sources = await _json(http, "GET", f"{base}/api/sources")
        assert {"id": f"session:{answer['session']}", "kind": "browser", "name": answer["session"]} in \
            sources["sources"]
        for _ in range(50):  # the peer's video starts flowing
            if viewer.results:
                break
            await asyncio.sleep(0.1)
        status, body = await _json(http, "POST", f"{base}/api/datasets/door/classes/cat/capture",
                                   {"source": f"session:{answer['session']}", "seconds": 0})
        assert status == 200 and body["saved"] == 1 and body["state"] == "done", "a snapshot of a browser's camera"
        status, body = await _json(http, "DELETE", f"{base}/api/datasets/door/frames/{body['frames'][0]}")
        assert status == 200
        status, body = await _json(http, "POST", f"{base}/api/training", {"dataset": "door"})
        assert status == 400 and "is empty" in body["error"], body
        assert (await _json(http, "POST", f"{base}/api/training", {"dataset": "nope"}))[0] == 404
        status, body = await _json(http, "POST", f"{base}/api/models/rollback")
        assert status == 409 and "nothing to roll back" in body["error"], body
        assert (await _json(http, "POST", f"{base}/api/models/nope/deploy"))[0] == 404
        broken = tmp_path / "models" / "broken"
        broken.mkdir(parents=True)
        (broken / "manifest.json").write_text("{}")
        (broken / "policy.json").write_text("{}")
        status, body = await _json(http, "POST", f"{base}/api/models/broken/deploy")
        assert status == 422 and "broken" in body["error"], body

        # real frames into the store (as a capture would write them), then a real training job
        def fill() -> None:
            teach_store = DatasetStore(tmp_path / "data", 2.0)
            rng = np.random.default_rng(0)
            for k, cls in enumerate(("empty", "cat")):
                for i in range(140):  # 14 s at 10 fps: seven 2 s blocks, one of them for the test
                    teach_store.add_frame("door", cls, render(cls, rng), "test", 1000.0 + 100 * k + 0.1 * i)

        await asyncio.to_thread(fill)
        if missing_train_extra():
            pytest.skip(f"the train extra is not installed ({missing_train_extra()})")
        status, job = await _json(http, "POST", f"{base}/api/training", {"dataset": "door"})
        assert status == 202, job
        status, body = await _json(http, "POST", f"{base}/api/training", {"dataset": "door"})
        assert status == 409 and "already running" in body["error"], body
        for _ in range(600):
            status, job = await _json(http, "GET", f"{base}/api/training/{job['id']}")
            if job["state"] != "running":
                break
            await asyncio.sleep(0.5)
        assert job["state"] == "succeeded" and job["epochs"], job
        before = len(viewer.results)
        status, body = await _json(http, "POST", f"{base}/api/models/{job['model']}/deploy")
        assert status == 200 and body["classes"] == ["cat", "empty"], body
        status, st = await _json(http, "GET", f"{base}/status")
        assert st["model"]["name"] == job["model"] and st["model_in_use"] == job["model"]
        async with http.get(f"{base}/metrics") as r:
            assert f'edge_model_info{{model="{job["model"]}"' in await r.text(), "the metrics name it too"
        await asyncio.sleep(1.0)
        assert len(viewer.results) > before, "the viewer's results kept flowing across the swap"
        assert any(m["type"] == "model" and m["classes"] == ["cat", "empty"] for m in viewer.messages), \
            "the viewer was told"
        assert viewer.results[-1]["smoothed"]["label"] in ("cat", "empty"), "its results name the new classes"
        status, body = await _json(http, "POST", f"{base}/api/models/rollback")
        assert status == 200 and body["model"] == "default"
        status, models = await _json(http, "GET", f"{base}/api/models")
        assert models["in_use"] == "default" and any(m["name"] == job["model"] for m in models["models"])
        status, st = await _json(http, "GET", f"{base}/status")
        assert len(st["sessions"]) == 1 and st["sessions_closed"] == {}, "the viewer stayed through both swaps"
        await viewer.pc.close()


async def test_the_demo_camera_is_scored_live_against_its_labels(app_config: Callable[..., Any], serve: Any) -> None:
    """The built-in demo source a newcomer can pick: labelled frames, each result scored against its label."""
    from aiortc import RTCPeerConnection
    from support.live import results_channel
    from test_live_session import connect

    cfg = app_config(demo={"enabled": True, "fps": 15.0, "hold_frames": 5})
    async with serve(cfg) as base, aiohttp.ClientSession() as http:
        pc = RTCPeerConnection()
        pc.addTransceiver("video", direction="recvonly")
        messages: list[dict[str, Any]] = []
        results_channel(pc, messages.append)
        await connect(base, pc, camera="demo")
        for _ in range(200):
            await asyncio.sleep(0.1)
            if sum(1 for m in messages if m["type"] == "result") >= 150:
                break
        _, st = await _json(http, "GET", f"{base}/status")
        await pc.close()
    results = [m for m in messages if m["type"] == "result"]
    demo = next(c for c in st["cameras"] if c["name"] == "demo")
    print(f"demo camera: {demo['live_accuracy']} after {len(results)} results at the viewer")
    assert len(results) >= 150 and all("truth" in m for m in results)
    assert {m["truth"]["label"] for m in results} >= {"no digit"} and len({m["truth"]["label"] for m in results}) >= 5
    acc = demo["live_accuracy"]
    assert acc["frames"] >= 150 and acc["raw"] >= 0.8, acc
