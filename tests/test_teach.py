"""Teach it your scene, end to end, through the page in Chromium.

A real RTSP camera (gst-rtsp-server, H.264) shows a scene the shipped model never saw: a photo of a launch pad,
with or without a cat in it, in changing light, with noise and a little camera shake (edge_app/bench/scene.py).
The test switches what the camera shows by rewriting the JPEG clip the server loops. Through the page it adds
two classes, records each while the camera shows it (>= 100 frames per class), trains on the CPU, reads the
held-out per-exit accuracy, deploys without restarting the server, and then checks the live raw answers on new
frames of the scene (other light, other positions) while the page's data channel stays connected throughout;
rolling back restores the shipped model.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.live import skip_or_fail

from edge_app.bench.rtsp_camera import RtspServer, free_port, gst_rtsp_available
from edge_app.bench.scene import write_clip
from edge_app.bench.teach_live import SceneCamera
from edge_app.teach.jobs import missing_train_extra

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "test-teach"
pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.live]


async def _status(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/status") as r:
        return dict(await r.json())


async def _record(page: Any, cls: str, kind: str = "record") -> dict[str, Any]:
    await page.click(f"button.teach-{kind}[data-cls='{cls}']")
    await page.wait_for_function(f"() => edge.teach.recording && edge.teach.recording.class === '{cls}' && "
                                 "edge.teach.recording.state !== 'recording'", timeout=60_000)
    return dict(await page.evaluate("() => edge.teach.recording"))


async def _live_accuracy(page: Any, camera: SceneCamera, classes: list[str], seconds: float = 6.0
                         ) -> tuple[int, int, int]:
    """Show each state in the test phase (new light and positions) and count the answers that name it: every
    result, as the viewer gets it (an answer at exit 0, the picture unchanged, is the answer served for that
    frame); and how many of them the model ran on."""
    right = total = ran = 0
    for state in ("empty", "cat", "empty", "cat"):
        await asyncio.to_thread(camera.show, state, "test")
        async with camera.drifting(1.5):
            await asyncio.sleep(2.5)  # the clip loops within a second; the pipeline catches up
            start = await page.evaluate("() => edge.results")
            await asyncio.sleep(seconds / 2)
            got = await page.evaluate("(n0) => edge.recent.slice(-(edge.results - n0))"
                                      ".map((m) => [m.raw.class, m.reused])", start)
        right += sum(1 for c, _ in got if classes[c] == state)
        total += len(got)
        ran += sum(1 for _, reused in got if not reused)
    return right, total, ran


async def test_teach_a_scene_from_the_page_deploy_and_roll_back(app_config: Callable[..., Any], serve: Any,
                                                                browser: Any, tmp_path: Path) -> None:
    if not gst_rtsp_available() or shutil.which("chromium") is None:
        skip_or_fail("needs GStreamer's RTSP server for the system Python and chromium (.ci/run installs them)")
    if missing_train_extra():
        skip_or_fail(f"needs the train extra ({missing_train_extra()}); .ci/run installs it")
    camera = SceneCamera(tmp_path / "scene", write=write_clip)
    camera.show("empty")
    server = RtspServer(camera.folder / "%05d.jpg", free_port(), fps=15)
    server.start()
    cfg = app_config(cameras=[{"name": "door", "url": server.url}],
                     training={"data_dir": str(tmp_path / "data"), "models_dir": str(tmp_path / "models"),
                               "epochs": 10})
    t0 = time.monotonic()
    try:
        async with serve(cfg) as base, browser(None) as page:
            await page.goto(f"{base}/?camera=door")
            await page.click("#connect")
            await page.wait_for_function("() => edge.state === 'connected' && edge.results > 20", timeout=60_000)
            session = await page.evaluate("() => edge.session")
            shipped = (await _status(base))["model"]
            # the camera's region, drawn over the video and dragged with the mouse, then cleared
            await page.click("#region-set")
            await page.wait_for_function("() => edge.region.saved >= 1 && !document.getElementById('region-box')"
                                         ".hidden")
            await page.locator("#region-box").scroll_into_view_if_needed()  # the click above scrolled to the button
            box = await page.locator("#region-box").bounding_box()
            await page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            await page.mouse.down()
            await page.mouse.move(box["x"] + box["width"] / 2 + 60, box["y"] + box["height"] / 2 + 40, steps=5)
            await page.mouse.up()
            await page.wait_for_function("() => edge.region.saved >= 2")
            dragged = (await _status(base))["cameras"][0]["region"]
            line = await page.text_content("#region-line")
            await page.click("#region-clear")
            await page.wait_for_function("() => edge.region.saved >= 3")
            cleared = (await _status(base))["cameras"][0]["region"]
            await page.fill("#teach-dataset", "door")
            await page.dispatch_event("#teach-dataset", "change")
            for cls in ("empty", "cat"):
                await page.fill("#teach-class", cls)
                await page.click("#teach-add-class")
                await page.wait_for_selector(f"button.teach-record[data-cls='{cls}']")
            await page.fill("#teach-seconds", "16")
            recorded = {}
            for cls in ("empty", "cat"):
                await asyncio.to_thread(camera.show, cls, "train")
                async with camera.drifting():
                    await asyncio.sleep(2.0)
                    recorded[cls] = (await _record(page, cls))["saved"]
            warning = await page.text_content("#teach-check-warning")
            await page.fill("#teach-seconds", "6")
            checked = {}
            for cls in ("empty", "cat"):  # a check recording of each state, apart, in other light
                await asyncio.to_thread(camera.show, cls, "test")
                async with camera.drifting():
                    await asyncio.sleep(2.0)
                    checked[cls] = (await _record(page, cls, "check"))["saved"]
            capture_s = time.monotonic() - t0

            t1 = time.monotonic()
            await page.click("#teach-train")
            await page.wait_for_function("() => edge.teach.job && edge.teach.job.state !== 'running'",
                                         timeout=300_000)
            job = await page.evaluate("() => edge.teach.job")
            train_s = time.monotonic() - t1
            assert job["state"] == "succeeded", job
            result = job["result"]
            report = await page.text_content("#teach-report")
            await page.click(f"button.teach-deploy[data-model='{result['model'].split('/')[-1]}']")
            await page.wait_for_function("() => edge.models >= 1", timeout=60_000)
            deployed = await _status(base)
            door = next(c for c in deployed["cameras"] if c["name"] == "door")["model"]
            async with aiohttp.ClientSession() as http, http.get(f"{base}/api/models") as r:
                taught = next(m for m in (await r.json())["models"] if m["name"] == door["name"])
            await page.wait_for_function("() => document.getElementById('teach-models').textContent.includes("
                                         "'(in use: camera door)')", timeout=30_000)  # the list is fetched again
            shown = await page.text_content("#teach-models")
            right, total, ran = await _live_accuracy(page, camera, taught["classes"])

            await page.click("#teach-rollback")
            await page.wait_for_function("() => edge.models >= 2", timeout=60_000)
            after = await _status(base)
            kept = await page.evaluate("() => ({session: edge.session, state: edge.state, results: edge.results})")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "teach.png"), full_page=True)
    finally:
        server.stop()
    print(f"\nteach: frames recorded {recorded} in {capture_s:.0f} s; trained in {train_s:.0f} s "
          f"(process {result['seconds']} s; frames per split {result['frames']}); held-out test accuracy per exit "
          f"{result['test_accuracy']}, cost ms {result['costs_ms']}; policy {result['policy'].get('loss_kind')} "
          f"lam {result['policy'].get('lam')}; live accuracy on new frames {right}/{total} ({ran} run by the model) = "
          f"{right / max(total, 1):.3f} (shown before deploy on the check: {result['check']['accuracy']} as "
          f"served, per exit {result['check']['per_exit_accuracy']}, floor exit {result['policy']['min_exit']}); "
          f"model on the camera after deploy {taught['name']} {taught['classes']}, "
          f"after roll back {after['cameras'][0]['model']['name']}")
    assert dragged[0] > 0.3 and dragged[1] > 0.3 and dragged[2:] == [0.5, 0.5], f"dragged right and down: {dragged}"
    assert line.startswith("region = [") and cleared is None, (line, cleared)
    assert min(recorded.values()) >= 100, recorded
    assert "No check recording" in (warning or ""), "before a check, the page says the figure may be optimistic"
    assert min(checked.values()) >= 40 and result["frames"]["check"] == sum(checked.values()), (checked, result)
    assert "check recording" in (report or "") and "Policy" in (report or ""), report
    # the page deploys on the camera it watches: that camera's model, the box's default untouched
    assert door["own"] and deployed["model"]["name"] == shipped["name"], (door, deployed["model"])
    assert taught["classes"] == ["cat", "empty"] and taught["name"] == result["model"].split("/")[-1], taught
    assert taught["test_accuracy"] == result["test_accuracy"], "/api/models has the held-out figures"
    assert "exit 1" in (shown or "") and "(in use: camera door)" in (shown or ""), shown
    assert total >= 100 and right / total >= 0.95, f"live accuracy {right}/{total}"
    assert ran > 0, "the model itself answered some of them"
    back = next(c for c in after["cameras"] if c["name"] == "door")["model"]
    assert back == {"name": "default", "own": False, "model": shipped["name"]}, back
    assert after["model_in_use"] == "default"
    assert kept["session"] == session and kept["state"] == "connected", "the viewer stayed connected throughout"
    assert after["sessions_closed"] == {} and len(after["sessions"]) == 1, after["sessions_closed"]
