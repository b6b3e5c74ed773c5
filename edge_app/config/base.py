"""The base of every ``config.toml`` section: unknown keys are rejected, values are frozen once read."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
