"""The Triton runner against a real Triton Inference Server (``edge-app infer-server``: PyTriton's bundled Triton
2.51, in its own environment): the same answers as the local runner on the same frames; Triton killed mid-run and
started again, answers going on from the cheap path meanwhile; the app served through it. And every policy as data,
round-tripped exactly."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from support.live import DEFAULT_MODEL, REPO, running_app, skip_or_fail

from edge_app.bench.triton import same as same_answers
from edge_app.config import AppConfig
from edge_app.infer_server import kill_process, start_process, wait_ready
from models.folder import policy_meta
from models.policies import BudgetGreedy, ConfidenceThreshold, EntropyThreshold, FixedExit, Patience
from models.policy_store import configured_policy
from models.policy_wire import decode_policy, encode_policy, policy_key
from models.service import ChainRequest, InferenceService, load_backend

TRITON_PY = REPO / ".venv-triton" / "bin" / "python"
TRITON_TOKEN = "triton-token-for-tests-0123456789"
HEADROOM = 0.02  # the server governor test's: 5 frames/s alone fit, 125 frames/s do not


def test_every_policy_round_trips_as_data() -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(11), size=(200, 3))
    for policy in (FixedExit(2), BudgetGreedy(), ConfidenceThreshold(0.8), EntropyThreshold(0.3), Patience(1),
                   configured_policy(DEFAULT_MODEL, "dynamic-index"), configured_policy(DEFAULT_MODEL, "auto")):
        blob = encode_policy(policy)
        back = decode_policy(blob)
        assert policy_key(encode_policy(back)) == policy_key(blob), policy
        for horizon in (1, 2, 3):
            for p in probs:
                runs = [pol.start(horizon) for pol in (policy, back)]
                stops = [[r.observe(p[k]) for k in range(horizon)] for r in runs]
                assert stops[0] == stops[1] and runs[0].choice == runs[1].choice


class Server:
    def __init__(self, log: Path) -> None:
        from support.mqtt import free_port

        self.log = log
        self.grpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def start(self, max_queue: int = 64, load_headroom: float = 0.85) -> float:
        self.proc = start_process(DEFAULT_MODEL, self.grpc, self.http, self.metrics, self.log,
                                  access_token=TRITON_TOKEN, max_queue=max_queue, load_headroom=load_headroom)
        return wait_ready(self.proc, self.http, self.log)

    def kill(self) -> None:
        kill_process(self.proc)  # PyTriton and the tritonserver it started
        self.proc = None

    def metric(self, name: str) -> float:
        from edge_app.bench.triton import metric

        return metric(self.metrics, name)


@pytest.fixture
def triton(tmp_path: Path) -> Iterator[Server]:
    if not TRITON_PY.exists():
        skip_or_fail("needs the Triton environment (bash tools/triton-env.sh; .ci/test makes it)")
    server = Server(tmp_path / "triton.log")
    ready = server.start()
    print(f"Triton ready in {ready:.1f} s")
    try:
        yield server
    finally:
        server.kill()


def _frames(folder: Path, n: int) -> list[np.ndarray]:
    with np.load(folder / "test.npz") as z:  # the demo data the tests build (conftest), as a fresh clone has none
        return list(z["images"][:n])


@pytest.mark.live
@pytest.mark.slow
async def test_the_triton_runner_answers_as_the_local_runner_and_goes_on_when_triton_is_killed(
        triton: Server, demo_data_dir: Path) -> None:
    from models.triton_runner import TritonRunner

    backend = load_backend("onnxruntime", DEFAULT_MODEL, ("cpu",), 1, 1)
    local, remote = InferenceService(backend), TritonRunner(backend, triton.url)
    shm = TritonRunner(backend, triton.url, shared_memory=True, access_token=TRITON_TOKEN)  # shared memory
    for runner in (local, remote, shm):
        runner.start()
    same = total = 0
    policies = [configured_policy(DEFAULT_MODEL, "auto"), configured_policy(DEFAULT_MODEL, "dynamic-index")]
    try:
        for img in _frames(demo_data_dir, 60):
            x = backend.preprocess(img)
            for policy in policies:
                for lo, hi in ((1, 3), (1, 2), (2, 3)):
                    a = await local.run(ChainRequest(x, policy, lo, hi))
                    b = await remote.run(ChainRequest(x, policy, lo, hi))
                    c = await shm.run(ChainRequest(x, policy, lo, hi))
                    total += 1
                    same += same_answers(a, b) and same_answers(a, c)
        up = dict(remote.counts)
        batches = triton.metric("nv_inference_exec_count")
        hung = await _hung(triton, remote, backend, policies[0], _frames(demo_data_dir, 60))
        triton.kill()  # mid-run: the frames go on, answered from the cheap path, each at once
        waits = []
        for img in _frames(demo_data_dir, 20):
            t0 = time.perf_counter()
            out = await remote.run(ChainRequest(backend.preprocess(img), policies[0], 1, 3, timeout_s=0.5))
            waits.append(time.perf_counter() - t0)
            assert len(out.results) == 1
        down = dict(remote.counts), remote.status()["state"]
        triton.start()  # a fresh server: it does not know the policy; the runner sends it again
        t0 = time.monotonic()
        while remote.status()["state"] != "up" and time.monotonic() - t0 < 10:  # the health check finds it
            await asyncio.sleep(0.05)
        back = await remote.run(ChainRequest(backend.preprocess(_frames(demo_data_dir, 1)[0]), policies[1], 1, 3))
        again = remote.status()
    finally:
        for runner in (remote, shm, local):
            await runner.stop()
    print(f"triton: {same} of {total} answers as the local runner's; {batches:.0f} executions; killed: {down}, "
          f"cheap-path waits max {1e3 * max(waits):.1f} ms; restarted: {again}")
    assert same == total and up["remote"] == total and up["cheap_path"] == 0 and shm.counts["remote"] == total
    assert hung["waited"] == TritonRunner.DOWN_AFTER and hung["state"] == "down", hung
    assert hung["after"] == "up" and hung["answered_after"] == 1, "SIGCONT: found serving, answered by Triton again"
    assert down[1] == "down" and down[0]["cheap_path"] == 20 + 75 and max(waits) < 1.0
    assert again["state"] == "up" and again["remote"] == total + 2 and len(back.results) >= 1


@pytest.mark.live
@pytest.mark.slow
async def test_a_full_triton_queue_rejects_at_once_and_every_frame_is_still_answered(
        tmp_path: Path, demo_data_dir: Path) -> None:
    """Triton with room for 1 waiting frame and a burst of 48 frames at once: the ones it rejects are answered from
    the cheap path (counted ``rejected``), none waits for the others, every frame gets an answer."""
    from models.triton_runner import TritonRunner

    if not TRITON_PY.exists():
        skip_or_fail("needs the Triton environment (bash tools/triton-env.sh; .ci/test makes it)")
    server = Server(tmp_path / "triton.log")
    server.start(max_queue=1)
    backend = load_backend("onnxruntime", DEFAULT_MODEL, ("cpu",), 1, 1)
    remote = TritonRunner(backend, server.url)
    remote.start()
    policy = configured_policy(DEFAULT_MODEL, "auto")
    try:
        xs = [backend.preprocess(img) for img in _frames(demo_data_dir, 48)]
        await remote.run(ChainRequest(xs[0], policy, 1, 3))  # connected, the policy known
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(remote.run(ChainRequest(x, policy, 1, 3, timeout_s=2.0)) for x in xs))
        wall = time.perf_counter() - t0
    finally:
        await remote.stop()
        server.kill()
    print(f"full queue: {remote.counts} in {wall * 1e3:.0f} ms for 48 frames at once")
    assert len(outs) == 48 and all(len(o.results) >= 1 for o in outs)
    assert remote.counts["rejected"] >= 1 and remote.counts["timeout"] == 0
    assert remote.counts["remote"] + remote.counts["cheap_path"] == 49 and wall < 2.0


@pytest.mark.live
@pytest.mark.slow
async def test_the_app_serves_through_triton_and_goes_on_when_it_is_killed(
        triton: Server, app_config: Callable[..., AppConfig]) -> None:
    from edge_app.config import load_config

    cfg = app_config(demo={"enabled": True, "fps": 15.0})
    path = cfg.base_dir / "config.toml"
    path.write_text(path.read_text() + f'\n[model.backend]\nkind = "triton"\nurl = "{triton.url}"\n')
    cfg = load_config(path)
    async with running_app(cfg) as base, aiohttp.ClientSession() as http:
        await asyncio.sleep(4.0)
        up = await _status(http, base)
        async with http.get(base + "/status") as r:
            point = (await r.json())["operating_point"]  # chosen by the server's governor, which sees every box
        triton.kill()  # mid-session: the camera's frames go on, answered from the cheap path
        await asyncio.sleep(3.0)
        down = await _status(http, base)
        triton.start()
        await asyncio.sleep(3.0)
        back = await _status(http, base)
    print(f"app through Triton: up {json.dumps(up[0])}; down {json.dumps(down[0])}; back {json.dumps(back[0])}; "
          f"demo: the model ran {up[1]} / {down[1]} / {back[1]} frames")
    # every frame the model ran went to Triton while it was up (one may be on its way), and none took the cheap path
    assert up[0]["kind"] == "triton" and up[0]["state"] == "up" and up[0]["cheap_path"] == 0
    assert up[1] - 1 <= up[0]["remote"] <= up[1] and up[1] >= 4, (up, "a picture a second: 4 s, 4 runs at least")
    # the server counts the frames it is sent: exit 0 answers the others on the box (15 fps, a picture a second)
    assert point["where"] == "server" and point["index"] == 0 and 0 < point["arrival_fps"] <= 20, point
    assert down[0]["state"] == "down" and down[1] - up[1] >= 3, "3 s without Triton: the camera still analysed"
    assert down[0]["cheap_path"] >= down[1] - up[1] - 1, "... each run here, from the cheap path"
    assert back[0]["state"] == "up" and back[0]["remote"] > down[0]["remote"] and back[1] - down[1] >= 3


async def _status(http: aiohttp.ClientSession, base: str) -> tuple[dict[str, Any], int]:
    """(the runner's status, the demo camera's frames the model ran: exit 0's answers never reach a runner)."""
    async with http.get(base + "/status") as r:
        status: dict[str, Any] = await r.json()
    demo = next(c for c in status["cameras"] if c["name"] == "demo")
    answers = demo["answers"]
    return status["model"]["runner"], int(demo["frames_analysed"] - answers["unchanged"] - answers["reused"])


@pytest.mark.live
@pytest.mark.slow
async def test_triton_down_at_start_is_said_and_frames_run_here_at_the_configured_point_until_it_comes(
        tmp_path: Path, app_config: Callable[..., AppConfig], caplog: pytest.LogCaptureFixture) -> None:
    """The app starts while its Triton is not there: one line says so, ``/status`` says ``down``, the demo camera's
    frames run here with their own policy up to ``fallback_max_exit`` (2: segment 2 runs, segment 3 never); Triton
    started later is used within a second or so."""
    from edge_app.config import load_config

    if not TRITON_PY.exists():
        skip_or_fail("needs the Triton environment (bash tools/triton-env.sh; .ci/test makes it)")
    server = Server(tmp_path / "triton.log")  # its ports chosen, nothing started yet
    cfg = app_config(demo={"enabled": True, "fps": 15.0})
    path = cfg.base_dir / "config.toml"
    path.write_text(path.read_text() + f'\n[model.backend]\nkind = "triton"\nurl = "{server.url}"\n'
                    'fallback_max_exit = 2\n')
    cfg = load_config(path)
    try:
        async with running_app(cfg) as base, aiohttp.ClientSession() as http:
            await asyncio.sleep(4.0)
            down, runs_down = await _status(http, base), await _segment_runs(http, base)
            await asyncio.to_thread(server.start)  # the app's loop goes on meanwhile
            t0 = time.monotonic()
            while (await _status(http, base))[0]["state"] != "up" and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.1)
            back_s = time.monotonic() - t0
            await asyncio.sleep(2.0)
            back = await _status(http, base)
    finally:
        if server.proc is not None:
            server.kill()
    said = [r.getMessage() for r in caplog.records if "is not serving" in r.getMessage()]
    print(f"Triton down at start: {said}; down {json.dumps(down[0])}, segment runs {runs_down}; used again "
          f"{back_s:.2f} s after it was ready; back {json.dumps(back[0])}")
    assert len(said) == 1 and server.url in said[0] and "up to exit 2" in said[0]
    assert down[0]["state"] == "down" and down[0]["last_error"].startswith("unavailable")
    assert down[0]["remote"] == 0 and down[0]["cheap_path"] >= down[1] - 1 and down[1] >= 4, down
    assert runs_down[2] > 0 and runs_down[3] == 0, "the configured point: exits 1 and 2 here, never 3"
    # every frame the model ran was answered by Triton or, while it was down, here (one may be on its way); exit 0
    # answers the rest on the box, so 2 s of a picture a second put at least 2 through Triton (30 frames before it)
    assert back[0]["state"] == "up" and back_s < 1.5
    assert back[1] - 1 <= back[0]["remote"] + back[0]["cheap_path"] <= back[1] and back[0]["remote"] >= 2, back


