"""Load a model folder and run it one segment at a time with ONNX Runtime.

    runtime = ModelRuntime.load(Path("models/default"), providers=("cuda", "cpu"))
    run = runtime.start(runtime.preprocess(frame_rgb))
    first = run.advance()          # segment 1 -> exit 1
    if want_more:
        second = run.advance()     # segment 2 reads segment 1's features where they already are

Feature maps stay in ``OrtValue``s bound with IOBinding, so on CUDA they
never leave the device between segments; only the logits (a few floats)
are copied to the host.  Each ``ExitResult`` carries its segment's measured
time; ``models.service.InferenceService`` keeps the running cost estimates
the scheduler reads.  The runtime names its device (``cuda:N`` or ``cpu``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from models.errors import ModelFolderError, SegmentRunError
from models.manifest import Manifest, read_manifest, verify_file
from models.preprocess import Preprocessor

log = logging.getLogger(__name__)

PROVIDER_NAMES = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


@dataclass(frozen=True)
class ExitResult:
    exit_index: int  # 0-based
    probs: np.ndarray  # (C,) softmax
    label: int
    confidence: float
    segment_ms: float


def softmax(z: np.ndarray) -> np.ndarray:
    """Over the last axis: one frame's logits (C,) or a batch's (n, C)."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def gpu_build_installed() -> bool:
    """Whether the onnxruntime-gpu package (the ``gpu`` extra) is what is installed."""
    try:
        importlib.metadata.distribution("onnxruntime-gpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def resolve_providers(requested: Sequence[str]) -> list[str]:
    """ONNX Runtime provider names for ``requested`` (e.g. ``("cuda", "cpu")``), warning when CUDA is absent."""
    unknown = [p for p in requested if p not in PROVIDER_NAMES]
    if unknown or not requested:
        raise ValueError(f"unknown providers {unknown or requested}; use a list of {sorted(PROVIDER_NAMES)}")
    available = set(ort.get_available_providers())
    chosen = []
    for p in requested:
        name = PROVIDER_NAMES[p]
        if name in available:
            chosen.append(name)
        elif p == "cuda":
            if gpu_build_installed() or "cpu" not in requested:  # the user expects a GPU: say loudly it is not used
                log.warning("CUDA was requested but this onnxruntime build has no CUDAExecutionProvider "
                            "(available: %s): running on the CPU", sorted(available))
            else:  # the cpu extra: CPU is what was installed, not a fault
                log.info("onnxruntime without CUDA (the cpu extra): running on the CPU")
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


class ModelRuntime:
    """A validated model folder with one ONNX Runtime session per segment, on one device."""

    def __init__(self, folder: Path, manifest: Manifest, sessions: list[ort.InferenceSession],
                 device_id: int = 0) -> None:
        self.folder = folder
        self.manifest = manifest
        self.sessions = sessions
        self.providers = sessions[0].get_providers()
        self.device = "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        self.device_id = device_id if self.device == "cuda" else 0
        self.preprocess = Preprocessor(manifest.input)

    @property
    def device_name(self) -> str:
        """Where the segments run: ``cuda:N`` or ``cpu``."""
        return f"cuda:{self.device_id}" if self.device == "cuda" else "cpu"

    @property
    def prior_costs_ms(self) -> list[float]:
        """Each segment's cost before any frame ran: the export's measurement (the manifest)."""
        return [ex.cpu_cost.median_ms for ex in self.manifest.exits]

    @property
    def num_exits(self) -> int:
        return len(self.sessions)

    @property
    def class_names(self) -> list[str]:
        return self.manifest.class_names

    @classmethod
    def load(cls, folder: Path, providers: Sequence[str] = ("cpu",), threads: int = 0, warmup: int = 3,
             device_id: int = 0) -> ModelRuntime:
        """Validate ``folder`` against its manifest, open the sessions on ``providers`` (CUDA on GPU
        ``device_id``) and warm them up."""
        manifest = read_manifest(folder)
        names = resolve_providers(providers)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        with_options: list[str | tuple[str, dict[str, str]]] = [
            (n, {"device_id": str(device_id)}) if n == "CUDAExecutionProvider" else n for n in names]
        sessions = []
        for ex in manifest.exits:
            path = verify_file(folder, ex.file, ex.sha256)
            try:
                sess = ort.InferenceSession(str(path), opts, providers=with_options)
            except Exception as exc:  # onnxruntime raises its own pybind types (InvalidProtobuf, Fail, ...)
                raise ModelFolderError(f"{path}: ONNX Runtime cannot load it ({exc}); re-export the model") from exc
            _check_signature(path, sess, ex.input.name, ex.input.shape,
                             [s for s in (ex.features, ex.logits) if s is not None])
            sessions.append(sess)
        if "CUDAExecutionProvider" in names and sessions[0].get_providers()[0] != "CUDAExecutionProvider":
            log.warning("CUDA was requested but the session fell back to %s: running on the CPU",
                        sessions[0].get_providers())
        rt = cls(folder, manifest, sessions, device_id)
        rt.warm_up(warmup)
        log.info("model %s loaded from %s on %s", manifest.name, folder, rt.device_name)
        return rt

    def warm_up(self, runs: int) -> None:
        """Run every segment ``runs`` times on a blank frame (first runs allocate and pick kernels)."""
        shape = self.manifest.exits[0].input.shape
        for _ in range(runs):
            run = self.start(np.zeros(shape, np.float32))
            while not run.done:
                run.advance()

    @property
    def batchable(self) -> bool:
        """Whether every segment takes a batch of frames (a dynamic first axis: ``python -m exporter batchify``)."""
        return all(isinstance(sess.get_inputs()[0].shape[0], str) for sess in self.sessions)

    def to_device(self, x: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x, np.float32), self.device, self.device_id)

    def run_segment(self, k: int, value: ort.OrtValue) -> tuple[ort.OrtValue | None, np.ndarray, float]:
        """Segment ``k`` on a batch ``value`` (an OrtValue on this runtime's device, IOBinding in and out): the
        features for segment ``k + 1`` (left on the device), every frame's softmax (n, C) and the wall time."""
        sess, spec = self.sessions[k], self.manifest.exits[k]
        t0 = time.perf_counter()
        try:
            binding = sess.io_binding()
            binding.bind_ortvalue_input(spec.input.name, value)
            if spec.features is not None:
                binding.bind_output(spec.features.name, self.device, self.device_id)
            binding.bind_output(spec.logits.name, "cpu")
            sess.run_with_iobinding(binding)
            outs = binding.get_outputs()
        except Exception as exc:  # onnxruntime's pybind errors have no common public base
            raise SegmentRunError(f"segment {k + 1} ({spec.file}) failed: {exc}") from exc
        ms = (time.perf_counter() - t0) * 1e3
        return (outs[0] if spec.features is not None else None), softmax(outs[-1].numpy().astype(np.float64)), ms

    def take(self, value: ort.OrtValue, rows: Sequence[int]) -> ort.OrtValue:
        """The ``rows`` of a batch, for the frames that go on to the next segment. On the CPU a view-free numpy
        gather; on a GPU the rows pass through the host (ONNX Runtime has no device-side gather without a graph
        of its own), which only the frames that continue pay, and only when some stopped."""
        if len(rows) == value.shape()[0]:
            return value
        return self.to_device(value.numpy()[list(rows)])

    def start(self, x: np.ndarray) -> InferenceRun:
        """Begin a frame; ``x`` is the preprocessed (1, 3, h, w) input."""
        return InferenceRun(self, x)

    def all_exits(self, frame_rgb: np.ndarray) -> np.ndarray:
        """(exits, classes) softmax of every exit on one (H, W, 3) uint8 RGB frame, pre-processed as live
        frames are (offline work: traces, diagnosis)."""
        return self.exits_of(self.preprocess(frame_rgb))

    def exits_of(self, x: np.ndarray) -> np.ndarray:
        """(exits, classes) softmax of every exit on one preprocessed (1, 3, h, w) input."""
        run = self.start(x)
        out = np.empty((self.num_exits, len(self.class_names)), np.float32)
        while not run.done:
            res = run.advance()
            out[res.exit_index] = res.probs
        return out


