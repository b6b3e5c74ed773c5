"""``python -m exporter``: build the demo data, train the three-exit VGG, export a model folder.

    python -m exporter data   --out data/demo
    python -m exporter train  --data data/demo --out build/vgg.pt
    python -m exporter export --checkpoint build/vgg.pt --data data/demo --out models/default
    python -m exporter all    --out models/default          # the three in a row
    python -m exporter score  --checkpoint build/a.pt build/b.pt   # per-exit accuracy: pick one to export
    python -m exporter average --checkpoint build/a.pt build/b.pt --out build/soup.pt  # weight average
    python -m exporter diagnose --model models/default      # where the final exit loses accuracy
    python -m exporter ensemble --split data/select/calibration.npz  # would combining the last two exits help
    python -m exporter recover --model models/default --out build/default.pt  # fine-tune it further (--init)
    python -m exporter widen  --checkpoint build/a.pt --width 0.625 --out build/wide.pt  # same function, wider
    python -m exporter batchify --model models/default      # segments that take a batch of frames
    python -m exporter data   --size 224 --shards 16 --out data/demo224   # larger frames, drawn on 16 cores
    python -m exporter train  --init build/a.pt --data data/demo224 --device cuda   # fine-tune at 224 px on a GPU

``--data`` may also be a torchvision ImageFolder root with ``train/``,
``calibration/`` and ``test/`` sub-folders (each ``CLASS_NAME/*.jpg``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from exporter.demo_data import IMAGE_SIZE, RECIPE, RECIPES
from exporter.vgg import VGG_CONFIGS

log = logging.getLogger("exporter")


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="vgg11", choices=sorted(VGG_CONFIGS))
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--loss-weights", type=float, nargs=3, default=(0.3, 0.3, 1.0), metavar=("W1", "W2", "W3"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--init", type=Path, help="start from this checkpoint's weights (fine-tune) instead of scratch; "
                                             "it may have been trained at another input size")
    p.add_argument("--input-size", type=int, default=None,
                   help="model input side in px, a multiple of 32 (default: the demo frames' size, or 96 for an "
                        "ImageFolder)")
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when torch sees a GPU, else CPU), cpu, cuda or cuda:N (default auto)")
    p.add_argument("--workers", type=int, default=0,
                   help="processes preparing batches (default 0: the training process does; on a GPU, ~8 keep it fed)")


def _add_weights_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", choices=("float16", "float32"), default="float16",
                   help="how the segments store their weights: float16 (half the size; ONNX Runtime casts them to "
                        "float32 when it loads a segment, so inference is float32 at the same speed) or float32 "
                        "(default float16)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m exporter", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="build the demo data set (digits on photos)")
    d.add_argument("--out", type=Path, default=Path("data/demo"))
    d.add_argument("--cache", type=Path, default=Path("data/cache"))
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--count", type=int, nargs=3, metavar=("TRAIN", "CALIB", "TEST"))
    d.add_argument("--recipe", type=int, default=RECIPE, choices=RECIPES,
                   help="how training frames are drawn (calibration and test never change): 2 clutter, 3 also "
                        "redrawn digits, 4 also round objects and more photos, 5 also generated textures "
                        f"(default {RECIPE})")
    d.add_argument("--size", type=int, default=IMAGE_SIZE,
                   help=f"frame side in px (default {IMAGE_SIZE}); a model trained on them takes this input size")
    d.add_argument("--shards", type=int, default=1,
                   help="draw the training split as this many independent pieces in parallel processes (a different "
                        "but equally drawn split; the same for a given number of shards on any machine)")
    d.add_argument("--reshape-p", type=float, default=None,
                   help="override the share of training digits redrawn (recipe 3 and later: 0.8)")
    t = sub.add_parser("train", help="train jointly and save a checkpoint")
    t.add_argument("--data", type=Path, default=Path("data/demo"))
    t.add_argument("--out", type=Path, default=Path("build/vgg.pt"))
    _add_train_args(t)
    e = sub.add_parser("export", help="write a model folder from a checkpoint")
    e.add_argument("--checkpoint", type=Path, default=Path("build/vgg.pt"))
    e.add_argument("--data", type=Path, default=Path("data/demo"))
    e.add_argument("--out", type=Path, default=Path("models/default"))
    _add_weights_arg(e)
    c = sub.add_parser("score", help="per-exit accuracy of checkpoints on the calibration and test splits")
    c.add_argument("--checkpoint", type=Path, nargs="+", required=True)
    c.add_argument("--data", type=Path, default=Path("data/demo"))
    c.add_argument("--split", action="append", choices=("calibration", "test"),
                   help="score only this split (repeatable; default both)")
    c.add_argument("--input-size", type=int, default=None,
                   help="score the weights at this input size (the data's frames must be that size)")
    v = sub.add_parser("average", help="average the weights of checkpoints fine-tuned from one start (a model soup)")
    v.add_argument("--checkpoint", type=Path, nargs="+", required=True)
    v.add_argument("--data", type=Path, default=Path("data/demo"),
                   help="its train split's frames re-derive the batch norms' statistics")
    v.add_argument("--out", type=Path, default=Path("build/soup.pt"))
    a = sub.add_parser("all", help="data, train and export in a row")
    a.add_argument("--data", type=Path, default=Path("data/demo"))
    a.add_argument("--cache", type=Path, default=Path("data/cache"))
    a.add_argument("--checkpoint", type=Path, default=Path("build/vgg.pt"))
    a.add_argument("--out", type=Path, default=Path("models/default"))
    _add_weights_arg(a)
    _add_train_args(a)
    g = sub.add_parser("diagnose", help="accuracy by test photo, and on seen vs unseen digits")
    g.add_argument("--model", type=Path, default=Path("models/default"))
    g.add_argument("--data", type=Path, default=Path("data/demo"))
    g.add_argument("--cache", type=Path, default=Path("data/cache"))
    g.add_argument("--count", type=int, default=2000, help="fresh frames drawn for each of seen / unseen digits")
    en = sub.add_parser("ensemble", help="final-exit accuracy if it also read the exit before it "
                                         "(Zero Time Waste-style ensembles of the last two exits), per weight")
    en.add_argument("--model", type=Path, default=Path("models/default"))
    en.add_argument("--split", type=Path, default=Path("data/select/calibration.npz"),
                    help="a written demo split (default: the 10,000-frame selection split, see README)")
    r = sub.add_parser("recover", help="rebuild a trainable checkpoint from a model folder (to fine-tune it)")
    r.add_argument("--model", type=Path, default=Path("models/default"))
    r.add_argument("--data", type=Path, default=Path("data/demo"),
                   help="frames whose statistics set the batch norms (its train split, else its calibration split)")
    r.add_argument("--out", type=Path, default=Path("build/recovered.pt"))
    b = sub.add_parser("batchify", help="give a model folder's segments a dynamic batch axis, in place")
    b.add_argument("--model", type=Path, default=Path("models/default"))
    w = sub.add_parser("widen", help="widen a checkpoint to a larger width multiplier, keeping what it computes "
                                     "(Net2WiderNet; fine-tune it after)")
    w.add_argument("--checkpoint", type=Path, required=True)
    w.add_argument("--width", type=float, required=True, help="the new width multiplier (larger than the old)")
    w.add_argument("--noise", type=float, default=0.01,
                   help="symmetry-breaking noise on copied filters, times the layer's weight std (default 0.01)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--out", type=Path, default=Path("build/wide.pt"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("onnx_ir", "onnxscript", "torch.onnx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.cmd == "ensemble":
        from exporter.demo_data import DemoDataError
        from exporter.diagnose import last_exits_ensemble

        try:
            print(last_exits_ensemble(args.model, args.split))
        except (DemoDataError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "diagnose":
        from exporter.diagnose import per_photo, seen_vs_unseen

        try:
            print("Accuracy by test photo (the model's test traces):")
            print(per_photo(args.model, args.data))
            print(f"\nAccuracy on digit frames of the test photos, {args.count} fresh frames each:")
            print(seen_vs_unseen(args.model, args.cache, args.count))
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "batchify":
        from exporter.batchify import batchify
        from exporter.errors import ExporterError

        try:
            worst = batchify(args.model)
        except (ExporterError, OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{args.model}: segments take any batch size now; max |batched - single| = {worst:.2e}")
        return 0
    from exporter import pipeline  # torch is imported only once a command runs

    if args.cmd == "recover":
        return _recover(args.model, args.data, args.out)

    try:
        if args.cmd == "score":
            print(pipeline.score_checkpoints(args.checkpoint, args.data, tuple(args.split or ("calibration", "test")),
                                             args.input_size))
            return 0
        if args.cmd == "widen":
            from exporter.widen import WidenError, widen_checkpoint

            try:
                widen_checkpoint(args.checkpoint, args.out, args.width, args.noise, args.seed)
            except WidenError as exc:
                raise pipeline.ExportError(f"{args.checkpoint}: {exc}") from exc
            print(f"wrote {args.out}; fine-tune it: python -m exporter train --init {args.out} --width {args.width:g} "
                  "--epochs N --lr LR --out build/next.pt")
            return 0
        if args.cmd == "average":
            pipeline.average_checkpoints(args.checkpoint, args.data, args.out)
            print(f"wrote {args.out}; compare it with its ingredients: python -m exporter score --checkpoint "
                  f"{args.out} {' '.join(map(str, args.checkpoint))}")
            return 0
        if args.cmd == "data" and args.size % 32:
            raise pipeline.ExportError(f"--size {args.size}: a model's input side is a multiple of 32 (VGG pools "
                                       "five times); try 96, 128, 160, 192 or 224")
        if args.cmd in ("data", "all"):
            counts = None
            if getattr(args, "count", None):
                counts = dict(zip(("train", "calibration", "test"), args.count, strict=True))
            pipeline.build_data(args.data if args.cmd == "all" else args.out, args.cache, counts, args.seed,
                                getattr(args, "reshape_p", None), getattr(args, "recipe", RECIPE),
                                getattr(args, "size", IMAGE_SIZE), getattr(args, "shards", 1))
        if args.cmd in ("train", "all"):
            out = args.checkpoint if args.cmd == "all" else args.out
            pipeline.train_checkpoint(args.data, out, pipeline.train_options(args), init=args.init)
        if args.cmd in ("export", "all"):
            pipeline.export_checkpoint(args.checkpoint, args.data, args.out, args.weights)
    except pipeline.ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _recover(model: Path, data: Path, out: Path) -> int:
    from exporter import pipeline
    from exporter.recover import RecoverError, read_model_folder, recover_checkpoint

    try:
        folder = read_model_folder(model)
        spec = folder[1]
        try:
            frames, _, source = pipeline.load_dataset(data, "train", spec.input_size)
        except pipeline.ExportError:  # a folder with only calibration / test frames will do for the statistics
            frames, _, source = pipeline.load_dataset(data, "calibration", spec.input_size)
        _, err = recover_checkpoint(model, frames, out, folder)
    except (OSError, RecoverError, pipeline.ExportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {model}'s weights, batch norms from {source}; max |recovered - ONNX Runtime| = {err:.2e}")
    print(f"fine-tune it with: python -m exporter train --init {out} --config {spec.config} --width {spec.width:g} "
          f"--epochs N --lr LR --out build/next.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
