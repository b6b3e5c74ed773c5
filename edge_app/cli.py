"""``edge-app``: serve, export, bench-model."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from edge_app.config import DEFAULT_CONFIG, ConfigError, load_config
from edge_app.errors import EdgeAppError
from edge_app.factory import CODEC_KBPS, inference_service, model_args, model_dir
from edge_app.serving import serve, setup_logging
from models.errors import ModelError

log = logging.getLogger("edge_app")


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.workers > 1:
        from edge_app.serving import serve_workers

        return serve_workers(cfg, args.config, args.workers, args.host, args.port)
    if args.worker:  # "i/N": one media worker of serve --workers N (its shard, on the port given)
        import os

        from edge_app.workers import CONTROL_PID_ENV, die_with_parent, shard

        if os.environ.get(CONTROL_PID_ENV, "").isdigit():
            die_with_parent(int(os.environ[CONTROL_PID_ENV]))
        index, _, count = args.worker.partition("/")
        cfg = shard(cfg, int(index), int(count), args.port)
    return serve(cfg, args.host, args.port, inference_service)


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
        from models.policy_store import fit_policy

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


def cmd_fit_policy(args: argparse.Namespace) -> int:
    from models.errors import PolicyError
    from models.folder import policy_meta
    from models.policy_store import fit_policy

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
    s.add_argument("--workers", type=int, default=1, help="media worker processes behind one control process "
                   "(cameras sharded across them); 1: everything in this process")
    s.add_argument("--worker", help=argparse.SUPPRESS)  # i/N, set by the control process
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
    from edge_app.infer_server import add_command

    add_command(sub)
    if with_tools:
        from edge_app.bench.commands import add_tool_commands

        add_tool_commands(sub)
    return ap


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
    except (ModelError, EdgeAppError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
