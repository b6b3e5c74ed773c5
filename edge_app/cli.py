"""``edge-app``: serve, export, bench-model."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_app.config import DEFAULT_CONFIG, AppConfig, ConfigError, load_config
from models.errors import ModelError
from streams.redact import RedactingFilter

log = logging.getLogger("edge_app")
DEMO_TEST_SPLIT = Path("data/demo/test.npz")  # written by python -m exporter data


def load_runtime(cfg: AppConfig, threads: int | None = None, folder: Path | None = None):  # type: ignore[no-untyped-def]
    """The model's runtime alone (offline tools and benchmarks that run it frame by frame)."""
    from models.runtime import ModelRuntime

    return ModelRuntime.load(folder or cfg.model_path, providers=cfg.model.providers,
                             threads=cfg.model.threads if threads is None else threads,
                             warmup=cfg.model.warmup_runs, device_id=cfg.model.cuda_device)


def inference_service(cfg: AppConfig):  # type: ignore[no-untyped-def]
    """The configured backend inside the inference service the app's pipelines share."""
    from models.service import InferenceService, load_backend

    m = cfg.model
    backend = load_backend(m.backend, deployed_model(cfg), m.providers, m.threads, m.warmup_runs, m.cuda_device)
    return InferenceService(backend, m.workers, m.cost_window, m.batch_window_ms, m.max_batch)


def deployed_model(cfg: AppConfig) -> Path:
    """The model to serve: the one last deployed from the page ([training] models_dir), else [model] path."""
    from edge_app.teach.registry import DEFAULT, ModelRegistry
    from edge_app.teach.store import DatasetError

    reg = ModelRegistry(cfg.resolve(cfg.training.models_dir), cfg.model_path)
    if reg.active == DEFAULT:
        return cfg.model_path
    try:
        folder = reg.validate(reg.active)
    except DatasetError as exc:
        log.warning("the deployed model cannot be served (%s); serving [model] path %s", exc.reason, cfg.model_path)
        return cfg.model_path
    log.info("serving the model deployed from the page: %s (%s)", reg.active, folder)
    return folder


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    return serve(cfg, args.host, args.port, inference_service)


def serve(cfg: AppConfig, host_arg: str | None, port_arg: int | None,
          make_service: Callable[[AppConfig], Any]) -> int:
    """Serve until signalled; ``make_service(cfg)`` builds the inference service (benchmarks pass an emulated one)."""
    import asyncio

    from edge_app.access import TOKEN_ENV, effective_token, is_loopback, tls_context
    from edge_app.server import create_app
    from edge_app.serving import ListenError, serve_until_signalled

    host = host_arg or cfg.server.host
    port = cfg.server.port if port_arg is None else port_arg
    token = effective_token(cfg)
    tls = tls_context(cfg)
    if not is_loopback(host) and token is None:
        log.warning("serving %s without a token: anyone who can reach it can watch the cameras "
                    "(set [server] token or %s)", host, TOKEN_ENV)
    if not is_loopback(host) and tls is None:
        log.warning("serving %s over plain HTTP: browsers on other machines will refuse the camera "
                    "(set [server] tls_cert and tls_key)", host)
    service = make_service(cfg)
    app = create_app(cfg, service, token)
    log.info("model %s on %s; %s", service.backend.manifest.name, service.backend.device_name,
             "token required" if token else "no token")
    try:
        asyncio.run(serve_until_signalled(app, host, port, tls, cfg.server.shutdown_timeout_s))
    except ListenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


CODEC_KBPS = 250.0  # VP8-coded traces: [budget] min_receive_kbps, the least the browser is asked to send


