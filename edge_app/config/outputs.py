"""The outputs' sections of ``config.toml``: ``[events]`` (what is kept), ``[[webhooks]]`` and ``[mqtt]`` (where it is
sent)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from edge_app.config.base import Section as _Section


class EventsConfig(_Section):
    enabled: bool = Field(True, description="keep events from the cameras' states (GET /api/events)")
    path: Path = Field(Path("data/events"), description="folder of events.db and snapshots/, relative to the "
                       "config file")
    labels: list[str] = Field(default_factory=list, description='labels that are events on every camera ("*": '
                              "all); a camera's own events = [...] adds to them; the other labels are states only")
    min_s: float = Field(2.0, gt=0, le=600, description="a label must hold this long to become a state")
    min_confidence: float = Field(0.6, ge=0, le=1, description="... each answer at least this sure")
    snapshots: bool = Field(True, description="keep a JPEG of each event's best frame")
    retention_days: float = Field(30.0, gt=0, le=3650, description="events that ended longer ago are deleted")
    max_bytes: int = Field(2_000_000_000, ge=10_000_000, description="the oldest events go beyond this much")
    min_free_bytes: int = Field(200_000_000, ge=0, description="under this much free disk, snapshots pause")


class WebhookConfig(_Section):
    url: str = Field(description="http(s) URL the event JSON is POSTed to (only configured URLs are called)")
    events: list[Literal["new", "update", "end"]] = Field(["new", "end"], min_length=1,
                                                         description="which event changes it gets")
    secret: str | None = Field(None, min_length=16, max_length=512, description="HMAC-SHA256 key: each body is "
                               "signed in the X-Edge-Signature-256 header (sha256=HEX); never shown")
    timeout_s: float = Field(5.0, gt=0, le=60, description="one delivery's time limit")
    retries: int = Field(3, ge=0, le=10, description="tries after the first, 0.5 s, 1 s, 2 s ... apart")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v


TOPIC_WORD = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$")


class MqttConfig(_Section):
    enabled: bool = Field(False, description="publish availability, states, events, snapshots and stats to a broker")
    host: str = Field("127.0.0.1", min_length=1, description="the broker's host name or address")
    port: int | None = Field(None, ge=1, le=65535, description="default 1883, or 8883 with TLS")
    client_id: str = Field("edge-app", pattern=r"^[A-Za-z0-9_-]{1,64}$", description="this box's MQTT client id; "
                           "also its Home Assistant device id (one per box)")
    prefix: str = Field("edge-app", description="topics go under PREFIX/ (letters, digits, _ and -, / between)")
    username: str | None = Field(None, max_length=256, description="never shown")
    password: str | None = Field(None, max_length=512, description="never shown")
    tls_ca: Path | None = Field(None, description="CA file that signed the broker's certificate: TLS on")
    tls_cert: Path | None = Field(None, description="client certificate (PEM), with tls_key")
    tls_key: Path | None = Field(None, description="its private key (PEM)")
    keepalive_s: int = Field(30, ge=5, le=3600, description="the broker says offline this long x 1.5 after a "
                             "box vanishes")
    discovery: bool = Field(True, description="publish Home Assistant MQTT discovery (a device per camera)")
    discovery_prefix: str = Field("homeassistant", description="Home Assistant's discovery prefix")
    snapshots: bool = Field(True, description="publish each camera's latest event snapshot (JPEG, retained)")
    stats_interval_s: float = Field(60.0, ge=1, le=3600, description="PREFIX/stats every this many seconds")
    availability_topic: str | None = Field(None, description="where this process says online/offline (default "
                                           "PREFIX/available; each worker of serve --workers has its own)")
    queue: int = Field(1000, ge=10, le=1_000_000, description="messages kept while the broker is away; beyond it "
                       "the oldest are dropped and counted")

    @field_validator("prefix", "discovery_prefix")
    @classmethod
    def _topic(cls, v: str) -> str:
        if not TOPIC_WORD.match(v):
            raise ValueError("must be words of letters, digits, _ or -, joined by / (no + # or spaces)")
        return v

    @model_validator(mode="after")
    def _pairs(self) -> MqttConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together (a client certificate and its key)")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("a client certificate needs TLS: set tls_ca too")
        if self.password is not None and self.username is None:
            raise ValueError("a password needs a username")
        return self

    @property
    def effective_port(self) -> int:
        return self.port or (8883 if self.tls_ca else 1883)
