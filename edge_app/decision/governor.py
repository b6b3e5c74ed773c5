"""The load governor in the app: ``LoadGovernor`` (``models.governor``: the decision) built for the served model,
or, with a shared Triton (``[model.backend] kind = "triton"``), ``RemoteGovernor``: only the shared server sees the
whole load (every box's and every worker's frames), so the operating point is chosen there, for each frame, and
this process reports what only it knows (each source's own work per frame, the frames dropped behind a busy
pipeline) with its frames.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from edge_app.config import AppConfig
from edge_app.metrics import Metrics
from models.governor import LoadGovernor, ServerLoad
from models.manifest import read_manifest
from models.operating import OperatingPoint, operating_points, resolve_points
from models.policies import ExitPolicy
from models.service import Runner

__all__ = ["Governor", "LoadGovernor", "RemoteGovernor", "governor_for"]


async def governor_for(config: AppConfig, folder: Path, policy: ExitPolicy, metrics: Metrics,
                       runner: Runner | None = None,
                       executor: Executor | None = None) -> Governor | None:
    """The load-adaptive operating point for the model in ``folder`` (its points solved off the event loop), its
    moves shown in the metrics; the server's, when ``runner`` is a shared Triton's; None with ``[policy]
    adapt_to_load = false``."""
    if not config.policy.adapt_to_load:
        return None
    if runner is not None and runner.server_load is not None:  # the runner's server chooses (a shared Triton)
        return RemoteGovernor(runner.server_load, policy, metrics)
    points = await asyncio.get_running_loop().run_in_executor(executor, operating_points, folder, policy)
    governor: LoadGovernor | None = None

    def moved(point: OperatingPoint) -> None:
        if governor is not None:
            metrics.operating_point.set(governor.index)
            metrics.inference_load.set(governor.load)
        metrics.operating_cost.set(point.cost)

    governor = LoadGovernor(points, config.policy.load_headroom, config.model.workers, moved,
                            functools.partial(resolve_points, folder, policy), read_manifest(folder).costs_ms)
    metrics.operating_point.set(0)
    metrics.operating_cost.set(points[0].cost)
    return governor


class RemoteGovernor:
    """The pipelines' side of the governor when a shared Triton chooses the operating point: each source's own
    work per frame and the frames dropped behind a busy pipeline are reported to the runner's ``ServerLoad``, which
    sends them with the next frame; every governed frame carries the configured policy (point 0), and the server
    answers at the point the whole load allows (``ServerLoad.answer``)."""

    def __init__(self, load: ServerLoad, policy: ExitPolicy, metrics: Metrics) -> None:
        self.load, self.base, self.metrics = load, policy, metrics
        load.govern()

    def arrived(self, source: str, now_s: float) -> None:
        """The server counts arrivals: every frame it is sent."""

    def own_work(self, source: str, ms: float) -> None:
        self.load.own_work(source, ms)

    def dropped(self, now_s: float) -> None:
        self.load.dropped()

    def forget(self, source: str) -> None:
        self.load.forget(source)

    def policy(self, now_s: float, segment_ms: Any) -> ExitPolicy:
        g = self.load.answer
        if g.get("index") is not None:
            self.metrics.operating_point.set(g["index"])
            self.metrics.inference_load.set(g["load"])
        return self.base

    def status(self) -> dict[str, Any]:
        return {"where": "server", **self.load.answer}


Governor = LoadGovernor | RemoteGovernor
