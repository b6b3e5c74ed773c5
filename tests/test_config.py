"""config.toml validation: defaults load, wrong keys and values are named."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edge_app.config import AppConfig, ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_repository_config_loads() -> None:
    cfg = load_config(REPO / "config.toml")
    assert cfg.server.host == "127.0.0.1" and cfg.server.ice_servers == []
    assert cfg.model_path == REPO / "models" / "default"
    assert cfg.policy.kind == "auto" and cfg.cameras == []


def test_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, ""))
    assert cfg.server.port == 8080 and cfg.budget.total_budget_ms == 250.0
    assert cfg.model_path == tmp_path / "models" / "default"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config.toml: \[server\].prot: unknown key"):
        load_config(write(tmp_path, "[server]\nprot = 80\n"))


def test_unknown_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config.toml: servre: unknown key"):
        load_config(write(tmp_path, "[servre]\nport = 80\n"))


def test_out_of_range_value_says_why(tmp_path: Path) -> None:
    msg = r"\[server\].port: Input should be less than or equal to 65535 \(got 70000\)"
    with pytest.raises(ConfigError, match=msg):
        load_config(write(tmp_path, "[server]\nport = 70000\n"))


def test_bad_provider(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[model\].providers\[0\]: Input should be 'cuda' or 'cpu'"):
        load_config(write(tmp_path, '[model]\nproviders = ["tpu"]\n'))


def test_camera_checks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[cameras\[0\]\].url: Value error, must be an rtsp://"):
        load_config(write(tmp_path, '[[cameras]]\nname = "door"\nurl = "file:///etc/passwd"\n'))
    two = '[[cameras]]\nname = "a"\nurl = "rtsp://h/x"\n[[cameras]]\nname = "a"\nurl = "rtsp://h/y"\n'
    with pytest.raises(ConfigError, match=r"camera names must be unique; repeated: \['a'\]"):
        load_config(write(tmp_path, two))


def test_not_toml_and_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not valid TOML"):
        load_config(write(tmp_path, "[server\n"))
    with pytest.raises(ConfigError, match=r"no such file"):
        load_config(tmp_path / "absent.toml")


def test_lam_and_target_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"either lam or target_accuracy"):
        load_config(write(tmp_path, "[policy]\nlam = 0.5\ntarget_accuracy = 0.9\n"))


def test_emulation_is_no_serve_setting(tmp_path: Path) -> None:
    """A slower device is emulated by the benchmarks (python -m edge_app.bench.serve), not by config.toml."""
    with pytest.raises(ConfigError, match=r"\[model\].emulated_segment_ms: unknown key"):
        load_config(write(tmp_path, "[model]\nemulated_segment_ms = [20, 25, 30]\n"))
    assert load_config(write(tmp_path, "[model]\ncuda_device = 1\n")).model.cuda_device == 1


def test_a_config_error_never_echoes_a_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A too-short token, a camera URL with a password in the wrong scheme, a TURN credential of the wrong type:
    the error names the file, the key and the reason, and shows none of them (it is printed before the secrets
    are registered for redaction)."""
    p = tmp_path / "c.toml"
    p.write_text('[server]\ntoken = "hunter2-short"\n'
                 '[[server.ice_servers]]\nurls = ["turn:turn.example:3478"]\nusername = "u"\ncredential = 12345678\n'
                 '[[cameras]]\nname = "door"\nurl = "http://admin:s3cret-pw@10.0.0.9/stream"\n')
    with pytest.raises(ConfigError) as err:
        load_config(p)
    text = str(err.value)
    print(text)
    for secret in ("hunter2-short", "s3cret-pw", "12345678", "admin"):
        assert secret not in text, secret
    assert "[server].token" in text and "[cameras[0]].url" in text and "not shown" in text
    assert "[server].ice_servers[0].credential" in text


def test_several_workers_run_onnx_runtime_on_the_cpu_never_a_cuda_session_each(
        app_config: Callable[..., AppConfig]) -> None:
    from edge_app.workers import shard

    cfg = app_config(model={"providers": ["cuda", "cpu"]})
    assert shard(cfg, 1, 2, 9000).model.providers == ["cpu"], "two workers: ONNX Runtime on the CPU in each"
    assert shard(cfg, 0, 1, 9000).model.providers == ["cuda", "cpu"], "one worker: as configured"
    path = cfg.base_dir / "config.toml"
    path.write_text(path.read_text() + '\n[model.backend]\nkind = "triton"\n')
    triton = load_config(path)
    assert shard(triton, 0, 2, 9000).model.providers == ["cuda", "cpu"], "a shared Triton: the box's runner as set"
