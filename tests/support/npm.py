"""Client code we did not write, from the npm registry: ``npm pack`` once into data/cache, served as it is."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

CACHE = Path(__file__).resolve().parents[2] / "data" / "cache"


def npm_package(spec: str) -> Path | str:
    """The unpacked ``package/`` folder of ``spec`` (``name@version``), or why it cannot be had."""
    folder = CACHE / spec.lstrip("@").replace("/", "+").replace("@", "-")
    if (folder / "package" / "package.json").is_file():
        return folder / "package"
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not on PATH (.ci/test installs it)"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([npm, "pack", spec, "--pack-destination", tmp], capture_output=True, text=True,
                              check=False, timeout=120)
        tgz = sorted(Path(tmp).glob("*.tgz"))
        if proc.returncode != 0 or not tgz:
            return f"npm pack {spec} failed: {proc.stderr.strip()[-500:]}"
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tgz[0]) as tar:
            tar.extractall(folder, filter="data")
    return folder / "package"
