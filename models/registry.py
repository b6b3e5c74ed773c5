"""Model versions taught from the page, and which one is in use.

    MODELS_DIR/VERSION/                 a model folder (segments, manifest, traces, policy.json)
    MODELS_DIR/deployments.json         {"history": [{"model": NAME, "at": UNIX_S}, ...]}: the last one is in use

``default`` is the configured ``[model] path``. Deploying appends to the history; rolling back drops its last
entry and serves the one before. A folder is checked before anything is swapped (``validate``); the hub then loads
it, and a folder that does not load is never served.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

from models.errors import ModelError, RegistryError
from models.manifest import read_manifest

DEFAULT = "default"
REPORT_FILE = "report.json"
FILES = ("manifest.json", "policy.json")


class ModelRegistry:
    def __init__(self, models_dir: Path, default_folder: Path) -> None:
        self.dir = models_dir
        self.default_folder = default_folder

    @property
    def _file(self) -> Path:
        return self.dir / "deployments.json"

    def history(self) -> list[dict[str, Any]]:
        if not self._file.is_file():
            return [{"model": DEFAULT, "at": None}]
        hist = json.loads(self._file.read_text()).get("history") or []
        return hist if hist else [{"model": DEFAULT, "at": None}]

    def _write(self, history: list[dict[str, Any]]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"history": history}, indent=1))
        tmp.replace(self._file)

    @property
    def active(self) -> str:
        return str(self.history()[-1]["model"])

    def folder(self, name: str) -> Path:
        if name == DEFAULT:
            return self.default_folder
        folder = self.dir / _check_name(name)
        if not folder.is_dir():
            raise RegistryError(f"no model {name!r}; models: {[v['name'] for v in self.versions()]}", 404)
        return folder

    def validate(self, name: str) -> Path:
        """The folder of ``name`` if it is a complete model folder; ``DatasetError`` (422) naming what is wrong."""
        folder = self.folder(name)
        missing = [f for f in FILES if not (folder / f).is_file()]
        if missing:
            raise RegistryError(f"model {name!r} ({folder}) is incomplete: no {', '.join(missing)}", 422)
        try:
            manifest = read_manifest(folder)
        except (ModelError, OSError, ValueError) as exc:
            raise RegistryError(f"model {name!r}: {exc}", 422) from exc
        absent = [e.file for e in manifest.exits if not (folder / e.file).is_file()]
        if absent:
            raise RegistryError(f"model {name!r} ({folder}) lacks its segments {absent}", 422)
        return folder

    def deployed(self, name: str) -> None:
        self._write([*self.history(), {"model": name, "at": round(time.time(), 1)}][-50:])

    def previous(self) -> str:
        hist = self.history()
        if len(hist) < 2:
            raise RegistryError("nothing to roll back to: no model was deployed before this one", 409)
        return str(hist[-2]["model"])

    def rolled_back(self) -> None:
        self._write(self.history()[:-1])

    def versions(self) -> list[dict[str, Any]]:
        """Every model, newest first: name, classes, per-exit held-out accuracy and cost, in use or not."""
        names = [DEFAULT]
        if self.dir.is_dir():
            names += sorted((p.name for p in self.dir.iterdir() if (p / "manifest.json").is_file()), reverse=True)
        active = self.active
        out = []
        for name in names:
            folder = self.default_folder if name == DEFAULT else self.dir / name
            try:
                m = read_manifest(folder)
            except (ModelError, OSError, ValueError) as exc:
                out.append({"name": name, "error": str(exc), "in_use": name == active})
                continue
            out.append({"name": name, "folder": str(folder), "classes": m.class_names,
                        "input_size": m.input.width, "width": m.architecture.get("width"),
                        "test_accuracy": [round(e.test_accuracy, 4) for e in m.exits],
                        "costs_ms": [round(c, 3) for c in m.costs_ms], "in_use": name == active,
                        "policy": (folder / "policy.json").is_file(), "report": self.report(folder)})
        return out

    @staticmethod
    def report(folder: Path) -> dict[str, Any] | None:
        """What training found (``exporter.teach``'s report.json: check accuracy and confusion, the frames it got
        wrong, the policy and its operating points); None for a model not taught here."""
        path = folder / REPORT_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def latest_for(self, dataset: str, classes: list[str]) -> str | None:
        """The newest model taught on ``dataset`` with exactly ``classes`` (a retraining starts from it)."""
        prefix = dataset.replace(" ", "_") + "-"
        for v in self.versions():
            if v["name"].startswith(prefix) and v.get("classes") == classes and v.get("policy"):
                return str(v["name"])
        return None

    def delete(self, name: str) -> None:
        if name == DEFAULT or name in {h["model"] for h in self.history()}:
            raise RegistryError(f"model {name!r} is in use or in the deployment history (roll back first)", 409)
        shutil.rmtree(self.folder(name))


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.match(name) or name in (".", ".."):
        raise RegistryError(f"model name {name!r}: use 1-64 letters, digits, spaces, '_', '-' or '.', starting with "
                            "a letter or digit")
    return name
