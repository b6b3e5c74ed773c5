"""Access control on the real server: bearer token, offers per client per minute, HTTPS from a cert and key."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.live import running_app
from support.pagewatch import watch_of

from edge_app.config import AppConfig, ConfigError
from edge_app.doors.access import OfferRateLimiter, Tokens, effective_token, effective_tokens, tls_context

TOKEN = "s3cret-token-for-tests-0123456789"
GUARDED = [("GET", "/status"), ("GET", "/metrics"), ("POST", "/offer")]


@pytest.mark.live
async def test_token_guards_everything_but_the_page_and_health(app_config: Callable[..., AppConfig]) -> None:
    cfg = app_config(server={"token": TOKEN, "ice_host_addresses": ["127.0.0.1"]})
    async with running_app(cfg) as base, aiohttp.ClientSession() as http:
        for path in ("/", "/healthz", "/static/app.js"):
            async with http.get(base + path) as r:
                assert r.status == 200, path
        for method, path in GUARDED:
            for headers, why in (({}, "missing"), ({"Authorization": "Bearer nope"}, "wrong token"),
                                 ({"Authorization": f"Basic {TOKEN}"}, "Bearer scheme")):
                async with http.request(method, base + path, headers=headers, json={}) as r:
                    body = await r.json()
                    assert r.status == 401 and why in body["error"], (path, body)
                    assert r.headers["WWW-Authenticate"].startswith("Bearer")
        ok = {"Authorization": f"Bearer {TOKEN}"}
        async with http.get(base + "/status", headers=ok) as r:
            assert r.status == 200 and "model" in await r.json()
        async with http.get(base + "/metrics", headers=ok) as r:
            assert r.status == 200 and "edge_" in await r.text()
        async with http.post(base + "/offer", headers=ok, json={"sdp": "x"}) as r:
            assert r.status == 400, "authorised: now the offer itself is checked"


VIEWER = "viewer-token-for-tests-9876543210"


@pytest.mark.live
async def test_a_viewer_watches_and_reads_but_cannot_deploy_roll_back_delete_or_move_a_region(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    from edge_app.events.detector import Event
    from edge_app.events.store import EventStore

    store = EventStore(tmp_path / "events")
    store.open()
    now = time.time()
    store.put(Event("gate", "open", now - 60, 0.9, now - 60, now - 55, id="1000000-gate-open"), "m")
    assert store.flush()
    store.close()
    cfg = app_config(server={"token": TOKEN, "viewer_token": VIEWER, "ice_host_addresses": ["127.0.0.1"]},
                     events={"path": str(tmp_path / "events")})
    viewer, operator = {"Authorization": f"Bearer {VIEWER}"}, {"Authorization": f"Bearer {TOKEN}"}
    refused = [("POST", "/api/models/rollback"), ("POST", "/api/models/tiny/deploy"),
               ("DELETE", "/api/events/1000000-gate-open"), ("PUT", "/api/cameras/demo/region"),
               ("POST", "/api/training"), ("POST", "/api/datasets"), ("GET", "/api/datasets")]
    async with running_app(cfg) as base, aiohttp.ClientSession() as http:
        seen = ""
        for path in ("/status", "/metrics", "/api/events", "/api/events/1000000-gate-open", "/api/role"):
            async with http.get(base + path, headers=viewer) as r:
                assert r.status == 200, path
                seen += await r.text()
        assert '"viewer"' in seen
        async with http.post(base + "/offer", headers=viewer, json={"sdp": "x"}) as r:
            assert r.status == 400, "a viewer may offer: the offer itself is checked"
        for method, path in refused:
            async with http.request(method, base + path, headers=viewer, json={}) as r:
                body = await r.json()
                assert r.status == 403 and "operator token" in body["error"], (method, path, body)
        async with http.get(base + "/api/role", headers=operator) as r:
            assert (await r.json())["role"] == "operator"
        for method, path in refused[:2]:
            async with http.request(method, base + path, headers=operator, json={}) as r:
                assert r.status not in (401, 403), (method, path, r.status)
        async with http.delete(base + "/api/events/1000000-gate-open", headers=operator) as r:
            assert r.status == 200
        async with http.get(base + "/api/events/1000000-gate-open", headers=operator) as r:
            assert r.status == 404, "the operator deleted it"
    assert TOKEN not in seen and VIEWER not in seen


def test_a_viewer_token_needs_an_operator_token_and_differs_from_it(app_config: Callable[..., AppConfig]) -> None:
    cfg = app_config(server={"viewer_token": VIEWER})
    with pytest.raises(ConfigError, match="needs an operator token"):
        effective_tokens(cfg, {})
    with pytest.raises(ConfigError, match="must differ"):
        effective_tokens(cfg, {"EDGE_APP_TOKEN": VIEWER})
    assert effective_tokens(cfg, {"EDGE_APP_TOKEN": TOKEN}) == Tokens(TOKEN, VIEWER)


def test_environment_token_wins_and_must_be_long(app_config: Callable[..., AppConfig]) -> None:
    cfg = app_config(server={"token": TOKEN})
    assert effective_token(cfg, {}) == TOKEN
    assert effective_token(cfg, {"EDGE_APP_TOKEN": "x" * 20}) == "x" * 20
    with pytest.raises(ConfigError, match="EDGE_APP_TOKEN: the token must be at least 16 characters"):
        effective_token(cfg, {"EDGE_APP_TOKEN": "short"})
    with pytest.raises(ConfigError, match=r"\[server\]\.token: String should have at least 16 characters"):
        app_config(server={"token": "short"})
    assert app_config().server.host == "127.0.0.1", "localhost only unless configured otherwise"


def test_rate_limiter_window_and_memory_bound() -> None:
    lim = OfferRateLimiter(per_minute=3, max_keys=2)
    assert [lim.check("a", t) for t in (0, 1, 2)] == [None, None, None]
    assert lim.check("a", 3) == pytest.approx(57.0), "the 4th within a minute waits for the 1st to age out"
    assert lim.check("b", 3) is None, "other clients are not affected"
    assert lim.check("a", 60.5) is None, "a minute after the first, one more is allowed"
    lim.check("c", 61)
    assert len(lim._seen) == 2, "the least recent client is forgotten"


@pytest.mark.live
async def test_too_many_offers_from_one_client_get_429(app_config: Callable[..., AppConfig]) -> None:
    cfg = app_config(server={"max_offers_per_minute": 3, "ice_host_addresses": ["127.0.0.1"]})
    async with running_app(cfg) as base, aiohttp.ClientSession() as http:
        statuses = []
        for _ in range(5):
            async with http.post(base + "/offer", json={"sdp": "x"}) as r:
                statuses.append(r.status)
                last = (await r.json(), r.headers.get("Retry-After"))
        async with http.get(base + "/healthz") as r:
            assert r.status == 200
    assert statuses == [400, 400, 400, 429, 429]
    assert "at most 3 a minute" in last[0]["error"] and last[1] is not None and int(last[1]) >= 1


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """What the README's openssl command makes, with the cryptography package aiortc already installs."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge-box")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_p, key_p = folder / "cert.pem", folder / "key.pem"
    cert_p.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_p.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
    return cert_p, key_p