def cmd_export(args: argparse.Namespace) -> int:
    import importlib.util
    import subprocess

    missing = [m for m in ("torch", "torchvision", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"error: the exporter needs the train extra (missing: {', '.join(missing)}); install it with: "
              "pip install -e '.[train]'", file=sys.stderr)
        return 2
    rest = args.rest or ["all"]
    rc = subprocess.run([sys.executable, "-m", "exporter", *rest], check=False).returncode  # its own process
    if rc == 0 and rest[0] in ("export", "all"):
        from models.fit import fit_policy

        out = argparse.ArgumentParser(add_help=False)
        out.add_argument("--out", type=Path, default=Path("models/default"))
        out.add_argument("--data", type=Path, default=Path("data/demo"))
        known = out.parse_known_args(rest[1:])[0]
        folder, data = known.out, known.data
        if (data / "calibration.npz").is_file() and (data / "test.npz").is_file():
            from edge_app.bench.codec_traces import write_codec_traces

            write_codec_traces(folder, data, CODEC_KBPS)  # the policy is fitted on frames as VP8 delivers them
        else:
            print(f"{data} is not a demo data folder: no VP8-coded traces; the policy is fitted on clean frames")
        info = fit_policy(folder)
        print(f"fitted the dynamic index beside the model: lam={info['lam']:.4f} ({folder / 'policy.json'})")
    return rc


def model_dir(args: argparse.Namespace) -> Path:
    return args.model if args.model is not None else load_config(args.config).model_path


def cmd_fit_policy(args: argparse.Namespace) -> int:
    from models.errors import PolicyError
    from models.fit import fit_policy
    from models.folder import policy_meta

    folder = model_dir(args)
    floor = args.min_exit
    if floor is None:
        try:
            floor = int(policy_meta(folder).get("min_exit", 1))
        except PolicyError:
            floor = 1
    info = fit_policy(folder, bins=args.bins, lam=args.lam, target_accuracy=args.target_accuracy,
                      loss_kind=args.loss_kind, traces=args.traces, min_exit=floor)
    print(f"floor exit {info['min_exit']}, lam={info['lam']:.4f}, loss {info['loss_kind']}, "
          f"{info['calibration_traces']} traces: "
          f"calibration accuracy {info['calibration_accuracy']:.4f} "
          f"(final exit {info['calibration_final_exit_accuracy']:.4f}) at {info['calibration_cost']:.3f} of "
          f"full-depth cost; fitted on {info['calibration_frames']} frames in {info['fit_seconds']:.2f} s")
    return 0


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--model", type=Path, help="model folder (default: [model] path of the config)")


def build_parser(with_tools: bool = True) -> argparse.ArgumentParser:
    """``serve``, ``export`` and ``fit-policy`` here; the benchmarks and offline tools come from
    ``edge_app.bench.commands``, imported only when a command other than ``serve`` runs."""
    ap = argparse.ArgumentParser(prog="edge-app", description="Latency-adaptive early-exit video analytics.")
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the server")
    s.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    s.add_argument("--host", help="override [server] host")
    s.add_argument("--port", type=int, help="override [server] port")
    s.set_defaults(func=cmd_serve)
    f = sub.add_parser("fit-policy", help="fit the dynamic index on the calibration traces, write policy.json")
    model_args(f)
    f.add_argument("--bins", type=int, default=8, help="confidence bins per exit")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--lam", type=float, help="weight of loss against cost, in [0, 1]")
    g.add_argument("--target-accuracy", type=float,
                   help="choose lam: cheapest policy reaching this calibration accuracy (default: final - 1 point)")
    f.add_argument("--loss-kind", choices=["auto", "error", "one-minus-confidence"], default="auto",
                   help="node loss: calibrated error, 1 - confidence, or whichever is cheaper on calibration")
    f.add_argument("--traces", choices=["auto", "clean", "vp8"], default="auto",
                   help="calibration traces: the data set's frames, or as VP8 delivers them (edge-app codec-traces); "
                        "auto: vp8 when the model has them")
    f.add_argument("--min-exit", type=int, help="the policy's floor: never answer from a shallower exit (default: "
                   "the floor of the policy.json there now, else 1; a taught model's comes from its check)")
    f.set_defaults(func=cmd_fit_policy)
    e = sub.add_parser("export", help="build data, train and export a model folder (python -m exporter ...)")
    e.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for python -m exporter (default: all)")
    e.set_defaults(func=cmd_export)
    if with_tools:
        from edge_app.bench.commands import add_tool_commands

        add_tool_commands(sub)
    return ap


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # no secret reaches a log line, whoever wrote it
        handler.addFilter(RedactingFilter())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(with_tools=command != "serve").parse_args(argv)  # serve imports no benchmark code
    setup_logging(args.verbose)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
