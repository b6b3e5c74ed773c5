"""``edge-app infer-server``: start the shared Triton Inference Server (``models.triton_host``) on the model this
config serves, in its own environment (``.venv-triton``, made by ``tools/triton-env.sh``), replacing this process
so that signals reach Triton directly."""

from __future__ import annotations

import argparse
import os
import sys
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
            "--queue-delay-us", str(args.queue_delay_us), "--threads", str(args.threads)]


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
    p.set_defaults(func=cmd_infer_server)
