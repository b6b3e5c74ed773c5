"""``edge-app bench-teach``: teach a scene that is not easy, as a user would, then compare what the page showed
before deploy with what the served model then gets right live.

A real ``edge-app serve`` process watches one RTSP camera (GStreamer's test server on loopback, 640x480 H.264 at
15 fps) showing ``edge_app.bench.hardscene``: three states that differ by a small object in the lower right, in
changing light. Each round, through the HTTP API the page uses: record 14 s of each state (10 fps), record a check
of each state apart (6 s, in other light), train from the shipped model, read the figure the page shows before
deploy (the policy as served, on the check), deploy, then show every state in *new* light and count the raw answers
an aiortc viewer receives (every result, reused ones included, after 2.5 s for the switch). The camera's region is
set on the object's part of the view unless ``--no-region``. Live accuracy comes with a 95 % bootstrap interval
over 1-second blocks (neighbouring frames are not independent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from edge_app.bench.hardscene import REGION, STATES, write_clip
from edge_app.bench.rtsp_camera import RtspServer, free_port, gst_rtsp_available
from edge_app.bench.sessions import wait_healthy
from edge_app.bench.viewers import REPO, Viewer

SETTLE_S = 2.5  # after the camera switches state: the clip loops in 2 s, the pipeline catches up


class SceneCamera:
    """What an RTSP camera looping ``folder`` shows: a state in a phase, a new clip every ``every_s`` while
    ``drifting`` (light and places drift). ``write`` draws a clip (``hardscene.write_clip`` by default; the tests
    pass ``scene.write_clip``); ``nights``: check and live clips alternate between day and the camera's night mode.
    """

    def __init__(self, folder: Path, seed: int = 0, write: Callable[..., None] = write_clip,
                 nights: bool = False) -> None:
        self.folder, self.state, self.phase, self.seed = folder, STATES[0], "train", seed * 100_003
        self.write, self.nights = write, nights

    def show(self, state: str, phase: str | None = None) -> None:
        self.state, self.phase = state, phase or self.phase
        self.seed += 1
        if self.nights and self.phase != "train" and self.seed % 2 == 0:
            self.write(self.folder, self.state, self.seed, 30, self.phase, night=True)
        else:
            self.write(self.folder, self.state, self.seed, 30, self.phase)

    @contextlib.asynccontextmanager
    async def drifting(self, every_s: float = 2.0) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(every_s)
                await asyncio.to_thread(self.show, self.state)
        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _call(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    async with http.request(method, url, json=body) as r:
        data = await r.json()
        if r.status >= 400:
            raise RuntimeError(f"{method} {url}: {r.status} {data}")
        return data


def block_interval(right: np.ndarray, block: np.ndarray, rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of the mean of ``right`` resampling whole blocks (seconds of video)."""
    rng = np.random.default_rng(seed)
    ids = np.unique(block)
    groups = [right[block == b] for b in ids]
    means = [np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))]).mean()
             for _ in range(rounds)]
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


async def _round(http: aiohttp.ClientSession, base: str, camera: SceneCamera, viewer: Viewer, k: int,
                 record_s: float, check_s: float, live_s: float) -> dict[str, Any]:
    ds = f"bench-{k}"
    await _call(http, "POST", f"{base}/api/datasets", {"name": ds})
    for state in STATES:
        await _call(http, "POST", f"{base}/api/datasets/{ds}/classes", {"name": state})
    t0 = time.monotonic()
    saved: dict[str, int] = {}
    for phase, seconds, role in (("train", record_s, "auto"), ("check", check_s, "check")):
        for state in STATES:
            await asyncio.to_thread(camera.show, state, phase)
            async with camera.drifting():
                await asyncio.sleep(SETTLE_S)
                rec = await _call(http, "POST", f"{base}/api/datasets/{ds}/classes/{state}/capture",
                                  {"source": "camera:door", "seconds": seconds, "fps": 10, "wait": True,
                                   "role": role})
            saved[f"{role}:{state}"] = rec["saved"]
    capture_s = time.monotonic() - t0
    t1 = time.monotonic()
    job = await _call(http, "POST", f"{base}/api/training", {"dataset": ds, "from": "active"})
    while job["state"] == "running":
        await asyncio.sleep(1.0)
        job = await _call(http, "GET", f"{base}/api/training/{job['id']}")
    if job["state"] != "succeeded":
        raise RuntimeError(f"training {job['id']} {job['state']}: {job['error']}")
    train_s = time.monotonic() - t1
    result = job["result"]
    await _call(http, "POST", f"{base}/api/models/{job['model']}/deploy")
    classes = result["classes"]
    right: list[int] = []
    blocks: list[int] = []
    exits: list[int] = []
    for rep in range(2):
        for state in STATES:
            await asyncio.to_thread(camera.show, state, "live")
            async with camera.drifting(1.5):
                await asyncio.sleep(SETTLE_S)
                n0 = len(viewer.messages)
                t_start = time.monotonic()
                await asyncio.sleep(live_s)
                got = viewer.messages[n0:]
            for m in got:
                right.append(int(classes[m["raw"]["class"]] == state))
                blocks.append(int(1000 * rep + 100 * STATES.index(state) + (m["received_s"] - t_start)))
                exits.append(int(m.get("exit", 0)))
    await _call(http, "POST", f"{base}/api/models/rollback")
    r, b = np.asarray(right, float), np.asarray(blocks)
    check = result["check"]
    return {"round": k, "saved": saved, "capture_s": capture_s, "train_s": train_s, "process_s": result["seconds"],
            "epochs_run": result["epochs_run"], "held_out": result["test_accuracy"],
            "check_per_exit": check["per_exit_accuracy"], "shown": check["accuracy"],
            "floor": result["policy"]["min_exit"], "costs_ms": result["costs_ms"],
            "live": float(r.mean()), "live_interval": block_interval(r, b), "live_frames": len(r),
            "live_exits": [exits.count(e) for e in (0, 1, 2, 3)], "served": result.get("served", {})}


