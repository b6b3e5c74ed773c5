"""One protocol, two readers: the shared vectors (tests/protocol/vectors.json) through ``edge_app.protocol`` and,
in Chromium, through the page's ``static/protocol.js``; and the server's own messages are the vectors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.live import chromium_page, running_app
from support.protocol_cases import CLASSES, frame_result

from edge_app import protocol
from edge_app.config import AppConfig

VECTORS = json.loads((Path(__file__).parent / "protocol" / "vectors.json").read_text())["vectors"]


@pytest.mark.parametrize("case", VECTORS, ids=[v["name"] for v in VECTORS])
def test_every_vector_parses_as_it_says(case: dict[str, Any]) -> None:
    if not case["ok"]:
        with pytest.raises(protocol.ProtocolError, match=case["reason"].replace("(", r"\(")):
            protocol.parse(case["text"])
        return
    msg = protocol.parse(case["text"])
    assert case["type"] == msg.TYPE
    assert msg.to_json() == json.loads(case["text"]), "what it parses, it writes back the same"
    if case["from"] == "peer":
        assert isinstance(protocol.parse_from_peer(case["text"]), protocol.Ping | protocol.Pong)


def test_the_server_writes_exactly_the_vectors() -> None:
    """The server's own messages (results from one fixed frame included) are byte for byte the vectors: the page
    test below reads what the server sends, not a copy that could drift."""
    by_name = {v["name"]: v["text"] for v in VECTORS}
    made = {
        "result, compact (the default)": protocol.result(frame_result(), CLASSES, detail=False,
                                                          rtt_source="rtcp+datachannel"),
        "result, every field (detail)": protocol.result(
            frame_result(truth="dog", raw_correct=True, smoothed_correct=True), CLASSES, detail=True,
            rtt_source="rtcp", session="0123456789ab", receive_estimate_bps=None),
        "result, answered unanalysed (skipped: a newer frame came)": protocol.result(
            frame_result(skipped="stale", reused=True, exit=0, exits_run=0, stamp=None), CLASSES, detail=False,
            rtt_source="prior"),
        "result, exit 0 (the picture did not change: the last answer)": protocol.result(
            frame_result(reused=True, unchanged=True, exit=0, exits_run=0, actual_ms=0.021, segments_ms=()), CLASSES,
            detail=False, rtt_source="rtcp+datachannel"),
        "ping from the server (its clock)": protocol.Ping(7, 1765000000123.4),
        "source: reconnecting": protocol.Source("door", "reconnecting", "no answer within 5 s (open_timeout_s)"),
        "uplink: no cap": protocol.Uplink(None, 1.0, 30.0),
        "model": protocol.Model("taught-3", ("cat", "dog", "empty"), 3),
        "video: the camera's own picture": protocol.Video("camera"),
    }
    for name, msg in made.items():
        assert msg.encode() == by_name[name], name
    compact = json.loads(by_name["result, compact (the default)"])
    assert "label" not in compact["raw"] and compact["smoothed"]["label"] == "dog", "compact: the class, not its name"
    assert set(protocol.BY_TYPE) == {"result", "ping", "pong", "source", "uplink", "model", "video", "error"}
    assert {v["type"] for v in VECTORS if v["ok"]} == set(protocol.BY_TYPE), "a vector for every message type"


def test_a_peer_may_send_only_ping_and_pong() -> None:
    assert protocol.parse_from_peer("ping 12345").answer() == "pong 12345"  # aiortc's example client
    for text, reason in [('{"type": "result", "source": "x"}', "expected 'ping' or 'pong'"),
                         ("x" * 5000, "under 4 KiB"), (b"{}", "JSON text")]:
        with pytest.raises(protocol.ProtocolError, match=reason):
            protocol.parse_from_peer(text)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.live
async def test_the_page_reads_the_same_vectors(app_config: Callable[..., AppConfig]) -> None:
    async with running_app(app_config()) as base, chromium_page() as page:
        await page.goto(base + "/")
        got = await page.evaluate("""async (vectors) => {
          const { parseMessage } = await import("/static/protocol.js");
          return vectors.map((v) => {
            try { const m = parseMessage(v.text); return { ok: true, type: m.type, same: JSON.stringify(m) ===
                  JSON.stringify(JSON.parse(v.text)) }; }
            catch (e) { return { ok: false, reason: e.message }; }
          });
        }""", VECTORS)
    for case, seen in zip(VECTORS, got, strict=True):
        assert seen["ok"] == case["ok"], (case["name"], seen)
        if case["ok"]:
            assert seen["type"] == case["type"] and seen["same"], (case["name"], seen)
        else:
            assert case["reason"] in seen["reason"], (case["name"], seen)
