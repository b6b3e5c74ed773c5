"""Export a trained ``ThreeExitVGG`` as a model folder.

Writes ``segment{k}.onnx`` for each exit, checks ONNX Runtime against eager
PyTorch (``PARITY_ATOL`` / ``PARITY_RTOL``), records every calibration and
test image's per-exit softmax as traces (computed by ONNX Runtime, i.e. by
exactly what the server runs), measures each segment's CPU cost, and writes
``manifest.json``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torch.utils.data import DataLoader, Dataset

from exporter.datasets import MEAN, STD
from exporter.errors import ExporterError
from exporter.vgg import ThreeExitVGG
from models.manifest import CostSpec, ExitSpec, InputSpec, Manifest, TensorSpec, TraceSpec, sha256_file, write_manifest

log = logging.getLogger(__name__)

PARITY_ATOL = 1e-4
PARITY_RTOL = 1e-3
#: The tolerance of the stored segments, whose weights are rounded to float16 (see ``store_weights_float16``):
#: a relative rounding of 2^-11 per weight moves a logit by ~1e-3 on the shipped model.
STORED_ATOL = 2e-2
STORED_RTOL = 1e-2
#: How ``export_model_folder`` stores the weights unless told otherwise.
DEFAULT_WEIGHTS = "float16"
OPSET = 18
COST_RUNS = 200
#: Intra-op threads when the export times the segments: the app's default (``[model] threads = 1``), so the costs
#: the policy is fitted with are the ones the app sees.  With 2 threads on this 2-core box one call in ten stalled
#: ~4 ms (p95 4.6 ms against a 0.6 ms median) and segment 2's median read 0.48-0.71 ms across three runs; with 1
#: thread, 0.70-0.71 ms and p95 within 7 % of the median.
COST_THREADS = 1
#: Intra-op threads for the parity check and the traces (speed only).
SESSION_THREADS = 2


class ParityError(ExporterError, RuntimeError):
    """ONNX Runtime's output differs from PyTorch's beyond the stated tolerance."""


def export_segments(model: ThreeExitVGG, out: Path) -> list[Path]:
    """One ONNX file per segment, exported at batch size 1 and then given a dynamic batch axis."""
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    x = torch.zeros(1, 3, model.spec.input_size, model.spec.input_size)
    for k, seg in enumerate(model.segments):
        path = out / f"segment{k + 1}.onnx"
        names = ["logits"] if seg.is_last else ["features", "logits"]
        with torch.no_grad():
            torch.onnx.export(seg, (x,), str(path), input_names=["input"], output_names=names,
                              opset_version=OPSET, dynamo=True, external_data=False, verbose=False)
            nxt = seg(x)
        if isinstance(nxt, tuple):
            x = nxt[0]
        if not make_batch_dynamic(path):
            raise ExporterError(f"{path}: cannot give it a dynamic batch axis (an unexpected Reshape)")
        paths.append(path)
    return paths


def make_batch_dynamic(path: Path) -> bool:
    """Let a segment take any batch size: its input's and outputs' first dimension becomes the symbolic "batch", and
    the Reshape before each exit's classifier flattens to (-1, C) instead of (1, C). The weights and every other
    node are untouched, so a batch of one computes exactly what it did. False when the segment has a reshape
    this does not know (it is then left as it was)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    for node in graph.node:
        if node.op_type != "Reshape":
            continue
        shape = inits.get(node.input[1])
        if shape is None:
            return False
        value = numpy_helper.to_array(shape)
        if value.ndim != 1 or value.size != 2 or value[0] not in (1, -1):
            return False
        shape.CopyFrom(numpy_helper.from_array(np.array([-1, value[1]], np.int64), shape.name))
    for v in [*graph.input, *graph.output]:
        dim = v.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = "batch"
    del graph.value_info[:]  # intermediate shapes were inferred for batch 1: ONNX Runtime infers them again
    onnx.checker.check_model(model)
    tmp = path.with_name(path.name + ".partial")
    onnx.save(model, str(tmp))
    tmp.replace(path)
    return True


