"""MQTT (``[mqtt]``, aiomqtt): what ``EventsOutput`` sees, published under ``[mqtt] prefix`` (``topics`` has the
topics and Home Assistant's discovery).

Nothing a pipeline does waits on the broker: a listener call only records the message. Retained topics (states,
``ON``/``OFF``, snapshots, discovery, availability) keep their latest value, published on every connect (a broker
restarted without persistence gets them all back); events are queued in order, at most ``[mqtt] queue`` of them:
beyond that, while the broker is away, the oldest are dropped and counted. Every message is QoS 1 (at least once):
one the broker has not acknowledged is sent again after a reconnect. The connection is retried with backoff (1 s,
2 s ... 30 s). The broker publishes ``offline`` on ``PREFIX/available`` (the last will) when the box vanishes; a
clean stop publishes it first. A ``homeassistant/status`` of ``online`` (Home Assistant started) publishes the
discovery again.

At a clean stop, ``drain`` waits (bounded) until what was recorded is published (the ``OFF`` of the events the stop
ended among it), before ``offline``; with the broker away, nothing waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt

from edge_app.config.outputs import MqttConfig
from edge_app.events.detector import EventChange, StateChange
from edge_app.events.topics import Topics, event_payload

log = logging.getLogger(__name__)

BACKOFF_S = (1.0, 30.0)
SEND_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Message:
    topic: str
    payload: bytes
    retain: bool = False
    qos: int = 1


class MqttOutput:
    def __init__(self, cfg: MqttConfig, resolve: Callable[[Path], Path], version: str,
                 stats: Callable[[], dict[str, Any]]) -> None:
        self.cfg = cfg
        self.resolve = resolve
        self.topics = Topics(cfg.prefix, cfg.client_id, cfg.discovery_prefix, cfg.availability_topic)
        self.event_labels: dict[str, list[str]] = {}  # camera -> its event labels (its binary sensors)
        self.version = version
        self.stats = stats
        self.retained: dict[str, Message] = {}  # the latest value of every retained topic
        self.dirty: dict[str, Message] = {}  # retained values not yet published on this connection
        self.queue: deque[Message] = deque()  # events, in order
        self.wake = asyncio.Event()
        self.idle = asyncio.Event()  # connected, and nothing recorded is left to publish
        self.connected = False
        self.last_error: str | None = None
        self.counts = {"published": 0, "dropped": 0, "connects": 0, "disconnects": 0, "discovery": 0}

    # -- what EventsOutput calls (never waits)

    def __call__(self, change: StateChange | EventChange) -> None:
        if isinstance(change, StateChange):
            self._retain(self.topics.state(change.source), change.label.encode())
            return
        self._queue(Message(self.topics.events, event_payload(change)))
        if change.kind != "update":
            on = b"ON" if change.kind == "new" else b"OFF"
            self._retain(self.topics.label(change.after.source, change.after.label), on)

    def snapshot(self, camera: str, event_id: str, jpeg: bytes) -> None:
        if self.cfg.snapshots:
            self._retain(self.topics.snapshot(camera), jpeg)

    def _retain(self, topic: str, payload: bytes) -> None:
        msg = Message(topic, payload, retain=True)
        self.retained[topic] = self.dirty[topic] = msg
        self.idle.clear()
        self.wake.set()

    def _queue(self, msg: Message) -> None:
        if len(self.queue) >= self.cfg.queue:
            self.queue.popleft()
            self.counts["dropped"] += 1
            if self.counts["dropped"] == 1 or self.counts["dropped"] % 1000 == 0:
                log.warning("mqtt: %d event messages dropped so far: the queue (%d) is full (the broker is away, or "
                            "slower than the events come)",
                            self.counts["dropped"], self.cfg.queue)
        self.queue.append(msg)
        self.idle.clear()
        self.wake.set()

    def add_camera(self, camera: str, labels: list[str]) -> None:
        """A camera followed: its event labels are ``OFF`` until an event starts; its discovery is published."""
        self.event_labels[camera] = labels
        for label in labels:
            self._retain(self.topics.label(camera, label), b"OFF")
        self._discover(camera, labels)

    def discovery(self) -> None:
        """Publish Home Assistant's discovery (again)."""
        for camera, labels in self.event_labels.items():
            self._discover(camera, labels)
        self.counts["discovery"] += 1

    def _discover(self, camera: str, labels: list[str]) -> None:
        if self.cfg.discovery:
            for topic, payload in self.topics.discovery(camera, labels, self.cfg.snapshots, self.version):
                self._retain(topic, json.dumps(payload, separators=(",", ":")).encode())

    # -- the connection

    def _client(self) -> aiomqtt.Client:
        cfg = self.cfg
        tls = None
        if cfg.tls_ca is not None:
            tls = aiomqtt.TLSParameters(ca_certs=str(self.resolve(cfg.tls_ca)),
                                        certfile=None if cfg.tls_cert is None else str(self.resolve(cfg.tls_cert)),
                                        keyfile=None if cfg.tls_key is None else str(self.resolve(cfg.tls_key)))
        will = aiomqtt.Will(self.topics.available, b"offline", qos=1, retain=True)
        return aiomqtt.Client(cfg.host, cfg.effective_port, identifier=cfg.client_id, username=cfg.username,
                              password=cfg.password, will=will, keepalive=cfg.keepalive_s, tls_params=tls,
                              timeout=SEND_TIMEOUT_S)

    async def run(self) -> None:
        """Connect, publish, reconnect, until cancelled (then ``offline`` is published, if connected)."""
        backoff = BACKOFF_S[0]
        while True:
            try:
                async with self._client() as client:
                    await self._connected(client)
                    backoff = BACKOFF_S[0]
                    try:
                        await asyncio.gather(self._pump(client), self._listen(client), self._tick())
                    except asyncio.CancelledError:
                        await self._goodbye(client)
                        raise
            except aiomqtt.MqttError as exc:
                self._lost(exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])

    async def _connected(self, client: aiomqtt.Client) -> None:
        self.connected, self.last_error = True, None
        self.counts["connects"] += 1
        log.info("mqtt: connected to %s (topics under %s/)", self.broker, self.cfg.prefix)
        self.dirty = {self.topics.available: Message(self.topics.available, b"online", retain=True)}
        self.discovery()
        self.dirty.update(self.retained)
        await client.subscribe(self.topics.ha_status, qos=1)

    async def drain(self, timeout_s: float) -> None:
        """Wait until what was recorded so far is published, at most ``timeout_s``; at once with no broker."""
        if not self.connected:
            if self.queue or self.dirty:
                log.warning("mqtt: stopping with the broker away: %d event message(s) and %d state(s) not "
                            "published", len(self.queue), len(self.dirty))
            return
        try:
            await asyncio.wait_for(self.idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("mqtt: %d event message(s) and %d state(s) not published at stop within %.1f s",
                        len(self.queue), len(self.dirty), timeout_s)

    def _lost(self, exc: Exception, backoff: float) -> None:
        self.idle.clear()
        if self.connected:
            self.counts["disconnects"] += 1
        why = str(exc) or type(exc).__name__
        if self.connected or self.last_error != why:
            log.warning("mqtt: broker %s: %s; retrying in %.0f s, up to %d event messages kept meanwhile",
                        self.broker, why, backoff, self.cfg.queue)
        self.connected, self.last_error = False, why

    async def _pump(self, client: aiomqtt.Client) -> None:
        while True:
            while self.dirty:
                topic, msg = next(iter(self.dirty.items()))
                await self._publish(client, msg)
                if self.dirty.get(topic) is msg:  # not replaced by a newer value meanwhile
                    del self.dirty[topic]
            while self.queue and not self.dirty:
                msg = self.queue[0]
                await self._publish(client, msg)  # one at a time: a message acknowledged is never sent again
                if self.queue and self.queue[0] is msg:  # not dropped meanwhile
                    self.queue.popleft()
            if not self.dirty and not self.queue:
                self.wake.clear()
                self.idle.set()
                await self.wake.wait()

    async def _publish(self, client: aiomqtt.Client, msg: Message) -> None:
        await client.publish(msg.topic, msg.payload, qos=msg.qos, retain=msg.retain)
        self.counts["published"] += 1

    async def _listen(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            if message.topic.matches(self.topics.ha_status) and message.payload in (b"online", "online"):
                log.info("mqtt: Home Assistant is online: discovery published again")
                self.discovery()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.stats_interval_s)
            stats = {"t": round(time.time(), 3), **self.stats(), "mqtt": self.status()}
            self._queue(Message(self.topics.stats, json.dumps(stats, separators=(",", ":")).encode(), qos=0))

    async def _goodbye(self, client: aiomqtt.Client) -> None:
        try:
            await asyncio.wait_for(client.publish(self.topics.available, b"offline", qos=1, retain=True), 2.0)
        except (aiomqtt.MqttError, TimeoutError) as exc:
            log.warning("mqtt: offline not published at shutdown (%s); the broker's last will says it", exc)

    @property
    def broker(self) -> str:
        return f"{self.cfg.host}:{self.cfg.effective_port}"

    def status(self) -> dict[str, Any]:
        """For ``/status``: never the username or password."""
        return {"broker": self.broker, "tls": self.cfg.tls_ca is not None, "connected": self.connected,
                "last_error": self.last_error, "queued": len(self.queue), "pending_retained": len(self.dirty),
                **self.counts}
