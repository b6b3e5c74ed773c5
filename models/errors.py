"""Errors of the ``models`` package: each names the file and what to do."""


class ModelError(RuntimeError):
    """Base class for failures of the model runtime."""


class ModelFolderError(ModelError):
    """The model folder is missing, incomplete, corrupt or inconsistent with its manifest."""


class SegmentRunError(ModelError):
    """A segment raised while running a frame."""


class PolicyError(ModelError):
    """A policy table is missing, corrupt or does not match the model."""


class RegistryError(ModelError, ValueError):
    """A model version the registry refuses (unknown, incomplete, in use); ``status`` is the HTTP status to answer
    with."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