def pct(a: float) -> str:
    return f"{100 * a:.1f}"


def format_report(rows: list[dict[str, Any]], region: bool, nights: bool = False) -> str:
    lines = [f"hard scene (three states, a small object in the lower right, new light after deploy), "
             f"{'with' if region else 'without'} the camera's region {list(REGION) if region else ''}"
             f"{'; check and live half in the camera night mode, which training never saw' if nights else ''}; "
             "accuracy in %", "",
             "| round | frames recorded (train / check per state) | training s | held-out per exit (same recordings) "
             "| check per exit | shown before deploy (policy on the check) | floor | live after deploy [95 % CI] | "
             "live − shown | live exits 0/1/2/3 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        s = row["saved"]
        train = [v for k, v in s.items() if k.startswith("auto")]
        check = min(v for k, v in s.items() if k.startswith("check"))
        low, high = row["live_interval"]
        lines.append(f"| {row['round']} | {min(train)}-{max(train)} / {check} | {row['train_s']:.0f} "
                     f"({row['epochs_run']} epochs) | {' / '.join(pct(a) for a in row['held_out'])} | "
                     f"{' / '.join(pct(a) for a in row['check_per_exit'])} | {pct(row['shown'])} | {row['floor']} | "
                     f"{pct(row['live'])} [{pct(low)}, {pct(high)}] of {row['live_frames']} | "
                     f"{100 * (row['live'] - row['shown']):+.1f} | {'/'.join(map(str, row['live_exits']))} |")
    worst = min(r["live"] for r in rows)
    gap = max(abs(r["live"] - r["shown"]) for r in rows)
    lines += ["", f"worst live accuracy {pct(worst)} % (target >= 95 in every training); largest |live - shown| "
                  f"{100 * gap:.1f} points (target <= 5); training {min(r['train_s'] for r in rows):.0f}-"
                  f"{max(r['train_s'] for r in rows):.0f} s (target < 120)"]
    return "\n".join(lines)


async def bench(model: Path, rounds: int, out: Path, region: bool = True, record_s: float = 14.0,
                check_s: float = 6.0, live_s: float = 5.0, epochs: int = 12, nights: bool = False) -> str:
    if not gst_rtsp_available():
        raise SystemExit("needs GStreamer's RTSP server for the system Python (see README, set-up)")
    out.mkdir(parents=True, exist_ok=True)
    camera = SceneCamera(out / "scene", 1, nights=nights)
    camera.show(STATES[0], "train")
    rtsp = RtspServer(camera.folder / "%05d.jpg", free_port(), fps=15, size="640x480")
    rtsp.start()
    port = free_port()
    cfg = out / "config.toml"
    region_line = f"region = {list(REGION)}\n" if region else ""
    cfg.write_text(f'[server]\nport = {port}\nice_host_addresses = ["127.0.0.1"]\n\n[model]\npath = "{model}"\n\n'
                   f'[training]\ndata_dir = "{out / "data"}"\nmodels_dir = "{out / "models"}"\nepochs = {epochs}\n\n'
                   f'[[cameras]]\nname = "door"\nurl = "{rtsp.url}"\n{region_line}')
    log = (out / "server.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config", str(cfg)], cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    viewer = Viewer("camera", keep_results=True)
    rows = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            await wait_healthy(http, base)
            await viewer.join(http, base, "door")
            for k in range(1, rounds + 1):
                camera.seed = k * 100_003
                row = await _round(http, base, camera, viewer, k, record_s, check_s, live_s)
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        await viewer.pc.close()
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(10)
        log.close()
        rtsp.stop()
    report = format_report(rows, region, nights)
    (out / "report.md").write_text(report + "\n")
    (out / "rounds.json").write_text(json.dumps(rows, indent=1))
    return report
