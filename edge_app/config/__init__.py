"""``config.toml`` -> validated settings.

One pydantic model per concern; every field has a default, a description and
bounds; unknown keys are rejected.  ``load_config`` turns validation errors
into one message that names the file, the key and the reason.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from edge_app.config.base import Section as _Section
from edge_app.config.cameras import CameraConfig
from edge_app.config.outputs import EventsConfig, MqttConfig, WebhookConfig
from edge_app.errors import EdgeAppError

DEFAULT_CONFIG = Path("config.toml")


class ConfigError(EdgeAppError, ValueError):
    """The configuration file is missing, not TOML, or has a wrong key or value."""


class IceServer(_Section):
    urls: list[str] = Field(min_length=1, description="stun:/turn: URLs")
    username: str | None = None
    credential: str | None = None


class ServerConfig(_Section):
    host: str = Field("127.0.0.1", description="address to bind; localhost only unless set otherwise")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0 picks a free one)")
    ice_servers: list[IceServer] = Field(default_factory=list,
                                         description="STUN/TURN servers; empty: no public server is contacted")
    ice_host_addresses: list[str] = Field(default_factory=list,
                                          description="local addresses offered as ICE host candidates; empty: all "
                                                      "of the machine's (aioice's default, which leaves out "
                                                      "127.0.0.1); [\"127.0.0.1\"] for a browser on this machine")
    max_sessions: int = Field(4, ge=1, le=256, description="concurrent peer sessions")
    token: str | None = Field(None, min_length=16, max_length=512, description="bearer token every endpoint but "
                              "the page and /healthz requires; the EDGE_APP_TOKEN environment variable overrides "
                              "it; unset: no authentication. It is the operator's: everything")
    viewer_token: str | None = Field(None, min_length=16, max_length=512, description="a viewer's bearer token "
                                     "(EDGE_APP_VIEWER_TOKEN overrides it): watch, results, events, status; not "
                                     "teach, deploy, roll back, delete events or move a region (403)")
    tls_cert: Path | None = Field(None, description="PEM certificate: serve HTTPS (relative to this file)")
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert (relative to this file)")
    max_offers_per_minute: int = Field(30, ge=1, le=100_000, description="offers one client address may make a "
                                       "minute; more get 429")
    shutdown_timeout_s: float = Field(5.0, gt=0, le=120, description="bounded time to close peers on shutdown")
    share_camera_encoder: bool = Field(True, description="encode a camera's annotated video once for all its "
                                       "viewers (false: one encoder per viewer, each at its own path's rate)")
    results_only_height: int = Field(0, ge=0, le=4320, description="the most lines a browser that only wants "
                                     "results is asked to send (0: twice the model's input height, which the analysis "
                                     "area-resizes by exactly 2; the server decodes less)")
    camera_passthrough: bool = Field(True, description="forward a camera's own H.264 (no B-frames) to the viewers "
                                     "that draw the analysis themselves (the page), with no transcode")
    peer_timeout_s: float = Field(10.0, ge=1, le=600, description="close a session whose data channel has "
                                  "answered no ping for this long (a peer that vanished without closing)")
    connect_timeout_s: float = Field(15.0, ge=1, le=600, description="close a session that has not connected "
                                     "(ICE + DTLS) this long after its offer, freeing its slot (a tab closed "
                                     "mid-connect, a browser that cannot reach this box)")
    trusted_proxies: list[str] = Field(default_factory=list, description="addresses of load balancers in front of "
                                       "this box: from them, X-Forwarded-For names the client (offer limits)")
    cors_origins: list[str] = Field(default_factory=list, description="origins (scheme://host[:port]) of pages "
                                    "served elsewhere that may call the API from a browser; empty: same origin only")

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        bad = [o for o in v if o != "*" and (not o.startswith(("http://", "https://")) or o.rstrip("/") != o
                                             or o.count("/") != 2)]
        if bad:
            raise ValueError(f"each origin is scheme://host[:port] with no path or trailing slash, or \"*\"; "
                             f"not {bad}")
        return v


class OnnxBackend(_Section):
    kind: Literal["onnxruntime"] = "onnxruntime"


class TritonBackend(_Section):
    kind: Literal["triton"]
    url: str = Field("127.0.0.1:8001", min_length=3, description="host:port of the infer-server's gRPC")
    model_name: str = Field("edge_chain", min_length=1, description="the chain's model name on that server")
    timeout_s: float = Field(1.0, gt=0, le=60, description="a frame's wait when it carries no compute budget")
    fallback: bool = Field(True, description="what Triton does not answer (down, full, late) is answered from the "
                           "cheap path on this box's ONNX Runtime, counted")
    fallback_max_exit: int = Field(1, ge=1, le=16, description="the cheap path's operating point: frames answered "
                                   "here run the frame's own policy up to this exit (1: exit 1 only, the cheapest)")
    shared_memory: bool = Field(False, description="send frames through system shared memory (the server on this "
                                "host) instead of inside the gRPC message; needs access_token")
    access_token: str | None = Field(None, min_length=16, max_length=512, description="the infer-server's "
                                     "EDGE_APP_TRITON_TOKEN (Triton's restricted endpoints); never shown")

    @model_validator(mode="after")
    def _shm_token(self) -> TritonBackend:
        if self.shared_memory and self.access_token is None:
            raise ValueError("shared_memory needs access_token (the infer-server's EDGE_APP_TRITON_TOKEN)")
        return self


class ModelConfig(_Section):
    @field_validator("backend", mode="before")
    @classmethod
    def _backend_name(cls, v: object) -> object:
        return {"kind": v} if isinstance(v, str) else v  # backend = "onnxruntime", as before

    path: Path = Field(Path("models/default"), description="model folder, relative to the config file")
    providers: list[Literal["cuda", "cpu"]] = Field(["cuda", "cpu"], min_length=1,
                                                     description="ONNX Runtime providers in order of preference")
    threads: int = Field(1, ge=0, le=256, description="intra-op threads (0: ONNX Runtime's default)")
    workers: int = Field(1, ge=1, le=64, description="inference threads shared by all sessions and cameras (and as "
                         "many media threads for frame conversion and annotation)")
    warmup_runs: int = Field(3, ge=0, le=100, description="blank frames run at load")
    cost_window: int = Field(256, ge=1, le=100_000, description="frames in the running cost estimate")
    backend: OnnxBackend | TritonBackend = Field(default_factory=lambda: OnnxBackend(), discriminator="kind",
                                                 description='[model.backend] kind = "onnxruntime" (in this '
                                                 'process) or "triton" (a shared Triton Inference Server)')
    cuda_device: int = Field(0, ge=0, le=63, description="which GPU, when the CUDA provider is used")
    batch_window_ms: float = Field(0.0, ge=0, le=50, description="gather frames of all sources this long and run "
                                   "each segment once for all of them (per-frame exits stay); 0: frame by frame")
    max_batch: int = Field(32, ge=1, le=1024, description="most frames in one batch")


class PolicyConfig(_Section):
    kind: Literal["auto", "dynamic-index", "fixed", "confidence", "entropy", "patience", "budget-greedy"] = Field(
        "auto", description="exit policy; auto: what fit-policy found better on held-out calibration frames, the "
        "dynamic index or a tuned confidence threshold (policy.json's default)")
    lam: float | None = Field(None, ge=0, le=1, description="T-Tamer weight of loss against cost")
    target_accuracy: float | None = Field(None, gt=0, le=1, description="derive lam from this accuracy instead")
    threshold: float = Field(0.9, ge=0, le=1, description="confidence threshold (kind = confidence)")
    fixed_exit: int = Field(3, ge=1, le=16, description="exit to use (kind = fixed)")
    truncate: bool = Field(True, description="never start an exit whose predicted cost misses the deadline; "
                                             "false only for baselines that ignore it")
    adapt_to_load: bool = Field(True, description="each frame's operating point follows the arrival rate: when "
                                "frames arrive faster than the inference threads (or a source's own pipeline) can "
                                "take them at the fitted lam, the dynamic index moves to a cheaper operating point, "
                                "and back when the load falls; false: the fitted lam always")
    load_headroom: float = Field(0.85, gt=0.1, le=1.0, description="share of the inference threads' time the "
                                 "expected compute may fill")

    @model_validator(mode="after")
    def _one_of(self) -> PolicyConfig:
        if self.lam is not None and self.target_accuracy is not None:
            raise ValueError("set either lam or target_accuracy, not both")
        return self


class BudgetConfig(_Section):
    total_budget_ms: float = Field(250.0, gt=0, le=10_000, description="capture-to-result deadline")
    rtt_prior_ms: float = Field(50.0, ge=0, le=5_000, description="RTT assumed until RTCP reports one")
    bitrate_prior_kbps: float = Field(500.0, gt=0, le=1_000_000, description="bitrate assumed until REMB")
    min_receive_kbps: float = Field(250.0, ge=0, le=100_000, description="floor of the bandwidth the browser is "
                                    "asked to send (REMB); aiortc's estimator over-reacts to a step in delay; 0: off")
    safety_margin_ms: float = Field(5.0, ge=0, le=1_000, description="slack kept back from the budget")
    late_return_factor: float = Field(1.0, ge=0, le=4, description="a frame that came up late (late_ms) is "
                                      "assumed to go back this much later too, until the RTT estimate shows it "
                                      "(1: a symmetric path; 0: only the uplink's lateness counts)")
    reuse_when_late: bool = Field(True, description="a frame that even exit 1 would answer late, safety margin "
                                  "spent too, gets the smoothed answer so far at once (exit 0, reused: true); "
                                  "only with [policy] truncate")
    max_reused_in_a_row: int = Field(2, ge=1, le=30, description="after this many reused answers the next frame "
                                     "is analysed whatever its budget, so the answer cannot go stale")


class SmoothingConfig(_Section):
    alpha: float = Field(0.5, gt=0, le=1, description="weight of a new frame in the class-distribution average "
                                                       "(times its exit's relative reliability); 1: no smoothing")
    hysteresis: float = Field(0.1, ge=0, le=1, description="a new label is shown once it leads the shown one by this")
    max_depth_step: int | None = Field(None, ge=1, le=16, description="exits the depth may rise or fall per frame "
                                       "(the deadline may always cut it); unset: no limit, the policy picks each "
                                       "frame's depth (a limit of 1 cost the dynamic index 0.4-0.65 points offline)")


class TrainingConfig(_Section):
    data_dir: Path = Field(Path("data/scenes"), description="captured frames: DATASET/CLASS/*.jpg with frames.jsonl "
                           "(source and time of each), relative to the config file")
    models_dir: Path = Field(Path("models/taught"), description="models trained from the page, one folder per "
                             "version, and deployments.json (which is in use, and the ones before it)")
    epochs: int = Field(12, ge=1, le=500, description="fine-tuning epochs")
    lr: float = Field(2e-3, gt=0, le=1, description="peak learning rate (one cycle)")
    batch_size: int = Field(32, ge=2, le=1024)
    threads: int = Field(0, ge=0, le=256, description="torch threads in the training process (0: torch's default)")
    block_s: float = Field(2.0, gt=0, le=600, description="frames are split into train / calibration / test by "
                           "contiguous blocks this long (neighbouring frames are near copies)")
    min_frames_per_class: int = Field(20, ge=5, le=100_000, description="fewer, and training is refused")
    max_record_s: float = Field(120.0, gt=0, le=3600, description="longest recording one request may ask for")


class DemoConfig(_Section):
    enabled: bool = Field(False, description="offer the built-in demo camera (labelled digits on photos, looped) "
                          "on the page, with live accuracy against its labels")
    name: str = Field("demo", min_length=1, max_length=64, description="its camera name")
    fps: float = Field(15.0, gt=0, le=60)
    hold_frames: int = Field(15, ge=1, le=1000, description="frames each labelled image is shown for")


class AppConfig(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    smoothing: SmoothingConfig = Field(default_factory=SmoothingConfig)
    cameras: list[CameraConfig] = Field(default_factory=list)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    demo: DemoConfig = Field(default_factory=DemoConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)
    webhooks: list[WebhookConfig] = Field(default_factory=list)
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    base_dir: Path = Field(Path("."), exclude=True, description="folder of the config file (set by load_config)")

    @model_validator(mode="after")
    def _unique_cameras(self) -> AppConfig:
        names = [c.name for c in self.cameras] + ([self.demo.name] if self.demo.enabled else [])
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"camera names must be unique; repeated: {dupes}")
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> AppConfig:
        if (self.server.tls_cert is None) != (self.server.tls_key is None):
            raise ValueError("[server] tls_cert and tls_key go together: set both to serve HTTPS, or neither")
        return self

    @property
    def model_path(self) -> Path:
        return self.model.path if self.model.path.is_absolute() else self.base_dir / self.model.path

    def resolve(self, p: Path) -> Path:
        """A path from this config, relative to the config file's folder."""
        return p if p.is_absolute() else self.base_dir / p


