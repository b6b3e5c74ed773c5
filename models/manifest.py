"""``manifest.json``: what a model folder holds, and how to read it.

The exporter writes it; the runtime validates the folder against it.  It is
the only thing ``exporter/`` and ``models/`` share.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.errors import ModelFolderError

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    name: str
    shape: list[int] = Field(description="static shape, batch first")


class CostSpec(_Strict):
    median_ms: float = Field(ge=0)
    p95_ms: float = Field(ge=0)
    threads: int = Field(ge=0, description="intra-op threads used when measuring")
    provider: str = "CPUExecutionProvider"


class ExitSpec(_Strict):
    name: str
    file: str = Field(description="ONNX segment file, relative to the model folder")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    input: TensorSpec
    features: TensorSpec | None = Field(description="feature map passed to the next segment; None for the last")
    logits: TensorSpec
    flops: int = Field(ge=0, description="FLOPs of this segment's backbone slice and its exit head")
    backbone_fraction: float = Field(gt=0, le=1, description="cumulative share of backbone FLOPs at this exit")
    cpu_cost: CostSpec
    test_accuracy: float = Field(ge=0, le=1)


class InputSpec(_Strict):
    height: int = Field(gt=0)
    width: int = Field(gt=0)
    color: str = "RGB"
    layout: str = "NCHW"
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize: str = Field(default="center-crop, then area resize", description="how a camera frame becomes the input")


class TraceSpec(_Strict):
    file: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    count: int = Field(gt=0)


class Manifest(_Strict):
    format_version: int = FORMAT_VERSION
    name: str
    architecture: dict[str, Any]
    input: InputSpec
    class_names: list[str] = Field(min_length=2)
    exits: list[ExitSpec] = Field(min_length=1)
    traces: dict[str, TraceSpec] = Field(description="'calibration' and 'test' softmax traces")
    provenance: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.format_version != FORMAT_VERSION:
            raise ValueError(f"format_version {self.format_version} is not supported (expected {FORMAT_VERSION})")
        for k, ex in enumerate(self.exits):
            if ex.logits.shape[-1] != len(self.class_names):
                raise ValueError(f"exits[{k}] ({ex.name}) has {ex.logits.shape[-1]} logits "
                                 f"but there are {len(self.class_names)} class names")
            last = k == len(self.exits) - 1
            if last != (ex.features is None):
                raise ValueError(f"exits[{k}] ({ex.name}): only the last segment may lack a feature output")
            prev = self.exits[k - 1].features if k else None
            if prev is not None and ex.input.shape != prev.shape:
                raise ValueError(f"exits[{k}] ({ex.name}) input shape {ex.input.shape} does not match "
                                 f"exits[{k - 1}] feature shape {prev.shape}")
        for required in ("calibration", "test"):
            if required not in self.traces:
                raise ValueError(f"traces lacks the {required!r} entry")
        return self

    @property
    def costs_ms(self) -> list[float]:
        return [ex.cpu_cost.median_ms for ex in self.exits]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(folder: Path) -> Manifest:
    """Parse and validate ``folder/manifest.json``; raise ``ModelFolderError`` saying what is wrong."""
    if not folder.is_dir():
        raise ModelFolderError(f"model folder {folder} does not exist (set [model] path in config.toml, "
                               "or export one with 'edge-app export')")
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise ModelFolderError(f"{path} is missing: {folder} is not a model folder")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFolderError(f"{path} is not valid JSON ({exc}); re-export the model") from exc
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                             for e in exc.errors())
        raise ModelFolderError(f"{path} does not describe a model folder: {problems}") from exc


def trace_spec(path: Path, count: int) -> TraceSpec:
    """The manifest's entry for a trace file just written beside the model."""
    return TraceSpec(file=path.name, sha256=sha256_file(path), count=count)


def list_traces(folder: Path, written: dict[str, TraceSpec]) -> Path:
    """Add (or replace) trace entries in the model folder's manifest, once their files are written beside it."""
    manifest = read_manifest(folder)
    return write_manifest(folder, manifest.model_copy(update={"traces": {**manifest.traces, **written}}))


def verify_file(folder: Path, relative: str, expected_sha256: str) -> Path:
    """The path of a file the manifest names, after checking that it exists and is unchanged."""
    path = folder / relative
    if not path.is_file():
        raise ModelFolderError(f"{path} is missing (named in {folder / MANIFEST_NAME})")
    actual = sha256_file(path)
    if actual != expected_sha256:
        raise ModelFolderError(f"{path} is corrupt or was replaced: its SHA-256 is {actual[:12]}…, "
                               f"the manifest expects {expected_sha256[:12]}… (truncated copy? re-export the model)")
    return path


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
    return path