async def test_a_server_that_never_answers_is_marked_down_after_a_few_frames_and_not_waited_for_again(
        demo_data_dir: Path) -> None:
    """A Triton address whose host takes the connection and never answers, before it ever answered: the first
    frame runs out its time and the runner is ``down`` at once; the next frames (a 20 fps camera for 2 s) take the
    cheap path without waiting, while the health check in the background keeps asking. (A server that answered and
    then hangs is marked down after ``DOWN_AFTER`` frames out of time: the Triton test stops one with SIGSTOP.)"""
    import socket

    from models.triton_runner import TritonRunner

    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(64)  # the kernel completes the handshakes; nothing ever reads or answers
    backend = load_backend("onnxruntime", DEFAULT_MODEL, ("cpu",), 1, 1)
    remote = TritonRunner(backend, f"127.0.0.1:{mute.getsockname()[1]}")
    remote.start()
    policy = configured_policy(DEFAULT_MODEL, "auto")
    waits = []
    t_start = time.perf_counter()
    try:
        for i, img in enumerate(_frames(demo_data_dir, 40)):
            await asyncio.sleep(max(0.0, t_start + i / 20 - time.perf_counter()))
            t0 = time.perf_counter()
            out = await remote.run(ChainRequest(backend.preprocess(img), policy, 1, 3, timeout_s=0.05))
            waits.append(time.perf_counter() - t0)
            assert len(out.results) == 1
    finally:
        await remote.stop()
        mute.close()
    status = remote.status()
    slow = sum(w >= 0.05 for w in waits)
    print(f"mute server: {status}; {slow} of 40 frames waited out their 50 ms; the rest at most "
          f"{1e3 * max(waits[TritonRunner.DOWN_AFTER:]):.1f} ms")
    assert status["state"] == "down" and status["last_error"].startswith("timeout")
    assert status["cheap_path"] == 40 and status["remote"] == 0
    assert waits[0] >= 0.05 and status["timeout"] == 1, "the first frame waits its whole budget"
    assert slow == 1, "then no frame waits: the health check asks, in the background"
    assert status["health_checks"] >= 2, status


