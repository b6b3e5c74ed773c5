"""``edge-app infer-server``: start the shared Triton Inference Server (``models.triton_host``) on the model this
config serves, in its own environment (``.venv-triton``, made by ``tools/triton-env.sh``), replacing this process
so that signals reach Triton directly. ``EDGE_APP_TRITON_TOKEN`` in its environment is the token of Triton's
restricted endpoints (a client on the same host needs it to send frames through shared memory)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from edge_app.config import load_config
from edge_app.errors import EdgeAppError

ENV_VAR = "EDGE_APP_TRITON_PYTHON"


def triton_python() -> Path:
    """The Triton environment's interpreter: ``EDGE_APP_TRITON_PYTHON``, else ``.venv-triton`` beside the code."""
    import models

    root = Path(models.__file__).resolve().parent.parent
    py = Path(os.environ.get(ENV_VAR) or root / ".venv-triton" / "bin" / "python")
    if not py.exists():
        raise EdgeAppError(f"no Triton environment at {py}: make it with `bash tools/triton-env.sh` (PyTriton needs "
                           f"numpy < 2 and its own venv), or point {ENV_VAR} at one")
    return py


def command(args: argparse.Namespace) -> list[str]:
    from edge_app.factory import deployed_model

    folder = args.model or deployed_model(load_config(args.config))
    return [str(triton_python()), "-m", "models.triton_host", "--model", str(Path(folder).resolve()),
            "--address", args.address, "--grpc-port", str(args.grpc_port), "--http-port", str(args.http_port),
            "--metrics-port", str(args.metrics_port), "--max-batch", str(args.max_batch),
            "--queue-delay-us", str(args.queue_delay_us), "--threads", str(args.threads), "--max-queue",
            str(args.max_queue), "--load-headroom", str(args.load_headroom), "--providers", args.providers]


def cmd_infer_server(args: argparse.Namespace) -> int:
    import models

    argv = command(args)
    root = str(Path(models.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sys.stdout.flush()
    os.execve(argv[0], argv, env)
    return 0  # not reached


def add_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from edge_app.config import DEFAULT_CONFIG

    p = sub.add_parser("infer-server", help="a shared Triton Inference Server for the chain ([model.backend] kind = "
                                            "\"triton\" on the boxes that use it)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model to serve: this config's")
    p.add_argument("--model", type=Path, help="serve this model folder instead")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (0.0.0.0: other boxes on the LAN)")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002, help="Triton's Prometheus metrics")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--queue-delay-us", type=int, default=2000, help="the dynamic batcher's window")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--max-queue", type=int, default=64, help="frames waiting in Triton's queue at most; more are "
                   "rejected at once and answered from each box's cheap path (0: no limit)")
    p.add_argument("--providers", default="cpu", help="ONNX Runtime providers for the chain, in order: cpu, or "
                   "cuda,cpu on a GPU box (its .venv-triton made with EDGE_APP_TRITON_GPU=1)")
    p.add_argument("--load-headroom", type=float, default=0.85, help="the load governor here: the share of the "
                   "model's time that governed frames (boxes with [policy] adapt_to_load) may expect to use")
    p.set_defaults(func=cmd_infer_server)


def start_process(model: Path, grpc_port: int, http_port: int, metrics_port: int, log: Path,
                  queue_delay_us: int = 2000, access_token: str | None = None,
                  max_queue: int = 64, load_headroom: float = 0.85, max_batch: int = 32,
                  providers: str = "cpu") -> subprocess.Popen[bytes]:
    """``edge-app infer-server`` as a child in its own process group (tests, benchmarks); ``wait_ready`` next."""
    argv = [sys.executable, "-m", "edge_app", "infer-server", "--model", str(model), "--grpc-port", str(grpc_port),
            "--http-port", str(http_port), "--metrics-port", str(metrics_port), "--queue-delay-us",
            str(queue_delay_us), "--max-queue", str(max_queue), "--load-headroom", str(load_headroom), "--max-batch",
            str(max_batch), "--providers", providers]
    env = {**os.environ, **({"EDGE_APP_TRITON_TOKEN": access_token} if access_token else {})}
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def wait_ready(proc: subprocess.Popen[bytes], http_port: int, log: Path, timeout_s: float = 90.0) -> float:
    """Seconds until Triton says the chain's model is ready."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/edge_chain/ready", timeout=1):
                return time.monotonic() - t0
        except OSError:
            if proc.poll() is not None:
                raise EdgeAppError(f"infer-server exited: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)
    raise EdgeAppError(f"Triton was not ready within {timeout_s:.0f} s (see {log})")


def kill_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL the infer-server and the tritonserver it started (its whole process group)."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
