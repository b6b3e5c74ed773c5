"""``edge-app serve --workers 2`` for real: a control process and two media workers, a file camera on each, a
browser session (Chromium) through the control process; /status and /metrics show both workers; a worker SIGKILLed
is restarted and its camera resumes, and a peer can watch it again; the events of both workers page through the
control process with one cursor; frames of a camera on each worker are recorded into one dataset through it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from support.clips import write_clip
from support.live import REPO, results_channel
from support.mqtt import free_port
from support.teach import model_version

from edge_app.bench.testvideo import LabelledVideo, write_y4m
from edge_app.config import AppConfig

pytestmark = [pytest.mark.slow, pytest.mark.live, pytest.mark.browser]


async def _status(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(base + "/status") as r:
        assert r.status == 200, await r.text()
        return await r.json()  # type: ignore[no-any-return]


async def _watch(http: aiohttp.ClientSession, base: str, camera: str, seconds: float) -> int:
    pc = RTCPeerConnection()
    results: list[dict[str, Any]] = []
    results_channel(pc, results.append)
    await pc.setLocalDescription(await pc.createOffer())
    async with http.post(base + "/offer", json={"sdp": pc.localDescription.sdp, "type": "offer",
                                                "camera": camera}) as r:
        answer = await r.json()
        assert r.status == 200, answer
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    await asyncio.sleep(seconds)
    await pc.close()
    return sum(1 for x in results if x.get("source") == camera)


async def test_two_workers_a_camera_each_a_browser_and_a_worker_restarted(
        app_config: Callable[..., AppConfig], demo_test_split: tuple[np.ndarray, np.ndarray], tmp_path: Path,
        browser: Any) -> None:
    # each image held 10 frames (2/3 s): states, and so events, on both workers
    porch = write_clip(tmp_path / "porch.mp4", np.repeat(demo_test_split[0][:6], 10, axis=0), seconds=4.0)
    yard = write_clip(tmp_path / "yard.mp4", np.repeat(demo_test_split[0][30:36], 10, axis=0), seconds=4.0)
    port, base_port = free_port(), free_port()
    models_dir = tmp_path / "models"
    for name in ("yard-1", "porch-1"):
        model_version(models_dir, name, REPO / "models" / "default")
    cfg = app_config(cameras=[{"name": "porch", "kind": "file", "path": str(porch)},
                              {"name": "yard", "kind": "file", "path": str(yard), "model": "yard-1"}],
                     server={"ice_host_addresses": ["127.0.0.1"], "port": port},
                     events={"labels": ["*"], "min_s": 0.3, "min_confidence": 0.0},
                     training={"models_dir": str(models_dir), "data_dir": str(tmp_path / "data")})
    log = (tmp_path / "control.log").open("wb")
    control = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config",
                                str(cfg.base_dir / "config.toml"), "--workers", "2"], cwd=REPO, stdout=log,
                               stderr=subprocess.STDOUT, env={**os.environ, "EDGE_APP_WORKER_BASE_PORT":
                                                              str(base_port)})
    base = f"http://127.0.0.1:{port}"
    camera = write_y4m(tmp_path / "camera.y4m", LabelledVideo(demo_test_split[0][:60], demo_test_split[1][:60], 2))
    try:
        async with aiohttp.ClientSession() as http:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 90:  # both workers load the model
                try:
                    st = await _status(http, base)
                    if len(st["workers"]) == 2 and len(st["cameras"]) == 2 and all(
                            c["state"] == "streaming" for c in st["cameras"]):
                        break
                except (aiohttp.ClientError, AssertionError, KeyError):
                    pass
                await asyncio.sleep(0.5)
            async with browser(camera) as page:
                await page.goto(f"{base}/")
                await page.click("#connect")
                await page.wait_for_function("() => window.edge.error || window.edge.results >= 45", timeout=40_000)
                page_state = await page.evaluate("() => ({error: edge.error, results: edge.results, "
                                                 "session: edge.session})")
                both = await _status(http, base)
            async with http.get(base + "/metrics") as r:
                metrics = await r.text()
            victim = next(w for w in both["workers"] if w["index"] == 1)
            os.kill(victim["pid"], signal.SIGKILL)
            killed = time.monotonic()
            while time.monotonic() - killed < 30:
                st = await _status(http, base)
                w1 = next(w for w in st["workers"] if w["index"] == 1)
                yard_cam = [c for c in st["cameras"] if c["name"] == "yard"]
                if w1["alive"] and w1["restarts"] == 1 and yard_cam and yard_cam[0]["frames_analysed"] > 15:
                    break
                await asyncio.sleep(0.5)
            back_s = time.monotonic() - killed
            watched = await _watch(http, base, "yard", 3.0)
            after = await _status(http, base)
            events, paged = await _events_paged(http, base)
            async with http.get(base + "/api/cameras/yard/region") as r:  # worker 1's camera
                region = (r.status, await r.json())
            taught = await _teach_from_both(http, base)
            models = await _models_per_camera(http, base)
    finally:
        control.send_signal(signal.SIGTERM)
        try:
            control.wait(30)
        except subprocess.TimeoutExpired:
            control.kill()
    leftovers = subprocess.run(["pgrep", "-f", "--", f"--worker .*/2 --port {base_port}"], capture_output=True,
                               text=True)  # "--": a pattern that starts with a dash is not an option
    cams = {c["name"]: c["worker"] for c in both["cameras"]}
    print(f"workers: cameras {cams}; browser {page_state}; sessions {[(s['worker']) for s in both['sessions']]}; "
          f"worker 1 back with its camera in {back_s:.1f} s; a peer watching yard after: {watched} results; "
          f"workers after {json.dumps(after['workers'])}")
    assert cams == {"porch": 0, "yard": 1}, "camera k on worker k mod 2"
    assert page_state["error"] is None and page_state["results"] >= 45
    assert len(both["sessions"]) == 1 and all(w["alive"] for w in both["workers"])
    assert re.search(r'edge_frames_analysed_total\{.*worker="0"', metrics)
    assert re.search(r'edge_frames_analysed_total\{.*worker="1"', metrics)
    assert back_s < 30 and watched >= 15
    assert [w["restarts"] for w in after["workers"]] == [0, 1]
    assert control.returncode == 0 and leftovers.returncode == 1 and leftovers.stdout.strip() == "", \
        f"the workers stop with the control process (pgrep: {leftovers.returncode}, {leftovers.stderr.strip()})"
    ids = [e["id"] for e in paged]
    print(f"events through the control process: {len(events)} in one page, {len(paged)} paged one at a time, cameras "
          f"{sorted({e['camera'] for e in paged})}")
    assert {e["camera"] for e in events} == {"porch", "yard"}, "both workers' events"
    assert len(ids) == len(set(ids)) and {e["id"] for e in events} <= set(ids), "every event once, none lost"
    assert len(paged) >= 3, "pages across both workers"
    assert region[0] == 200, f"a camera's region from its own worker: {region}"
    print(f"teaching through the control process: {taught}")
    assert taught["sources"] == {"camera:porch": 0, "camera:yard": 1}, "every worker's sources"
    assert [r["state"] for r in taught["recordings"]] == ["done", "done"], taught
    assert [r["id"] % 2 for r in taught["recordings"]] == [1, 0], "each recording on its camera's worker"
    assert all(r["saved"] >= 3 for r in taught["recordings"])
    assert taught["frames"] == {"yard": taught["recordings"][0]["saved"], "porch": taught["recordings"][1]["saved"]}, \
        "the frames both workers wrote, in one dataset"
    print(f"models through the control process: {models}")
    assert models["first"] == {"porch": ("default", 0), "yard": ("yard-1", 1)}
    assert models["loaded"] == {0: ["default"], 1: ["default", "yard-1"]}, "each worker loads its cameras' models"
    assert models["deployed"] == {"porch": ("porch-1", 0), "yard": ("yard-1", 1)}, "a deploy on one camera only"
    assert models["loaded_after"] == {0: ["default", "porch-1"], 1: ["default", "yard-1"]}
    assert models["history"] == ["default", "porch-1"], "a box-wide deploy recorded once, however many workers"
    assert models["defaults"] == {0: "porch-1", 1: "porch-1"}, "every worker serves the box's default"
    assert models["rolled_back"] == {0: "default", 1: "default"} and models["history_after"] == ["default"]
    keys = [(e["start"], e["id"]) for e in paged]
    assert keys == sorted(keys, reverse=True), "newest first across the workers"


async def _models_per_camera(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """Which model answers each camera and which models each worker loaded; then porch-1 deployed on camera porch
    (worker 0), then as the box's default (every worker) and rolled back, all through the control process."""
    async def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        async with http.request(method, base + path, json=body) as r:
            assert r.status == 200, (path, r.status, await r.text())
            return await r.json()

    def cameras(st: dict[str, Any]) -> dict[str, tuple[str, int]]:
        return {c["name"]: (c["model"]["name"], c["worker"]) for c in st["cameras"]}

    def loaded(st: dict[str, Any]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for m in st["models"]:
            out.setdefault(m["worker"], []).append(m["name"])
        return {w: sorted(names) for w, names in out.items()}

    def defaults(st: dict[str, Any]) -> dict[int, str]:
        return {m["worker"]: m["name"] for m in st["models"] if m["default"]}

    first = await _status(http, base)
    await call("POST", "/api/models/porch-1/deploy", {"camera": "porch"})
    deployed = await _status(http, base)
    await call("POST", "/api/models/porch-1/deploy")
    on_all = await _status(http, base)
    history = [h["model"] for h in (await call("GET", "/api/models"))["history"]]
    await call("POST", "/api/models/rollback")
    back = await _status(http, base)
    history_after = [h["model"] for h in (await call("GET", "/api/models"))["history"]]
    return {"first": cameras(first), "loaded": loaded(first), "deployed": cameras(deployed),
            "loaded_after": loaded(deployed), "history": history, "defaults": defaults(on_all),
            "rolled_back": defaults(back), "history_after": history_after}


async def _teach_from_both(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """A dataset with a class per camera, one second recorded from each (worker 1's camera, then worker 0's), at
    once, through the control process; the recordings followed by the ids it gave."""
    async def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        async with http.request(method, base + path, json=body) as r:
            assert r.status in (200, 201, 202), (path, r.status, await r.text())
            return await r.json()

    await call("POST", "/api/datasets", {"name": "scene"})
    for cls in ("yard", "porch"):
        await call("POST", "/api/datasets/scene/classes", {"name": cls})
    sources = {s["id"]: s["worker"] for s in (await call("GET", "/api/sources"))["sources"]
               if s["id"].startswith("camera:")}
    started = await asyncio.gather(*(call("POST", f"/api/datasets/scene/classes/{cls}/capture",
                                          {"source": f"camera:{cls}", "seconds": 1.0, "fps": 5})
                                     for cls in ("yard", "porch")))
    recordings = []
    for rec in started:
        for _ in range(50):
            if rec["state"] != "recording":
                break
            await asyncio.sleep(0.2)
            rec = await call("GET", f"/api/recordings/{rec['id']}")
        recordings.append(rec)
    summary = await call("GET", "/api/datasets/scene")
    return {"sources": sources, "recordings": [{k: r[k] for k in ("id", "state", "saved", "source")}
                                               for r in recordings],
            "frames": {c["name"]: c["frames"] for c in summary["classes"]}}


async def _events_paged(http: aiohttp.ClientSession, base: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The newest 500 events in one page, then every event one to a page following ``next`` (new events only come
    in at the newest end, so the pages hold all the first list's)."""
    async with http.get(base + "/api/events", params={"limit": "500"}) as r:
        assert r.status == 200, await r.text()
        events = (await r.json())["events"]
    paged: list[dict[str, Any]] = []
    cursor = None
    for _ in range(200):
        async with http.get(base + "/api/events", params={"limit": "1", **({"cursor": cursor} if cursor else {})}
                            ) as r:
            assert r.status == 200, await r.text()
            page = await r.json()
        paged += page["events"]
        cursor = page["next"]
        if cursor is None:
            break
    return events, paged