@pytest.mark.live
@pytest.mark.slow
async def test_the_shared_servers_governor_sees_every_boxs_frames(tmp_path: Path, demo_data_dir: Path) -> None:
    """Two boxes govern through one Triton. Box A sends one camera at 5 frames/s throughout; box B adds 12 cameras at
    10 frames/s each for a while. A's own rate never changes, so a governor on A would keep its most accurate point;
    the server's, which sees both boxes, moves A's frames to a cheaper point while B sends, and tells A so.
    (``--load-headroom`` is set low so that this CPU box's sub-millisecond frames amount to a load.)"""
    from models.triton_runner import TritonRunner

    if not TRITON_PY.exists():
        skip_or_fail("needs the Triton environment (bash tools/triton-env.sh; .ci/test makes it)")
    server = Server(tmp_path / "triton.log")
    server.start(load_headroom=HEADROOM)
    backend = load_backend("onnxruntime", DEFAULT_MODEL, ("cpu",), 1, 1)
    a, b = TritonRunner(backend, server.url), TritonRunner(backend, server.url)
    a.client_id, b.client_id = "box-a", "box-b"
    # the single-frame choice (a threshold: its points are lower thresholds); what is tested is that the server's
    # governor sees both boxes, whatever the policy
    policy = ConfidenceThreshold(float(policy_meta(DEFAULT_MODEL)["default"]["per_frame"]["threshold"]))
    xs = [backend.preprocess(img) for img in _frames(demo_data_dir, 30)]
    seen: list[tuple[float, str, dict[str, Any]]] = []

    async def camera(runner: TritonRunner, name: str, fps: float, seconds: float) -> None:
        t0 = time.monotonic()
        for i in range(int(seconds * fps)):
            await runner.run(ChainRequest(xs[i % len(xs)], policy, 1, 3, timeout_s=0.5, source=name))
            if runner is a:
                seen.append((time.monotonic(), "a", dict(a.server_load.answer)))
            await asyncio.sleep(max(0.0, t0 + (i + 1) / fps - time.monotonic()))

    for r in (a, b):
        r.server_load.govern()
        r.start()
    try:
        await camera(a, "cam", 5.0, 1.0)  # its points solved on the first frame
        t0 = time.monotonic()
        await asyncio.gather(camera(a, "cam", 5.0, 9.0),
                             *(camera(b, f"cam{j}", 10.0, 4.0) for j in range(12)))
    finally:
        for r in (a, b):
            await r.stop()
        server.kill()
    alone = [g for t, _, g in seen if t < t0]
    shared = [g for t, _, g in seen if t0 + 2.0 <= t < t0 + 4.0]
    after = [g for t, _, g in seen if t >= t0 + 8.0]
    print(f"server governor, A's view: alone {alone[-1]}; while B sends {shared[-1]} (indices "
          f"{sorted({g['index'] for g in shared})}); after {after[-1]}; B's last {b.server_load.answer}")
    assert a.counts["remote"] == len(seen) and a.counts["cheap_path"] == 0
    assert alone[-1]["index"] == 0 and alone[-1]["arrival_fps"] <= 10
    assert all(g["arrival_fps"] >= 60 for g in shared), "the server counts both boxes' frames"
    assert min(g["index"] for g in shared) > 0, "A's frames at a cheaper point while B sends"
    assert after[-1]["index"] < max(g["index"] for g in shared), "and dearer again once B stops"


