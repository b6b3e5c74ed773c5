"""Runners chosen by name: ``[model.backend] kind`` names the runner of every model the box serves, as Frigate
registers its detectors by type key. A runner answers the contract ``models.service.Runner``; its factory takes the
loaded model (the backend: ONNX Runtime here, also a remote runner's cheap path) and the ``[model]`` settings as a
mapping (``backend`` holds the kind's own keys). A kind's module is imported only when a box asks for it (Triton's
client is not needed by a box that does not use it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from models.errors import ModelError
from models.service import InferenceBackend, Runner

RunnerFactory = Callable[[InferenceBackend, Mapping[str, Any]], Runner]

RUNNERS: dict[str, str] = {  # kind: "module:factory"
    "onnxruntime": "models.service:local_runner",
    "triton": "models.triton_runner:triton_runner",
}


def make_runner(kind: str, backend: InferenceBackend, settings: Mapping[str, Any]) -> Runner:
    """The runner ``kind`` for ``backend``; ``ModelError`` naming the kinds there are for an unknown one."""
    if kind not in RUNNERS:
        raise ModelError(f"[model.backend] kind {kind!r}: no such runner; choose from {sorted(RUNNERS)}")
    module, _, name = RUNNERS[kind].partition(":")
    factory: RunnerFactory = getattr(importlib.import_module(module), name)
    return factory(backend, settings)