@pytest.mark.live
async def test_https_from_a_configured_certificate(app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    from aiohttp import web

    from edge_app.doors.server import create_app
    from edge_app.factory import inference_service

    cert, _ = _self_signed(tmp_path)
    cfg = app_config(server={"tls_cert": "cert.pem", "tls_key": "key.pem"})  # relative to the config file
    ctx = tls_context(cfg)
    assert ctx is not None
    runner = web.AppRunner(create_app(cfg, inference_service(cfg)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        trust = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=trust) as r:
                assert r.status == 200 and (await r.json())["ok"] is True
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # untrusted: the default trust store
                async with http.get(f"https://127.0.0.1:{port}/healthz") as r:
                    await r.read()
    finally:
        await runner.cleanup()


def test_tls_settings_are_checked(app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls_cert and tls_key go together"):
        app_config(server={"tls_cert": "cert.pem"})
    with pytest.raises(ConfigError, match=r"\[server\] tls_cert: .*cert.pem: no such file"):
        tls_context(app_config(server={"tls_cert": "cert.pem", "tls_key": "key.pem"}))
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="are not a PEM certificate and its key"):
        tls_context(app_config(server={"tls_cert": "cert.pem", "tls_key": "key.pem"}))


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.live
async def test_browser_with_the_token_in_the_fragment(app_config: Callable[..., AppConfig], serve: Any,
                                                     browser: Any) -> None:
    cfg = app_config(server={"token": TOKEN, "ice_host_addresses": ["127.0.0.1"]})
    async with browser() as page, serve(cfg) as base:
        watch_of(page).allow(r"status of 401 \(Unauthorized\)")  # the first visit has no token, on purpose
        await page.goto(f"{base}/")  # no token: the page says so instead of connecting
        await page.click("#connect")
        await page.wait_for_function("() => window.edge.error !== null", timeout=20_000)
        refused = await page.evaluate("() => window.edge.error")
        await page.goto(f"{base}/?t=1#token={TOKEN}")
        await page.click("#connect")
        await page.wait_for_function("() => window.edge.error || window.edge.results >= 30", timeout=40_000)
        edge = json.loads(await page.evaluate("() => JSON.stringify({e: edge.error, n: edge.results})"))
        url = page.url
    assert "access token" in refused, refused
    assert edge["e"] is None and edge["n"] >= 30, edge
    assert "token" not in url, "the page takes the token out of the address bar"


@pytest.mark.slow
@pytest.mark.live
async def test_beyond_max_sessions_new_ones_get_503_and_the_running_one_goes_on(
        app_config: Callable[..., AppConfig], serve: Any) -> None:
    import asyncio

    import numpy as np
    from aiortc import RTCPeerConnection
    from test_live_session import collect, connect

    from edge_app.bench.testvideo import LabelledVideo, LabelledVideoTrack

    rng = np.random.default_rng(0)
    video = LabelledVideo(rng.integers(0, 256, (10, 96, 96, 3), dtype=np.uint8), np.zeros(10, int), hold=3)
    results: list[dict[str, Any]] = []
    async with serve(app_config(server={"max_sessions": 1, "ice_host_addresses": ["127.0.0.1"]})) as base:
        first, second = RTCPeerConnection(), RTCPeerConnection()
        tasks: list[asyncio.Task[None]] = []
        try:
            first.addTrack(LabelledVideoTrack(video))
            collect(first, results, [], tasks)
            await connect(base, first)
            second.addTrack(LabelledVideoTrack(video))
            second.createDataChannel("results")
            await second.setLocalDescription(await second.createOffer())
            body = {"sdp": second.localDescription.sdp, "type": "offer"}
            async with aiohttp.ClientSession() as http, http.post(f"{base}/offer", json=body) as r:
                refused = (r.status, await r.json())
            before = len(results)
            for _ in range(100):
                if len(results) > before + 30:
                    break
                await asyncio.sleep(0.1)
        finally:
            for t in tasks:
                t.cancel()
            await first.close()
            await second.close()
    assert refused[0] == 503 and "at capacity: 1 sessions open ([server] max_sessions = 1)" in refused[1]["error"]
    assert len(results) > before + 30, "the running session is not disturbed"
