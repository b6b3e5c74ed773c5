"""The models a box serves: each one loaded once, however many cameras use it, and unloaded when none does.

``ServedModel`` is one model's room: its runner (the inference service), its exit policy (with its exit 0 and
floor), its load governor (its own operating points) and the ``Engine`` the pipelines it answers share. ``ModelSet``
holds them by name (``models.registry``: ``default`` is ``[model] path``, the others are taught versions in
``[training] models_dir``): ``acquire`` loads a model the first time a source needs it (off the event loop: the
other models keep serving), ``release`` stops it once no source uses it. The box's default model (the one every
camera without a model of its own and every browser session uses) is never released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_app.config import AppConfig
from edge_app.decision.governor import Governor, governor_for
from edge_app.decision.scheduler import describe_served, policy_from_config
from edge_app.metrics import Metrics
from edge_app.pipeline import Engine
from models.errors import ModelError
from models.policies import ExitPolicy
from models.registry import ModelRegistry
from models.runners import make_runner
from models.service import Runner, load_backend

log = logging.getLogger(__name__)


@dataclass
class ServedModel:
    name: str
    service: Runner
    policy: ExitPolicy
    policy_info: dict[str, object]
    governor: Governor | None
    engine: Engine
    users: set[str] = field(default_factory=set)  # source ids ("camera:NAME", "session:ID") it answers
    loaded_s: float = 0.0  # how long loading and warming it up took

    @property
    def folder(self) -> Path:
        return self.service.backend.folder

    @property
    def class_names(self) -> list[str]:
        return self.service.class_names

    @classmethod
    def make(cls, config: AppConfig, name: str, service: Runner, metrics: Metrics, media: Executor
             ) -> ServedModel:
        """The room for ``service``: its policy from ``[policy]``; ``start`` starts it and adds its governor."""
        folder = service.backend.folder
        policy = policy_from_config(config.policy, folder)
        engine = Engine(service=service, policy=policy, metrics=metrics, media=media)
        return cls(name, service, policy, describe_served(config.policy, folder, policy), None, engine)

    async def start(self, config: AppConfig, metrics: Metrics, executor: Executor | None = None) -> None:
        """Start the runner (a remote one says at once when its server is not there) and the load governor (its
        operating points solved off the event loop, in ``executor``)."""
        self.service.start()
        await self.service.probe()
        self.governor = await governor_for(config, self.folder, self.policy, metrics, self.service, executor)
        self.engine = Engine(service=self.service, policy=self.policy, metrics=metrics, media=self.engine.media,
                             load=self.governor)

    async def stop(self) -> None:
        await self.service.stop()

    def status(self) -> dict[str, Any]:
        manifest = self.service.backend.manifest
        return {"name": self.name, "model": manifest.name, "folder": str(self.folder), "classes": self.class_names,
                "policy": self.policy.name, "users": sorted(self.users), "load_s": round(self.loaded_s, 3)}


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's own nice value
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


class ModelSet:
    """Every model the box serves, by name; see the module's docstring."""

    def __init__(self, config: AppConfig, registry: ModelRegistry, metrics: Metrics, media: Executor) -> None:
        self.config, self.registry, self.metrics, self.media = config, registry, metrics, media
        self.models: dict[str, ServedModel] = {}
        self.default = ""  # the box's default model's name
        self._loading: dict[str, asyncio.Task[ServedModel]] = {}
        # loads run in a thread of their own at a lower CPU priority: the pipelines of the cameras being served
        # come first on a box with few cores
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="model-load", initializer=_lower_priority)

    def add(self, model: ServedModel, default: bool = False) -> None:
        self.models[model.name] = model
        if default:
            self.default = model.name

    def __getitem__(self, name: str) -> ServedModel:
        return self.models[name]

    async def acquire(self, name: str, user: str) -> ServedModel:
        """The model ``name`` for ``user``, loaded (once, however many ask at the same time) if it is not yet.
        ``RegistryError`` when there is no such model; ``ModelError`` when it does not load (nothing changes)."""
        model = self.models.get(name)
        if model is None:
            task = self._loading.get(name)
            if task is None:
                task = self._loading[name] = asyncio.create_task(self._load(name), name=f"load-{name}")
                task.add_done_callback(lambda _t: self._loading.pop(name, None))
            model = await asyncio.shield(task)
            self.models.setdefault(name, model)
            model = self.models[name]
        model.users.add(user)
        return model

    async def _load(self, name: str) -> ServedModel:
        m = self.config.model
        if m.backend.kind == "triton":
            raise ModelError(f"model {name!r}: inference runs on the shared Triton at {m.backend.url}, which serves "
                             "one model for every box; serve it there (edge-app infer-server --model FOLDER)")
        folder = self.registry.validate(name)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        backend = await loop.run_in_executor(self._loader, load_backend, "onnxruntime", folder, m.providers,
                                             m.threads, m.warmup_runs, m.cuda_device)
        service = make_runner(m.backend.kind, backend, m.model_dump())
        model = await loop.run_in_executor(self._loader, ServedModel.make, self.config, name, service, self.metrics,
                                           self.media)  # a policy refitted in memory takes a while
        await model.start(self.config, self.metrics, self._loader)
        model.loaded_s = loop.time() - t0
        log.info("model %s loaded from %s in %.2f s (%d classes, policy %s)", name, folder, model.loaded_s,
                 len(model.class_names), model.policy.name)
        return model

    async def release(self, name: str, user: str) -> None:
        """``user`` no longer uses ``name``; a model nobody uses (never the default) is stopped and unloaded."""
        model = self.models.get(name)
        if model is None:
            return
        model.users.discard(user)
        if not model.users and name != self.default:
            del self.models[name]
            await model.stop()
            log.info("model %s unloaded: no camera or session uses it", name)

    def held_by(self, user: str) -> ServedModel:
        return next(m for m in self.models.values() if user in m.users)

    async def release_all(self, user: str) -> None:
        for name, model in list(self.models.items()):
            if user in model.users:
                await self.release(name, user)

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.models.values()), return_exceptions=True)
        self._loader.shutdown(wait=False, cancel_futures=True)

    def status(self) -> list[dict[str, Any]]:
        return [{**m.status(), "default": name == self.default} for name, m in self.models.items()]