def _where(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for i, p in enumerate(loc):
        if p in ("rtsp", "file", "demo") and i and isinstance(loc[i - 1], int):
            continue  # the tag of a [[cameras]] kind: the kind's own key names it
        if isinstance(p, int):
            parts[-1] = f"{parts[-1]}[{p}]" if parts else f"[{p}]"
        else:
            parts.append(str(p))
    if len(parts) > 1:
        return f"[{parts[0]}].{'.'.join(parts[1:])}"
    return parts[0] if parts else "(top level)"


SECRET_KEYS = ("token", "credential", "password", "username", "secret", "url")


def _shown(loc: tuple[int | str, ...], value: object) -> str:
    """What a config error may echo of the value it refused: nothing of a token, a password, a URL (which may
    hold a camera's password) or a path, only its length; nothing of a table."""
    if isinstance(value, dict | list):
        return ""
    names = [str(p).lower() for p in loc if isinstance(p, str)]
    if any(k in n for n in names for k in SECRET_KEYS) or (isinstance(value, str) and "://" in value):
        return f" (got a value of {len(str(value))} characters, not shown)"
    return f" (got {value!r})"


def describe_validation_error(path: Path, exc: ValidationError) -> str:
    lines = []
    for e in exc.errors():
        where = _where(tuple(e["loc"]))
        if e["type"] == "extra_forbidden":
            lines.append(f"{path}: {where}: unknown key (check the spelling; see config.toml in the repository)")
        else:
            got = _shown(e["loc"], e.get("input"))
            lines.append(f"{path}: {where}: {e['msg']}{got}")
    return "\n".join(lines)


def load_config(path: Path = DEFAULT_CONFIG) -> AppConfig:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file (pass --config PATH)") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    if "base_dir" in raw:
        raise ConfigError(f"{path}: base_dir: unknown key")
    try:
        return AppConfig.model_validate({**raw, "base_dir": path.resolve().parent})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(path, exc)) from exc
