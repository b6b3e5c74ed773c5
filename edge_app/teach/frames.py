"""What a captured frame is and the names and roles a dataset takes (``edge_app.teach.store`` keeps them)."""

from __future__ import annotations

import contextlib
import fcntl
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edge_app.errors import EdgeAppError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
SPLITS = ("train", "calibration", "test", "check")
ROLES = ("auto", "train", "check")  # auto: dealt out in blocks
DEAL = ("train", "train", "calibration", "train", "train", "test", "train")  # of every 7 blocks: 5 / 1 / 1


class DatasetError(EdgeAppError, ValueError):
    """A request the store refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Frame:
    id: str
    cls: str
    source: str
    t: float  # unix seconds
    width: int
    height: int
    role: str = "auto"  # one of ROLES
    recording: str | None = None  # the recording it was captured in (span labelling)
    region: tuple[float, float, float, float] | None = None  # the camera's region (x, y, w, h) it was cut from


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name) or name in (".", ".."):
        raise DatasetError(f"{kind} name {name!r}: use 1-64 letters, digits, spaces, '_', '-' or '.', starting with "
                           "a letter or digit")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise DatasetError(f"role {role!r}: one of {list(ROLES)} (check: a check recording, never trained on; "
                           "train: always trained on; auto: dealt out in time blocks)")
    return role


@contextlib.contextmanager
def locked(lock: threading.Lock, folder: Path) -> Iterator[None]:
    """``lock`` (this process's threads) and an ``flock`` on ``folder/.lock`` (the other processes)."""
    with lock, (folder / ".lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
