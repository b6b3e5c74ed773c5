"""MQTT against Debian's mosquitto, read by its own mosquitto_sub: availability and its last will, states, events,
snapshots, Home Assistant discovery checked field by field, a broker killed and restarted, TLS with a client
certificate and a password that is never shown."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.live import REPO, running_app
from support.mqtt import Broker, Subscriber, broker, free_port, make_tls, need_mosquitto, publish

from edge_app.config import AppConfig
from edge_app.events.topics import Topics

# Home Assistant's MQTT discovery schema (https://www.home-assistant.io/integrations/mqtt/ and the pages of
# sensor.mqtt, binary_sensor.mqtt, camera.mqtt): the keys each component documents, the ones it requires.
ENTITY_KEYS = {"availability", "availability_mode", "availability_template", "availability_topic", "device",
               "default_entity_id", "enabled_by_default", "encoding", "entity_category", "entity_picture", "icon",
               "json_attributes_template", "json_attributes_topic", "name", "object_id", "origin",
               "payload_available", "payload_not_available", "platform", "qos", "unique_id"}
COMPONENT_KEYS = {
    "sensor": ({"state_topic"}, {"device_class", "expire_after", "force_update", "last_reset_value_template",
                                 "options", "state_class", "suggested_display_precision", "unit_of_measurement",
                                 "value_template"}),
    "binary_sensor": ({"state_topic"}, {"device_class", "expire_after", "force_update", "off_delay", "payload_off",
                                        "payload_on", "value_template"}),
    "camera": ({"topic"}, {"image_encoding"}),
}
DEVICE_KEYS = {"configuration_url", "connections", "hw_version", "identifiers", "manufacturer", "model", "model_id",
               "name", "serial_number", "suggested_area", "sw_version", "via_device"}
ORIGIN_KEYS = {"name", "sw_version", "support_url"}
DISCOVERY_TOPIC = re.compile(r"^(?P<prefix>[^/]+)/(?P<component>[a-z_]+)/(?:[A-Za-z0-9_-]+/)?[A-Za-z0-9_-]+/config$")
STRING_KEYS = {"name", "unique_id", "state_topic", "topic", "availability_topic", "payload_on", "payload_off",
               "payload_available", "payload_not_available", "icon"}


def check_discovery(topic: str, payload: dict[str, Any]) -> str:
    """Every field of one discovery message against Home Assistant's documented schema; its component."""
    m = DISCOVERY_TOPIC.match(topic)
    assert m, f"{topic}: not <prefix>/<component>/[<node_id>/]<object_id>/config"
    component = m["component"]
    required, own = COMPONENT_KEYS[component]
    assert required <= payload.keys(), f"{topic}: lacks {required - payload.keys()}"
    extra = payload.keys() - ENTITY_KEYS - own - required
    assert not extra, f"{topic}: undocumented {extra}"
    for key in STRING_KEYS & payload.keys():
        assert isinstance(payload[key], str) and payload[key], f"{topic}: {key} must be a non-empty string"
    for key in ("state_topic", "topic", "availability_topic"):
        if key in payload:
            assert not set("+#") & set(payload[key]), f"{topic}: {key} must be a topic, not a filter"
    assert "availability" not in payload or "availability_topic" not in payload, "HA: not both"
    device = payload["device"]
    assert not device.keys() - DEVICE_KEYS, f"{topic}: device has undocumented {device.keys() - DEVICE_KEYS}"
    assert device.get("identifiers") or device.get("connections"), "HA: a device needs identifiers or connections"
    assert "unique_id" in payload, "HA: device information only works with a unique_id"
    assert not payload["origin"].keys() - ORIGIN_KEYS and payload["origin"]["name"]
    return component


def test_discovery_payloads_follow_home_assistants_schema() -> None:
    topics = Topics("edge", "box-1")
    msgs = topics.discovery("front door", ["open", "parcel"], snapshots=True, version="1.0")
    comps = [check_discovery(t, p) for t, p in msgs]
    assert comps == ["sensor", "binary_sensor", "binary_sensor", "camera"]
    ids = [p["unique_id"] for _, p in msgs]
    assert len(set(ids)) == len(ids), "unique ids are unique"
    assert msgs[0][1]["state_topic"] == "edge/front_door/state"
    assert {p["device"]["identifiers"][0] for _, p in msgs} == {"box-1_front_door"}, "one device per camera"