def cpu_sessions(paths: Sequence[Path], threads: int = SESSION_THREADS) -> list[ort.InferenceSession]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return [ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"]) for p in paths]


def run_chain(sessions: Sequence[ort.InferenceSession], x: np.ndarray) -> list[list[np.ndarray]]:
    """Every segment's outputs, feeding each segment's features to the next."""
    outs = []
    for sess in sessions:
        res = sess.run(None, {"input": x})
        outs.append(res)
        x = res[0]
    return outs


def store_weights_float16(path: Path) -> int:
    """Rewrite an exported segment so that every float32 weight of a Conv or Gemm is stored as float16, read
    through a Cast back to float32: ONNX Runtime's constant folding turns each Cast into a float32 initializer when
    it loads the segment, so inference runs in float32 at the same speed and the file is about half the size.
    Biases stay float32.  Returns the bytes saved."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    before = path.stat().st_size
    model = onnx.load(str(path))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    casts = []
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 2:
            continue
        init = inits.get(node.input[1])
        if init is None or init.data_type != TensorProto.FLOAT:
            continue
        w = numpy_helper.to_array(init)
        graph.initializer.remove(init)
        del inits[init.name]
        graph.initializer.append(numpy_helper.from_array(w.astype(np.float16), f"{init.name}.float16"))
        casts.append(helper.make_node("Cast", [f"{init.name}.float16"], [init.name], to=TensorProto.FLOAT,
                                      name=f"{init.name}.cast"))
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(casts + nodes)  # topological order: the casts read only initializers
    onnx.checker.check_model(model)
    tmp = path.with_name(path.name + ".partial")
    onnx.save(model, str(tmp))
    tmp.replace(path)
    return before - path.stat().st_size


def check_parity(model: ThreeExitVGG, sessions: Sequence[ort.InferenceSession], inputs: torch.Tensor,
                 atol: float = PARITY_ATOL, rtol: float = PARITY_RTOL) -> float:
    """Largest absolute difference between ONNX Runtime and eager outputs; raises past the tolerance."""
    worst = 0.0
    for i in range(inputs.shape[0]):
        x = inputs[i : i + 1]
        onnx_outs = run_chain(sessions, x.numpy())
        with torch.no_grad():
            for k, seg in enumerate(model.segments):
                ref = seg(x)
                refs = list(ref) if isinstance(ref, tuple) else [ref]
                for name, r, o in zip(("features", "logits") if len(refs) == 2 else ("logits",), refs,
                                      onnx_outs[k], strict=True):
                    diff = float(np.max(np.abs(r.numpy() - o)))
                    worst = max(worst, diff)
                    if not np.allclose(o, r.numpy(), atol=atol, rtol=rtol):
                        raise ParityError(f"segment {k + 1} {name}: max |onnx - torch| = {diff:.3g} exceeds "
                                          f"atol {atol} / rtol {rtol}")
                x = refs[0]
    return worst


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def traces(sessions: Sequence[ort.InferenceSession], data: Dataset[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(N, n_exits, C) softmax of every exit as ONNX Runtime computes it, and the labels (N,)."""
    probs, labels = [], []
    for x, y in DataLoader(data, batch_size=1):
        outs = run_chain(sessions, x.numpy())
        probs.append(np.stack([softmax(o[-1][0]) for o in outs]))
        labels.append(int(y))
    return np.stack(probs).astype(np.float32), np.asarray(labels, np.int64)


def measure_costs(sessions: Sequence[ort.InferenceSession], shape: Sequence[int], runs: int = COST_RUNS
                  ) -> list[CostSpec]:
    """Each segment's CPU time, measured the way the runtime runs them: the whole chain, segment after
    segment, ``runs`` times.  (Timing one segment's runs back to back instead leaves it hot in the caches
    and biases the figures by up to a third between exports of the same architecture.)"""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    times: list[list[float]] = [[] for _ in sessions]
    for i in range(10 + runs):
        feed = x
        for k, sess in enumerate(sessions):
            t0 = time.perf_counter()
            feed = sess.run(None, {"input": feed})[0]
            if i >= 10:  # the first ten are warm-up
                times[k].append((time.perf_counter() - t0) * 1e3)
    return [CostSpec(median_ms=round(statistics.median(t), 4), p95_ms=round(float(np.percentile(t, 95)), 4),
                     threads=COST_THREADS) for t in times]


def export_model_folder(model: ThreeExitVGG, class_names: list[str], calibration: Dataset[Any],
                        test: Dataset[Any], out: Path, provenance: dict[str, Any],
                        weights: str = DEFAULT_WEIGHTS) -> Manifest:
    """Export, check parity, store the weights as ``weights`` ("float16" or "float32"), write traces, costs and the
    manifest.  Parity is checked twice with float16 storage: the float32 graph against PyTorch at ``PARITY_ATOL``,
    then the stored one at ``STORED_ATOL``; the traces, accuracies and costs are the stored segments'."""
    if weights not in ("float16", "float32"):
        raise ValueError(f"weights must be float16 or float32, not {weights!r}")
    paths = export_segments(model, out)
    probe = torch.stack([calibration[i][0] for i in range(min(8, len(calibration)))])  # type: ignore[arg-type]
    worst = check_parity(model, cpu_sessions(paths), probe)
    log.info("ONNX parity: max |onnx - torch| = %.2e (atol %g)", worst, PARITY_ATOL)
    stored: dict[str, Any] = {"weights_stored_as": weights}
    if weights == "float16":
        saved = sum(store_weights_float16(p) for p in paths)
        stored["stored_parity_max_abs_diff"] = check_parity(model, cpu_sessions(paths), probe, STORED_ATOL,
                                                            STORED_RTOL)
        stored["stored_parity_atol"] = STORED_ATOL
        log.info("weights stored as float16 (%.1f MB saved): max |onnx - torch| = %.2e (atol %g)", saved / 1e6,
                 stored["stored_parity_max_abs_diff"], STORED_ATOL)
    sessions = cpu_sessions(paths)
    trace_specs = {}
    accuracy: np.ndarray | None = None
    for split, data in (("calibration", calibration), ("test", test)):
        t0 = time.perf_counter()
        probs, labels = traces(sessions, data)
        path = out / f"traces_{split}.npz"
        np.savez_compressed(path, probs=probs, labels=labels, class_names=np.array(class_names))
        trace_specs[split] = TraceSpec(file=path.name, sha256=sha256_file(path), count=len(labels))
        log.info("%s traces: %d frames in %.1fs", split, len(labels), time.perf_counter() - t0)
        if split == "test":
            accuracy = (probs.argmax(-1) == labels[:, None]).mean(axis=0)
    assert accuracy is not None
    size = model.spec.input_size
    shapes = [[1, 3, size, size]] + [[1, *s] for s in model.feature_shapes]
    costs = measure_costs(cpu_sessions(paths, COST_THREADS), shapes[0])
    exits = []
    for k in range(3):
        last = k == 2
        exits.append(ExitSpec(
            name=f"exit{k + 1}", file=paths[k].name, sha256=sha256_file(paths[k]),
            input=TensorSpec(name="input", shape=shapes[k]),
            features=None if last else TensorSpec(name="features", shape=shapes[k + 1]),
            logits=TensorSpec(name="logits", shape=[1, len(class_names)]),
            flops=model.segment_flops[k], backbone_fraction=round(model.backbone_fractions[k], 4),
            cpu_cost=costs[k], test_accuracy=round(float(accuracy[k]), 4),
        ))
    spec = model.spec
    manifest = Manifest(
        name=f"{spec.config}-w{spec.width:g}-{size}px",
        architecture={"family": "three-exit VGG", "config": spec.config, "width": spec.width, "input_size": size,
                      "exit_fractions_target": list(spec.exit_fractions), "final_hidden": spec.final_hidden,
                      "dropout": spec.dropout, "batch_norm": True},
        input=InputSpec(height=size, width=size, mean=MEAN, std=STD),
        class_names=class_names, exits=exits, traces=trace_specs,
        provenance={**provenance, "parity_max_abs_diff": worst, "parity_atol": PARITY_ATOL, **stored,
                    "onnxruntime_version": ort.__version__, "opset": OPSET,
                    "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    )
    write_manifest(out, manifest)
    log.info("per-exit test accuracy %s; CPU cost per segment (median ms) %s",
             [e.test_accuracy for e in exits], [c.median_ms for c in costs])
    return manifest