def _per_frame(shape: Sequence[object]) -> list[object]:
    """A session's tensor shape with a dynamic batch axis read as the manifest's batch of one."""
    return [1 if i == 0 and isinstance(d, str) else d for i, d in enumerate(shape)]


def _check_signature(path: Path, sess: ort.InferenceSession, input_name: str, input_shape: list[int],
                     outputs: Sequence[object]) -> None:
    inputs = sess.get_inputs()
    if len(inputs) != 1 or inputs[0].name != input_name or _per_frame(inputs[0].shape) != input_shape:
        got = [(i.name, i.shape) for i in inputs]
        raise ModelFolderError(f"{path}: inputs {got} do not match the manifest ({input_name!r}, {input_shape})")
    want = [(o.name, o.shape) for o in outputs]  # type: ignore[attr-defined]
    got_out = [(o.name, _per_frame(o.shape)) for o in sess.get_outputs()]
    if got_out != want:
        raise ModelFolderError(f"{path}: outputs {got_out} do not match the manifest {want}")


class InferenceRun:
    """One frame's walk down the chain; ``advance()`` runs the next segment."""

    def __init__(self, runtime: ModelRuntime, x: np.ndarray) -> None:
        self._rt = runtime
        self._value = runtime.to_device(x)
        self.results: list[ExitResult] = []

    @property
    def done(self) -> bool:
        return len(self.results) == self._rt.num_exits

    @property
    def next_exit(self) -> int:
        return len(self.results)

    def advance(self) -> ExitResult:
        if self.done:
            raise IndexError("all exits already ran")
        k = len(self.results)
        features, probs, ms = self._rt.run_segment(k, self._value)  # a batch of one
        if features is not None:
            self._value = features
        label = int(probs[0].argmax())
        res = ExitResult(k, probs[0], label, float(probs[0][label]), ms)
        self.results.append(res)
        return res

    @property
    def features(self) -> ort.OrtValue:
        """The feature map the next segment will read (an OrtValue on the runtime's device)."""
        return self._value