async def _hung(triton: Server, remote: Any, backend: Any, policy: Any, frames: list[np.ndarray]) -> dict[str, Any]:
    """Triton stopped (SIGSTOP: its connections open, nothing answered) for a 5 s freeze of a 15 fps camera (75
    frames, 50 ms each): the first ``DOWN_AFTER`` wait out their time, then the runner is down and none of the others
    waits (before, one frame every 0.5 s tried again and waited out its whole budget). SIGCONT: the health check finds
    it serving with no frame sent, and the next frame is Triton's again."""
    import os
    import signal

    assert triton.proc is not None
    os.killpg(triton.proc.pid, signal.SIGSTOP)
    waited = 0
    t_start = time.perf_counter()
    try:
        for i in range(75):
            await asyncio.sleep(max(0.0, t_start + i / 15 - time.perf_counter()))
            t0 = time.perf_counter()
            await remote.run(ChainRequest(backend.preprocess(frames[i % len(frames)]), policy, 1, 3, timeout_s=0.05))
            waited += time.perf_counter() - t0 >= 0.05
        state = remote.status()["state"]
    finally:
        os.killpg(triton.proc.pid, signal.SIGCONT)
    t0 = time.perf_counter()
    while remote.status()["state"] != "up" and time.perf_counter() - t0 < 10:
        await asyncio.sleep(0.05)
    up_s = time.perf_counter() - t0
    remote_before = remote.counts["remote"]
    await remote.run(ChainRequest(backend.preprocess(frames[0]), policy, 1, 3, timeout_s=2.0))
    return {"waited": waited, "state": state, "after": remote.status()["state"], "up_s": up_s,
            "answered_after": remote.counts["remote"] - remote_before, "counts": dict(remote.counts)}


async def _segment_runs(http: aiohttp.ClientSession, base: str) -> dict[int, float]:
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(base + "/metrics") as r:
        text = await r.text()
    runs = {1: 0.0, 2: 0.0, 3: 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "edge_segment_runs_total":
                runs[int(s.labels["segment"])] = s.value
    return runs
