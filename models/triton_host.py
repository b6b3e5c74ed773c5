"""``edge-app infer-server``: the whole early-exit chain as one model of a real NVIDIA Triton Inference Server
(PyTriton, which bundles Triton 2.51 with its Python backend), shared by every edge-app process and box that names
it in ``[model.backend]``.

Run by ``edge_app.infer_server`` in its own environment (``.venv-triton``: PyTriton pins numpy < 2) as
``python -m models.triton_host --model FOLDER ...``; it imports only ``models`` (numpy, ONNX Runtime, pydantic,
OpenCV), never ``edge_app``.

One model, ``edge_chain`` (``MODEL_NAME``), with Triton's dynamic batcher: the frames of every client that arrive
within ``--queue-delay-us`` form one batch; segment 1 runs on all of them, the policy decides per frame, segment 2
runs on those that go on, and so on (``InferenceService.run_batch_now``, the same walk as the local runner), so
features never leave the server and a frame costs one round trip. Per frame:

inputs   ``x`` float32 (3, H, W), ``min_exits`` / ``max_exits`` int32 (1), ``policy_key`` bytes (1),
         ``policy`` bytes (1): the encoded policy (``models.policy_wire``), or empty once this server knows the key,
         ``source`` bytes (1): the frame's source (client/camera) when this server's governor is to choose the
         operating point, else empty, ``own_ms`` float32 (1): that source's own work per frame on its box,
         ``dropped`` int32 (1): frames the client dropped behind busy pipelines since its last frame
outputs  ``choice`` int32 (1), ``exits_run`` int32 (1), ``probs`` float32 (E, C) (zeros past ``exits_run``),
         ``segment_ms`` float32 (E), ``error`` bytes (1): why a segment after the first failed, or empty,
         ``batch`` int32 (1): how many frames the batch it ran in held, ``point`` int32 (1): the operating point
         the governor chose (-1: not governed), ``load`` float32 (1), ``arrival_fps`` float32 (1): its view

An unknown key with no policy fails the request with ``unknown policy`` (the client sends it again with the policy).

**The load governor lives here** (``ServerGovernors``): only the shared server sees the whole load, every box's and
every worker's frames. A governed frame carries its box's configured policy (point 0); this server keeps one
``models.governor.LoadGovernor`` per such policy (its operating points solved from the model folder's tables in a
thread on first use; until then the policy as sent), counts each source's arrivals, and answers each frame at the
most accurate point whose expected compute fits ``--load-headroom`` of its one model instance, with a full-depth
frame's share of a batch as the per-frame cost (batching makes frames cheaper than their wall time).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from models.costs import RunningCost
from models.errors import SegmentRunError
from models.governor import LoadGovernor
from models.operating import OperatingPoint, operating_points
from models.policies import ExitPolicy
from models.policy_wire import decode_policy, policy_key
from models.service import ChainOutcome, ChainRequest, InferenceService, load_backend

MODEL_NAME = "edge_chain"
TOKEN_ENV = "EDGE_APP_TRITON_TOKEN"
ACCESS_HEADER = "triton-grpc-protocol-triton-access-token"  # how a gRPC client presents it
UNKNOWN_POLICY = "unknown policy"
log = logging.getLogger("edge-app.infer-server")


class ServerGovernors:
    """One load governor per policy that clients govern with; a full-depth frame's share of the batches' time."""

    def __init__(self, service: InferenceService, folder: Path, headroom: float) -> None:
        self.service, self.folder, self.headroom = service, folder, headroom
        self.by_key: dict[str, LoadGovernor | None] = {}  # None: its points still being solved
        self.lock = threading.Lock()
        self.share = [RunningCost(c.median_ms, 256) for c in service.costs]  # per frame, per segment

    def get(self, key: str, policy: ExitPolicy) -> LoadGovernor | None:
        with self.lock:
            if key in self.by_key:
                return self.by_key[key]
            self.by_key[key] = None
        threading.Thread(target=self._solve, args=(key, policy), daemon=True, name="governor-points").start()
        return None

    def _solve(self, key: str, policy: ExitPolicy) -> None:
        try:
            points = operating_points(self.folder, policy)
        except Exception as exc:  # a policy with no tables here: it alone
            log.warning("governor: no operating points for policy %s (%s); it is used as sent", key[:12], exc)
            points = [OperatingPoint(float("nan"), policy, float("nan"), 1.0)]
        with self.lock:
            self.by_key[key] = LoadGovernor(points, self.headroom, 1)
        log.info("governor: policy %s has %d operating points", key[:12], len(points))

    def recorded(self, outcomes: list[ChainOutcome]) -> None:
        for k, share in enumerate(self.share):
            ran = [o.results[k].segment_ms for o in outcomes if len(o.results) > k]
            if ran:
                share.record(ran[0] / len(ran))

    def segment_ms(self) -> list[float]:
        return [c.median_ms for c in self.service.costs]

    def share_ms(self) -> float:
        return float(sum(c.median_ms for c in self.share))


class ChainModel:
    """The infer function Triton calls with a batch (PyTriton's ``@batch`` stacks the requests)."""

    def __init__(self, service: InferenceService, governors: ServerGovernors | None = None) -> None:
        self.service = service
        self.governors = governors
        self.policies: dict[str, ExitPolicy] = {}
        self.lock = threading.Lock()
        self.frames = 0

    def policy(self, key: bytes, blob: bytes) -> ExitPolicy:
        k = key.decode()
        with self.lock:
            known = self.policies.get(k)
        if known is not None:
            return known
        if not blob:
            raise ValueError(f"{UNKNOWN_POLICY} {k[:12]}: send it with the request")
        if policy_key(blob) != k:
            raise ValueError("policy_key is not the SHA-256 of policy")
        policy = decode_policy(blob)
        with self.lock:
            self.policies[k] = policy
        return policy

    def governed(self, i: int, key: str, policy: ExitPolicy, source: bytes, own_ms: float, dropped: int,
                 out: dict[str, np.ndarray]) -> ExitPolicy:
        """Frame ``i``'s policy: the point its governor chooses now (written to ``out``), or ``policy`` as sent."""
        if not source or self.governors is None:
            return policy
        g = self.governors.get(key, policy)
        if g is None:
            return policy
        now, name = time.monotonic(), source.decode(errors="replace")
        g.arrived(name, now)
        if own_ms > 0:
            g.own_work(name, own_ms)
        for _ in range(max(0, dropped)):
            g.dropped(now)
        chosen = g.policy(now, self.governors.segment_ms, self.governors.share_ms)
        out["point"][i, 0], out["load"][i, 0], out["arrival_fps"][i, 0] = g.index, g.load, g.arrival_fps
        return chosen

    def __call__(self, x: np.ndarray, min_exits: np.ndarray, max_exits: np.ndarray, policy_key: np.ndarray,
                 policy: np.ndarray, source: np.ndarray, own_ms: np.ndarray, dropped: np.ndarray
                 ) -> dict[str, np.ndarray]:
        n, e = len(x), self.service.num_exits
        c = len(self.service.class_names)
        out = {"choice": np.zeros((n, 1), np.int32), "exits_run": np.zeros((n, 1), np.int32),
               "probs": np.zeros((n, e, c), np.float32), "segment_ms": np.zeros((n, e), np.float32),
               "error": np.full((n, 1), b"", dtype=object), "batch": np.full((n, 1), n, np.int32),
               "point": np.full((n, 1), -1, np.int32), "load": np.zeros((n, 1), np.float32),
               "arrival_fps": np.zeros((n, 1), np.float32)}
        requests = []
        for i in range(n):
            key = bytes(policy_key[i][0])
            base = self.policy(key, bytes(policy[i][0]))
            chosen = self.governed(i, key.decode(), base, bytes(source[i][0]), float(own_ms[i][0]),
                                   int(dropped[i][0]), out)
            requests.append(ChainRequest(x[i:i + 1], chosen, int(min_exits[i][0]), int(max_exits[i][0])))
        outcomes = self.service.run_batch_now(requests)
        self.frames += n
        if self.governors is not None:
            self.governors.recorded([o for o in outcomes if isinstance(o, ChainOutcome)])
        for i, o in enumerate(outcomes):
            if isinstance(o, SegmentRunError):
                raise o  # exit 1 itself failed: the whole batch did (every request gets the error)
            assert isinstance(o, ChainOutcome)
            out["choice"][i, 0] = o.choice
            out["exits_run"][i, 0] = len(o.results)
            for k, r in enumerate(o.results):
                out["probs"][i, k] = r.probs
                out["segment_ms"][i, k] = r.segment_ms
            out["error"][i, 0] = (o.error or "").encode()
        return out


def serve(folder: Path, grpc_port: int, http_port: int, metrics_port: int, max_batch: int, queue_delay_us: int,
          threads: int, address: str, max_queue: int = 0, load_headroom: float = 0.85,
          providers: tuple[str, ...] = ("cpu",)) -> None:
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    backend = load_backend("onnxruntime", folder, providers, threads, 2)
    used = list(backend.providers)
    if "cuda" in providers and "CUDAExecutionProvider" not in used:
        log.warning("infer-server: CUDA asked for, but ONNX Runtime runs on %s here (onnxruntime-gpu in "
                    ".venv-triton: EDGE_APP_TRITON_GPU=1 bash tools/triton-env.sh; a visible GPU)", used)
    service = InferenceService(backend)
    model = ChainModel(service, ServerGovernors(service, folder, load_headroom))
    h, w = backend.manifest.input.height, backend.manifest.input.width
    e, c = backend.num_exits, len(backend.class_names)
    config = TritonConfig(grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port, grpc_address=address,
                          http_address=address, metrics_address=address, log_verbose=0)
    # Triton's restricted endpoints (shared memory, the model repository, statistics...) answer only to this token:
    # a client on this host that sends frames through shared memory registers its regions with it
    security = TritonSecurityConfig(access_token=os.environ.get(TOKEN_ENV) or None)
    with Triton(config=config, security_config=security) as triton:
        triton.bind(model_name=MODEL_NAME, infer_func=batch(model),
                    inputs=[Tensor(name="x", dtype=np.float32, shape=(3, h, w)),
                            Tensor(name="min_exits", dtype=np.int32, shape=(1,)),
                            Tensor(name="max_exits", dtype=np.int32, shape=(1,)),
                            Tensor(name="policy_key", dtype=bytes, shape=(1,)),
                            Tensor(name="policy", dtype=bytes, shape=(1,)),
                            Tensor(name="source", dtype=bytes, shape=(1,)),
                            Tensor(name="own_ms", dtype=np.float32, shape=(1,)),
                            Tensor(name="dropped", dtype=np.int32, shape=(1,))],
                    outputs=[Tensor(name="choice", dtype=np.int32, shape=(1,)),
                             Tensor(name="exits_run", dtype=np.int32, shape=(1,)),
                             Tensor(name="probs", dtype=np.float32, shape=(e, c)),
                             Tensor(name="segment_ms", dtype=np.float32, shape=(e,)),
                             Tensor(name="error", dtype=bytes, shape=(1,)),
                             Tensor(name="batch", dtype=np.int32, shape=(1,)),
                             Tensor(name="point", dtype=np.int32, shape=(1,)),
                             Tensor(name="load", dtype=np.float32, shape=(1,)),
                             Tensor(name="arrival_fps", dtype=np.float32, shape=(1,))],
                    config=ModelConfig(max_batch_size=max_batch, batcher=DynamicBatcher(
                        max_queue_delay_microseconds=queue_delay_us,
                        # a full queue rejects at once: the client answers that frame from its cheap path
                        default_queue_policy=QueuePolicy(max_queue_size=max_queue))),
                    strict=False)
        print(f"infer-server: model {backend.manifest.name} ({e} exits, {c} classes, {h}x{w}) as {MODEL_NAME} on "
              f"{', '.join(used) or 'ONNX Runtime'}; "
              f"gRPC {address}:{grpc_port}, HTTP {http_port}, metrics {metrics_port}; batches up to {max_batch} "
              f"within {queue_delay_us} us", flush=True)
        triton.serve()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="edge-app infer-server")
    p.add_argument("--model", type=Path, required=True, help="model folder (manifest, segments, policy)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (0.0.0.0 for other boxes)")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--queue-delay-us", type=int, default=2000, help="the dynamic batcher's window")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--max-queue", type=int, default=0, help="frames waiting at most; more are rejected (0: no limit)")
    p.add_argument("--providers", default="cpu", help="ONNX Runtime providers in order, comma-separated (cuda,cpu)")
    p.add_argument("--load-headroom", type=float, default=0.85, help="the governor's share of the model instance's "
                   "time that governed frames may expect to use ([policy] load_headroom on a box)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(a.model, a.grpc_port, a.http_port, a.metrics_port, a.max_batch, a.queue_delay_us, a.threads, a.address,
          a.max_queue, a.load_headroom, tuple(p.strip() for p in a.providers.split(",") if p.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