def _mqtt_cfg(b: Broker, **extra: object) -> dict[str, object]:
    return {"enabled": True, "port": b.port, "prefix": "edge", "client_id": "edge-test-box", "keepalive_s": 5,
            "stats_interval_s": 2.0, **extra}


def _demo(app_config: Callable[..., AppConfig], tmp_path: Path, mqtt: dict[str, object]) -> AppConfig:
    return app_config(demo={"enabled": True, "fps": 15.0, "hold_frames": 45},
                      events={"path": str(tmp_path / "events"), "min_s": 1.5, "min_confidence": 0.3,
                              "labels": ["*"]}, mqtt=mqtt)


async def _status(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(base + "/status") as r:
        return (await r.json())["events"]


@pytest.mark.live
@pytest.mark.slow
async def test_states_events_snapshots_and_discovery_reach_mosquitto_sub_across_a_broker_restart(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    with broker(tmp_path / "broker") as b:
        sub = Subscriber(b, ["edge/#", "homeassistant/#"]).start()
        cfg = _demo(app_config, tmp_path, _mqtt_cfg(b))
        async with running_app(cfg) as base, aiohttp.ClientSession() as http:
            await asyncio.to_thread(sub.wait_for, "edge/available", b"online")
            await asyncio.to_thread(sub.wait_for, "edge/events", None, 15.0)
            await asyncio.to_thread(sub.wait_for, "edge/demo/snapshot", None, 10.0)
            await asyncio.to_thread(sub.wait_for, "edge/stats", None, 5.0)
            # Home Assistant (re)starts: the discovery comes again
            before = len(sub.on("homeassistant/sensor/edge-test-box_demo/state/config"))
            await asyncio.to_thread(publish, b, "homeassistant/status", "online")
            await asyncio.sleep(1.0)
            again = len(sub.on("homeassistant/sensor/edge-test-box_demo/state/config"))

            # the broker goes away for 4 s while events go on, and comes back on the same port
            b.stop()
            sub.stop()
            stopped = time.time()
            await asyncio.sleep(4.0)
            away = await _status(http, base)
            b.start()
            await asyncio.to_thread(sub.start)
            await asyncio.sleep(6.0)
            after = await _status(http, base)
            async with http.get(base + "/metrics") as r:
                metrics = await r.text()
            async with http.get(base + "/api/events?camera=demo&limit=100") as r:
                kept = (await r.json())["events"]
        sub.stop()

    discovery = {m.topic: json.loads(m.payload) for m in sub.messages if m.topic.startswith("homeassistant/")
                 and m.topic.endswith("/config")}
    comps = sorted(check_discovery(t, p) for t, p in discovery.items())
    print(f"mqtt: {len(sub.messages)} messages; discovery {comps}; away {away['mqtt']}; after {after['mqtt']}")
    assert comps.count("sensor") == 1 and comps.count("camera") == 1 and comps.count("binary_sensor") >= 10
    assert again > before, "homeassistant/status online publishes the discovery again"
    # a state change reaches the state_topic the sensor's discovery names, as a label the model knows
    state_topic = discovery["homeassistant/sensor/edge-test-box_demo/state/config"]["state_topic"]
    states = [m.payload.decode() for m in sub.on(state_topic)]
    assert states and all(s in {str(d) for d in range(10)} for s in states), states
    binary = next(p for t, p in discovery.items() if "/binary_sensor/" in t)
    assert {m.payload for m in sub.on(binary["state_topic"])} <= {b"ON", b"OFF"}
    events = [json.loads(m.payload) for m in sub.on("edge/events")]
    kinds = {e["type"] for e in events}
    assert {"new", "end"} <= kinds and all(e["after"]["source"] == "demo" for e in events)
    ended = [e for e in events if e["type"] == "end"]
    assert all(e["after"]["end_s"] is not None and e["before"]["id"] == e["after"]["id"] for e in ended)
    assert sub.on("edge/demo/snapshot")[-1].payload[:2] == b"\xff\xd8", "a JPEG"
    # across the outage: the app noticed, queued, reconnected; every event kept that began while the broker was
    # away reached the subscriber after it came back, or was counted as dropped
    assert away["mqtt"]["connected"] is False and after["mqtt"]["connected"] is True
    assert after["mqtt"]["connects"] == 2 and after["mqtt"]["disconnects"] == 1
    during = {e["id"] for e in kept if stopped <= e["start"] <= stopped + 4.0}
    told = {e["after"]["id"] for e in events if e["type"] == "new"}
    assert during, "events began during the outage"
    assert during <= told or after["mqtt"]["dropped"] > 0, (during - told, after["mqtt"])
    assert "edge_mqtt_connected 1.0" in metrics and "edge_mqtt_dropped_total 0.0" in metrics
    assert re.search(r"^edge_event_changes_total\{kind=\"new\"\} [1-9]", metrics, re.M)
    said = [m.payload for m in sub.on("edge/available")]
    assert said[-2:] == [b"online", b"offline"], f"back online after the restart, offline at a clean stop: {said}"


@pytest.mark.live
@pytest.mark.slow
def test_sigkill_makes_the_broker_say_offline_and_tls_with_a_password_never_shows_it(
        app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    """The app in its own process over TLS with a client certificate and a password; SIGKILLed, its last will
    (``offline``, retained) is published by the broker; the password shows in neither ``/status`` nor its log."""
    need_mosquitto()
    tls = make_tls(tmp_path / "tls")
    password = "mqtt-pass-Zq8v3XkL"
    with broker(tmp_path / "broker", tls=tls, users={"edge": password}) as b:
        sub = Subscriber(b, ["edge/available", "edge/demo/state"]).start()
        mqtt = _mqtt_cfg(b, tls_ca=str(tls.ca), tls_cert=str(tls.client_cert), tls_key=str(tls.client_key),
                         username="edge", password=password)
        cfg = _demo(app_config, tmp_path, mqtt)
        log = tmp_path / "app.log"
        port = free_port()
        with log.open("wb") as out:
            app = subprocess.Popen([sys.executable, "-m", "edge_app", "serve", "--config",
                                    str(cfg.base_dir / "config.toml"), "--port", str(port)], cwd=REPO, stdout=out,
                                   stderr=subprocess.STDOUT)
        try:
            sub.wait_for("edge/available", b"online", 60.0)
            sub.wait_for("edge/demo/state", None, 15.0)
            status = _get_status(port)
            app.send_signal(signal.SIGKILL)
            app.wait(10)
            killed = time.monotonic()
            offline = sub.wait_for("edge/available", b"offline", 15.0)
        finally:
            if app.poll() is None:
                app.kill()
            sub.stop()
    print(f"mqtt over TLS: status {status['events']['mqtt']}; offline {offline.at - killed:.2f} s after SIGKILL")
    assert status["events"]["mqtt"]["tls"] is True and status["events"]["mqtt"]["connected"] is True
    text = log.read_text() + json.dumps(status)
    assert password not in text and "mqtt: connected" in text


def _get_status(port: int) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_a_missing_tls_file_fails_the_start_naming_it(app_config: Callable[..., AppConfig], tmp_path: Path) -> None:
    from edge_app.errors import EdgeAppError
    from edge_app.events import attach

    cfg = app_config(mqtt={"enabled": True, "tls_ca": "nope/ca.pem"})
    with pytest.raises(EdgeAppError, match=r"\[mqtt\] tls_ca: .*nope/ca.pem: no such file"):
        attach(None, cfg, None)  # type: ignore[arg-type]
    assert os.path.exists(cfg.base_dir / "config.toml")


def test_while_the_broker_is_away_the_queue_is_bounded_drops_are_counted_and_the_latest_states_kept() -> None:
    """No broker at all: a listener call returns at once; beyond ``queue`` the oldest event message goes (counted);
    each retained topic keeps only its latest value, to publish on connect."""
    from edge_app.config.outputs import MqttConfig
    from edge_app.events.detector import Event, EventChange, StateChange
    from edge_app.events.mqtt import MqttOutput

    out = MqttOutput(MqttConfig(enabled=True, queue=10), lambda p: p, "1", dict)
    out.add_camera("gate", ["open"])
    t0 = time.perf_counter()
    for i in range(25):
        ev = Event("gate", "open", float(i), 0.9, float(i), id=f"e{i}")
        out(EventChange("new", None, ev))
        out(StateChange("gate", "open" if i % 2 == 0 else "shut", float(i), 0.9))
    per_call_us = (time.perf_counter() - t0) / 50 * 1e6
    assert out.counts["dropped"] == 15 and len(out.queue) == 10
    assert json.loads(out.queue[0].payload)["after"]["id"] == "e15", "the oldest went"
    assert out.dirty["edge-app/gate/state"].payload == b"open" and out.dirty["edge-app/gate/open"].payload == b"ON"
    assert per_call_us < 200, per_call_us
