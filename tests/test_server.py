"""A real server on a free port: page, health, status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from support.live import running_app

from edge_app.config import load_config
from models.folder import policy_meta

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    async with running_app(load_config(REPO / "config.toml")) as url:
        yield url


@pytest.mark.live
async def test_page_health_and_status(base_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base_url}/") as r:
            assert r.status == 200 and "edge-app" in await r.text()
        async with http.get(f"{base_url}/static/app.js") as r:
            assert r.status == 200
        async with http.get(f"{base_url}/healthz") as r:
            assert (await r.json()) == {"ok": True, "sessions": 0}
        async with http.get(f"{base_url}/status") as r:
            s = await r.json()
    assert s["model"]["providers"][-1] == "CPUExecutionProvider"
    assert [e["name"] for e in s["model"]["exits"]] == ["exit1", "exit2", "exit3"]
    assert len(s["model"]["classes"]) == 11
    # the policy served, not the one configured: [policy] kind = "auto" serves what fit-policy chose
    meta = policy_meta(REPO / "models" / "default")
    assert s["policy"]["kind"] == meta["default"]["kind"] == "dynamic-index", s["policy"]
    assert s["policy"]["lam"] == round(meta["lam"], 6) and "exit0" in s["policy"], s["policy"]
    assert s["policy"]["why"] == meta["default"]["why"] and "policy.json" in s["policy"]["from"]
    assert s["policy_configured"] == {**s["policy_configured"], "kind": "auto", "threshold": 0.9}


def test_status_names_each_policy_as_served() -> None:
    from edge_app.config import PolicyConfig
    from edge_app.decision.scheduler import describe_served, policy_from_config

    model = REPO / "models" / "default"
    for cfg, want in ((PolicyConfig(kind="dynamic-index"), {"kind": "dynamic-index", "min_exit": 1}),
                      (PolicyConfig(kind="dynamic-index", lam=0.3), {"kind": "dynamic-index", "lam": 0.3}),
                      (PolicyConfig(kind="fixed", fixed_exit=2), {"kind": "fixed-2", "exit": 2}),
                      (PolicyConfig(kind="confidence", threshold=0.7), {"kind": "confidence", "threshold": 0.7})):
        shown = describe_served(cfg, model, policy_from_config(cfg, model))
        assert want.items() <= shown.items(), (cfg, shown)
        assert shown["from"], shown
    refit = describe_served(PolicyConfig(lam=0.3), model, policy_from_config(PolicyConfig(lam=0.3), model))
    assert refit["kind"] == "dynamic-index" and "refitted" in refit["from"], refit
