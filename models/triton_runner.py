"""The Triton runner: the inference service's contract (``ChainRequest -> ChainOutcome``) answered by a shared
Triton Inference Server that binds the whole chain (``models.triton_host``), over gRPC (``tritonclient``, asyncio).

The model folder is still read here: its manifest and pre-processing (what a frame becomes before it is sent), its
class names, its measured costs (the priors of the running costs, which the server's per-segment times then
keep), and its segments for the cheap path. A frame's request carries its policy by key, with the encoded policy
(``models.policy_wire``) the first time this server sees it. Its timeout is the frame's compute budget
(``ChainRequest.timeout_s``), else ``timeout_s``.

With ``shared_memory`` (client and server on one host), each frame's input goes through a region of system shared
memory registered with Triton instead of the gRPC message (a pool of regions, one per frame in flight; registered
again after Triton restarts). Registering is one of Triton's restricted endpoints: it takes the server's access
token (``EDGE_APP_TRITON_TOKEN`` where ``edge-app infer-server`` runs).

What Triton does not answer (down, refusing, queue full, out of time) is answered from the cheap path when
``fallback`` is on: the frame's own policy on the local segments up to ``fallback_max_exit`` (1: exit 1 only),
counted per reason in ``counts``; the state (``up`` / ``down`` with the last reason) is in ``status()``. A server
found down (unreachable, or ``DOWN_AFTER`` frames in a row out of time) is asked no frame until a health check in
the background (``is_model_ready`` every ``RETRY_S``, each waiting at most ``RETRY_S``) finds it serving again:
every frame meanwhile goes to the cheap path at once, so a server that hangs or vanishes from the LAN costs the
few frames that found it out, and none after. ``probe()`` at start says in one line when the server is not there
(and starts the same watch). ``ChainOutcome.queue_ms`` is the round trip beyond the segments' own
time, kept apart so the running costs stay compute estimates; the scheduler's predicted cost of segment 1 adds
its running high percentile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from models.costs import RunningCost
from models.errors import SegmentRunError
from models.governor import ServerLoad
from models.policies import ExitPolicy
from models.policy_wire import encode_policy, policy_key
from models.runtime import ExitResult
from models.service import ChainOutcome, ChainRequest, InferenceBackend, InferenceService
from models.triton_grpc import SharedInputs, open_client, reason, tensor
from models.triton_host import MODEL_NAME, UNKNOWN_POLICY

log = logging.getLogger(__name__)

OUTPUTS = ("choice", "exits_run", "probs", "segment_ms", "error", "batch", "point", "load", "arrival_fps")


class TritonRunner(InferenceService):
    RETRY_S = 0.5  # a server found down is health-checked this often (in the background, never by a frame)
    DOWN_AFTER = 3  # frames in a row out of time mark it down (a host gone from the LAN answers nothing at all)

    def __init__(self, backend: InferenceBackend, url: str, model_name: str = MODEL_NAME, timeout_s: float = 1.0,
                 fallback: bool = True, workers: int = 1, cost_window: int = 256, shared_memory: bool = False,
                 access_token: str | None = None, regions: int = 16, fallback_max_exit: int = 1) -> None:
        super().__init__(backend, workers, cost_window)
        self.fallback_max_exit = max(1, min(fallback_max_exit, backend.num_exits))
        self._late_in_a_row = 0
        self._watch: asyncio.Task[None] | None = None  # the health check while the server is down
        self.health_checks = 0
        self.shm = SharedInputs(regions, self.input_bytes(), access_token) if shared_memory else None
        self.url = url
        self.model_name = model_name
        self.timeout_s = timeout_s
        self.fallback = fallback
        self.client: Any = None
        self.overhead = RunningCost(2.0, cost_window)  # the round trip beyond the segments, ms
        self.counts = {"remote": 0, "cheap_path": 0, "unavailable": 0, "timeout": 0, "rejected": 0}
        self.state = "starting"
        self.last_error: str | None = None
        self._encoded: dict[int, tuple[ExitPolicy, str, bytes]] = {}  # id(policy) -> (policy, key, blob)
        self._known: set[str] = set()  # keys this server has acknowledged
        self.batch_sizes: dict[int, int] = {}  # frames answered, by the size of the Triton batch they ran in
        self.client_id = f"{socket.gethostname()}:{os.getpid()}"
        self.server_load: ServerLoad = ServerLoad()  # what the server's governor is told with each frame, and answered

    def predicted_costs_ms(self) -> list[float]:
        costs = super().predicted_costs_ms()
        costs[0] += self.overhead.high_ms
        return costs

    def input_bytes(self) -> int:
        m = self.backend.manifest
        return 3 * m.input.height * m.input.width * 4

    async def stop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        client, self.client = self.client, None
        if client is not None:
            if self.shm is not None:
                await self.shm.release(client)
            await client.close()
        elif self.shm is not None:
            self.shm.destroy()
        await super().stop()

    async def probe(self, timeout_s: float = 2.0) -> bool:
        """Whether the server answers and serves the chain model now; when not, one clear line, ``status()`` says
        ``down`` with the reason, and the health check watches for it (the frames meanwhile take the cheap path)."""
        why = await self._not_serving(timeout_s)
        if why is None:
            return True
        self._down(why)
        log.warning("inference: Triton at %s is not serving (%s); %s until it is (start it with edge-app "
                    "infer-server; /status model.runner shows the state)", self.url, why, self._fallback_words())
        return False

    async def _not_serving(self, timeout_s: float) -> str | None:
        """None when the server serves the chain model now, else why not."""
        try:
            ready = await asyncio.wait_for(self._client().is_model_ready(self.model_name), timeout_s)
        except Exception as exc:  # any failure to reach it is the answer
            return f"{reason(exc)}: {str(exc)[:200] or type(exc).__name__}"
        return None if ready else f"the server answers but model {self.model_name!r} is not ready"

    def _down(self, why: str) -> None:
        self.state, self.last_error = "down", why
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watch_until_up(), name="triton-health")

    async def _watch_until_up(self) -> None:
        """While down: a health check every ``RETRY_S``; the server is ``up`` again (frames go to it) once it
        serves the model."""
        while self.state == "down":
            await asyncio.sleep(self.RETRY_S)
            self.health_checks += 1
            if await self._not_serving(self.RETRY_S) is None:
                log.info("inference: Triton at %s serves again (%d frames answered from the cheap path "
                         "meanwhile)", self.url, self.counts["cheap_path"])
                self.state, self.last_error, self._late_in_a_row = "up", None, 0

    def _client(self) -> Any:
        if self.client is None:
            import tritonclient.grpc.aio as grpcclient

            self.client = open_client(grpcclient, self.url)
        return self.client

    def _fallback_words(self) -> str:
        if not self.fallback:
            return "frames get no model answer (fallback = false)"
        k = self.fallback_max_exit
        return "frames are answered on this box from exit 1" if k == 1 else \
            f"frames are answered on this box with their own policy up to exit {k}"

    async def run(self, request: ChainRequest) -> ChainOutcome:
        if self.state == "down":
            return await self._cheap(request, None)  # known down: no frame waits to find out again
        try:
            outcome = await self._remote(request)
        except (SegmentRunError, TimeoutError, OSError) as exc:
            return await self._cheap(request, exc)
        except Exception as exc:  # tritonclient's InferenceServerException (and grpc's errors inside it)
            if type(exc).__name__ != "InferenceServerException":
                raise
            return await self._cheap(request, exc)
        if self.state == "starting":
            log.info("inference: Triton at %s answers", self.url)
        self.state, self.last_error, self._late_in_a_row = "up", None, 0
        self.counts["remote"] += 1
        return outcome

    async def _cheap(self, request: ChainRequest, exc: BaseException | None) -> ChainOutcome:
        """The frame answered here; ``exc`` None: the server is known down and was not asked."""
        why = "unavailable" if exc is None else reason(exc)
        self.counts[why] += 1
        self._late_in_a_row = self._late_in_a_row + 1 if why == "timeout" else 0
        gone = why == "unavailable" or self._late_in_a_row >= self.DOWN_AFTER
        if exc is not None and not gone and self.state == "up":  # up but full, or this frame out of time
            if self.counts[why] in (1, 10, 100) or self.counts[why] % 1000 == 0:
                log.warning("inference: Triton at %s: %d frames %s so far (%s), answered from the cheap path",
                            self.url, self.counts[why], why, str(exc)[:200])
        elif exc is not None:
            if self.state != "down" or not (self.last_error or "").startswith(why):
                log.warning("inference: Triton at %s: %s (%s); %s", self.url, why, str(exc)[:200],
                            self._fallback_words())
            self._down(f"{why}: {str(exc)[:200]}")
        if not self.fallback:
            raise SegmentRunError(f"Triton at {self.url}: {why}") from exc
        self.counts["cheap_path"] += 1
        k = self.fallback_max_exit
        return await super().run(ChainRequest(request.x, request.policy, min(request.min_exits, k),
                                              min(k, request.max_exits)))

    def _policy(self, policy: ExitPolicy) -> tuple[str, bytes]:
        held = self._encoded.get(id(policy))
        if held is None or held[0] is not policy:
            blob = encode_policy(policy)
            held = self._encoded[id(policy)] = (policy, policy_key(blob), blob)
        return held[1], held[2]

    async def _remote(self, request: ChainRequest) -> ChainOutcome:
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        self._client()
        key, blob = self._policy(request.policy)
        timeout = request.timeout_s if request.timeout_s is not None else self.timeout_s
        x = np.ascontiguousarray(request.x, np.float32)
        region = await self.shm.take(self.client, x) if self.shm is not None else None
        try:
            return await self._infer(grpcclient, InferenceServerException, request, key, blob, x, region, timeout)
        except BaseException:
            if self.shm is not None:
                self.shm.lost()  # Triton may have restarted: register the regions again
            raise
        finally:
            if region is not None and self.shm is not None:
                self.shm.give(region)

    async def _infer(self, grpcclient: Any, server_error: type[Exception], request: ChainRequest, key: str,
                     blob: bytes, x: np.ndarray, region: str | None, timeout: float) -> ChainOutcome:
        for attempt in range(2):
            send = blob if key not in self._known or attempt else b""
            xin = grpcclient.InferInput("x", list(x.shape), "FP32")
            if region is None:
                xin.set_data_from_numpy(x)
            else:
                xin.set_shared_memory(region, x.nbytes)
            inputs = [xin,
                      tensor(grpcclient, "min_exits", np.array([[request.min_exits]], np.int32), "INT32"),
                      tensor(grpcclient, "max_exits", np.array([[request.max_exits]], np.int32), "INT32"),
                      tensor(grpcclient, "policy_key", np.array([[key.encode()]], dtype=object), "BYTES"),
                      tensor(grpcclient, "policy", np.array([[send]], dtype=object), "BYTES"),
                      *self._governed_inputs(grpcclient, request.source)]
            t0 = time.perf_counter()
            try:
                res = await self.client.infer(self.model_name, inputs,
                                              outputs=[grpcclient.InferRequestedOutput(n) for n in OUTPUTS],
                                              client_timeout=max(0.001, timeout))
            except server_error as exc:
                if UNKNOWN_POLICY in str(exc) and not attempt:
                    self._known.discard(key)  # a restarted server: send the policy with the frame
                    continue
                raise
            round_trip_ms = (time.perf_counter() - t0) * 1e3
            self._known.add(key)
            return self._outcome(res, round_trip_ms)
        raise SegmentRunError("Triton refused the policy twice")

    def _governed_inputs(self, grpcclient: Any, source: str) -> list[Any]:
        """The frame's source for the server's governor (empty: not governed, the policy as sent), its own work per
        frame, and the drops since the last frame (sent once)."""
        load = self.server_load
        name = f"{self.client_id}/{source}".encode() if load.governed and source else b""
        dropped = load.take_dropped() if name else 0
        return [tensor(grpcclient, "source", np.array([[name]], dtype=object), "BYTES"),
                tensor(grpcclient, "own_ms", np.array([[load.own_ms.get(source, 0.0)]], np.float32), "FP32"),
                tensor(grpcclient, "dropped", np.array([[dropped]], np.int32), "INT32")]

    def _outcome(self, res: Any, round_trip_ms: float) -> ChainOutcome:
        n = int(res.as_numpy("exits_run")[0][0])
        probs, seg = res.as_numpy("probs")[0], res.as_numpy("segment_ms")[0]
        results = []
        for k in range(n):
            p = probs[k]
            label = int(p.argmax())
            results.append(ExitResult(k, p, label, float(p[label]), float(seg[k])))
            self.costs[k].record(float(seg[k]))
            self.segment_runs[k] += 1
        size = int(res.as_numpy("batch")[0][0])
        self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1
        compute = float(seg[:n].sum())
        queue = max(0.0, round_trip_ms - compute)
        self.overhead.record(queue)
        error = bytes(res.as_numpy("error")[0][0]).decode() or None
        point = int(res.as_numpy("point")[0][0])
        if point >= 0:
            self.server_load.answer = {"index": point, "load": round(float(res.as_numpy("load")[0][0]), 3),
                             "arrival_fps": round(float(res.as_numpy("arrival_fps")[0][0]), 1)}
        return ChainOutcome(tuple(results), int(res.as_numpy("choice")[0][0]), compute, error, queue_ms=queue)

    def status(self) -> dict[str, Any]:
        return {"kind": "triton", "url": self.url, "model": self.model_name, "state": self.state,
                "last_error": self.last_error,
                "fallback": f"here, up to exit {self.fallback_max_exit}" if self.fallback else None,
                "round_trip_beyond_compute_p95_ms": round(self.overhead.high_ms, 2),
                "health_checks": self.health_checks, **self.counts}


def triton_runner(backend: InferenceBackend, settings: Mapping[str, Any]) -> TritonRunner:
    """``[model.backend] kind = "triton"``: frames go to a shared Triton (``models.runners``)."""
    t = settings["backend"]
    return TritonRunner(backend, t["url"], t["model_name"], t["timeout_s"], t["fallback"], settings["workers"],
                        settings["cost_window"], t["shared_memory"], t["access_token"],
                        fallback_max_exit=t["fallback_max_exit"])
