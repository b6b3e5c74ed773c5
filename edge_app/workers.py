"""``edge-app serve --workers N``: N media worker processes under one control process, on one box.

Each worker is an ordinary ``edge-app serve`` on a loopback port (``base_port + i``) with its shard of the
configuration (``shard``): camera k goes to worker k mod N, the demo camera to worker 0, each worker keeps its own
events under ``[events] path/worker-i``. A browser's media flows between the browser and the worker that answered
its offer (the worker's own ICE candidates); only HTTP passes the control process (``edge_app.doors.control``).
``Supervisor`` starts the workers, restarts one that dies (1 s, 2 s ... 30 s apart), and stops them with itself;
a worker also dies with its control process however that goes (SIGKILL included: ``die_with_parent``), so no
worker is left holding its port and its events for the next ``serve``.
Inference: one runner per worker on ONNX Runtime, or, where there is a GPU, one shared Triton for all of them
(``[model.backend] kind = "triton"``): never one CUDA session per worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from edge_app.config import AppConfig

log = logging.getLogger(__name__)

CONTROL_PID_ENV = "EDGE_APP_CONTROL_PID"  # the control process's pid, in each worker's environment
RESTART_S = (1.0, 30.0)
PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGTERM this process when ``parent_pid`` (the control process) dies, however it dies; at once if it is
    already gone. (``prctl(PR_SET_PDEATHSIG)`` from the worker itself: a ``preexec_fn`` is unsafe with threads.)"""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            log.warning("worker: prctl(PR_SET_PDEATHSIG) failed (errno %d): it may outlive its control process",
                        ctypes.get_errno())
    except (OSError, AttributeError) as exc:  # not Linux
        log.warning("worker: cannot ask to die with the control process (%s)", exc)
    if os.getppid() != parent_pid:  # the parent went before the request took effect
        log.warning("worker: the control process (pid %d) is gone; stopping", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)


def owner(cfg: AppConfig, camera: str, workers: int) -> int:
    """The worker that runs ``camera`` (the demo camera and unknown names: worker 0)."""
    names = [c.name for c in cfg.cameras]
    return names.index(camera) % workers if camera in names else 0


def shard(cfg: AppConfig, index: int, workers: int, port: int) -> AppConfig:
    """Worker ``index``'s configuration: its cameras, a loopback port, its own events folder; the control process
    in front of it is a trusted proxy (its X-Forwarded-For names the browser). With ONNX Runtime in each worker,
    several workers run it on the CPU: one CUDA session per worker would split the GPU N ways (a shared Triton is
    the GPU's way, ``serving.serve_workers`` says so)."""
    server = cfg.server.model_copy(update={"host": "127.0.0.1", "port": port, "cors_origins": [], "tls_cert": None,
                                           "tls_key": None,
                                           "trusted_proxies": [*cfg.server.trusted_proxies, "127.0.0.1"]})
    events = cfg.events.model_copy(update={"path": cfg.events.path / f"worker-{index}"})
    demo = cfg.demo if index == 0 else cfg.demo.model_copy(update={"enabled": False})
    cameras = [c for k, c in enumerate(cfg.cameras) if k % workers == index]
    m = cfg.mqtt  # one MQTT client per worker: its own id, and its cameras' availability is its own
    mqtt = m.model_copy(update={"client_id": f"{m.client_id}-w{index}"[:64],
                                "availability_topic": f"{m.prefix}/available/worker-{index}"})
    model = cfg.model
    if workers > 1 and model.backend.kind == "onnxruntime":
        model = model.model_copy(update={"providers": ["cpu"]})
    return cfg.model_copy(update={"server": server, "events": events, "demo": demo, "cameras": cameras,
                                  "mqtt": mqtt, "model": model})


@dataclass
class Worker:
    index: int
    port: int
    proc: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0
    restarts: int = 0
    exits: list[int] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The live process's pid (None while it is down): a session placed on another pid died with it."""
        return self.proc.pid if self.alive else None  # type: ignore[union-attr]

    def status(self) -> dict[str, object]:
        return {"index": self.index, "port": self.port, "pid": self.pid,
                "alive": self.alive, "restarts": self.restarts, "last_exit": self.exits[-1] if self.exits else None}


class Supervisor:
    def __init__(self, config_path: Path, workers: int, base_port: int, log_dir: Path | None = None) -> None:
        self.config_path = config_path
        self.workers = [Worker(i, base_port + i) for i in range(workers)]
        self.log_dir = log_dir
        self.stopping = False

    def command(self, w: Worker) -> list[str]:
        return [sys.executable, "-m", "edge_app", "serve", "--config", str(self.config_path), "--worker",
                f"{w.index}/{len(self.workers)}", "--port", str(w.port)]

    def start(self, w: Worker) -> None:
        out = None if self.log_dir is None else (self.log_dir / f"worker-{w.index}.log").open("ab")
        w.proc = subprocess.Popen(self.command(w), stdout=out, stderr=subprocess.STDOUT if out else None,
                                  env={**os.environ, CONTROL_PID_ENV: str(os.getpid())})
        w.started_s = time.monotonic()
        log.info("worker %d: started (pid %d, 127.0.0.1:%d)", w.index, w.proc.pid, w.port)

    async def run(self) -> None:
        """Start every worker and restart the ones that die, until cancelled."""
        for w in self.workers:
            self.start(w)
        backoff = {w.index: RESTART_S[0] for w in self.workers}
        while True:
            await asyncio.sleep(0.2)
            for w in self.workers:
                if w.proc is None or w.proc.poll() is None or self.stopping:
                    continue
                code = w.proc.returncode
                w.exits.append(code)
                w.proc = None
                if time.monotonic() - w.started_s > 60:
                    backoff[w.index] = RESTART_S[0]  # it had run a while: not a crash loop
                log.warning("worker %d exited (status %d): its cameras and sessions are gone; restarting in "
                            "%.0f s", w.index, code, backoff[w.index])
                asyncio.get_running_loop().call_later(backoff[w.index], self._restart, w)
                backoff[w.index] = min(RESTART_S[1], backoff[w.index] * 2)

    def _restart(self, w: Worker) -> None:
        if not self.stopping and w.proc is None:
            w.restarts += 1
            self.start(w)

    async def stop(self, timeout_s: float = 10.0) -> None:
        self.stopping = True
        for w in self.workers:
            if w.alive:
                w.proc.terminate()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        for w in self.workers:
            while w.alive and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if w.alive:
                w.proc.kill()  # type: ignore[union-attr]
