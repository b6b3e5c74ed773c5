"""What the commands build from a config: the model's runtime, the inference service, the model to serve; the
arguments every model command takes. ``edge_app.cli`` and the benchmarks (``edge_app.bench.commands``) both use
these, so neither imports the other."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from edge_app.config import DEFAULT_CONFIG, AppConfig, load_config

log = logging.getLogger("edge_app")
DEMO_TEST_SPLIT = Path("data/demo/test.npz")  # written by python -m exporter data
CODEC_KBPS = 250.0  # VP8-coded traces: [budget] min_receive_kbps, the least the browser is asked to send


def load_runtime(cfg: AppConfig, threads: int | None = None, folder: Path | None = None):  # type: ignore[no-untyped-def]
    """The model's runtime alone (offline tools and benchmarks that run it frame by frame)."""
    from models.runtime import ModelRuntime

    return ModelRuntime.load(folder or cfg.model_path, providers=cfg.model.providers,
                             threads=cfg.model.threads if threads is None else threads,
                             warmup=cfg.model.warmup_runs, device_id=cfg.model.cuda_device)


def inference_service(cfg: AppConfig):  # type: ignore[no-untyped-def]
    """The box's default model in the runner ``[model.backend] kind`` names (``models.runners``)."""
    from models.runners import make_runner
    from models.service import load_backend

    m = cfg.model
    backend = load_backend("onnxruntime", deployed_model(cfg), m.providers, m.threads, m.warmup_runs, m.cuda_device)
    return make_runner(m.backend.kind, backend, m.model_dump())


def deployed_model(cfg: AppConfig) -> Path:
    """The model to serve: the one last deployed from the page ([training] models_dir), else [model] path."""
    from models.errors import RegistryError
    from models.registry import DEFAULT, ModelRegistry

    reg = ModelRegistry(cfg.resolve(cfg.training.models_dir), cfg.model_path)
    if reg.active == DEFAULT:
        return cfg.model_path
    try:
        folder = reg.validate(reg.active)
    except RegistryError as exc:
        log.warning("the deployed model cannot be served (%s); serving [model] path %s", exc.reason, cfg.model_path)
        return cfg.model_path
    log.info("serving the model deployed from the page: %s (%s)", reg.active, folder)
    return folder


def model_dir(args: argparse.Namespace) -> Path:
    return args.model if args.model is not None else load_config(args.config).model_path


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--model", type=Path, help="model folder (default: [model] path of the config)")
