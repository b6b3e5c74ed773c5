"""The MQTT topics and payloads, pure: where each thing is published, and Home Assistant's discovery for it.

Under ``PREFIX`` (``[mqtt] prefix``), in the shape Frigate's users know:

* ``PREFIX/available``: ``online`` / ``offline`` (retained; ``offline`` is also the last will);
* ``PREFIX/CAMERA/state``: the camera's state, its label (retained);
* ``PREFIX/CAMERA/LABEL``: ``ON`` while an event of an event label goes on, else ``OFF`` (retained);
* ``PREFIX/events``: each event change, ``{"type": "new"|"update"|"end", "before": ..., "after": ...}``;
* ``PREFIX/CAMERA/snapshot``: the latest event's best frame, a JPEG (retained);
* ``PREFIX/stats``: every ``stats_interval_s``, JSON.

Home Assistant MQTT discovery (https://www.home-assistant.io/integrations/mqtt/#mqtt-discovery), published retained
to ``DISCOVERY/COMPONENT/NODE/OBJECT/config``: one device per camera with a ``sensor`` for its state, a
``binary_sensor`` per event label and a ``camera`` showing the latest snapshot; every entity is unavailable when the
box is (``availability``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Any

from edge_app.events.detector import EventChange


def slug(name: str) -> str:
    """A camera or label name as one topic level and one discovery id (``[A-Za-z0-9_-]``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"


class Topics:
    def __init__(self, prefix: str, client_id: str, discovery_prefix: str = "homeassistant",
                 available: str | None = None) -> None:
        self.prefix = prefix
        self.client_id = client_id
        self.discovery_prefix = discovery_prefix
        self.available = available or f"{prefix}/available"
        self.events = f"{prefix}/events"
        self.stats = f"{prefix}/stats"
        self.ha_status = f"{discovery_prefix}/status"

    def state(self, camera: str) -> str:
        return f"{self.prefix}/{slug(camera)}/state"

    def label(self, camera: str, label: str) -> str:
        return f"{self.prefix}/{slug(camera)}/{slug(label)}"

    def snapshot(self, camera: str) -> str:
        return f"{self.prefix}/{slug(camera)}/snapshot"

    def discovery(self, camera: str, labels: list[str], snapshots: bool,
                  version: str) -> list[tuple[str, dict[str, Any]]]:
        """``(topic, payload)`` of every discovery message for ``camera`` (with event ``labels``)."""
        node = slug(f"{self.client_id}_{camera}")
        device = {"identifiers": [node], "name": camera, "manufacturer": "edge-app",
                  "model": "camera analysed by a three-exit network", "sw_version": version}
        common = {"availability_topic": self.available, "payload_available": "online",
                  "payload_not_available": "offline", "device": device,
                  "origin": {"name": "edge-app", "sw_version": version}}
        out = [(f"{self.discovery_prefix}/sensor/{node}/state/config",
                {**common, "name": "State", "unique_id": f"{node}_state", "state_topic": self.state(camera),
                 "icon": "mdi:cctv"})]
        for label in labels:
            oid = f"{slug(label)}"
            out.append((f"{self.discovery_prefix}/binary_sensor/{node}/{oid}/config",
                        {**common, "name": label, "unique_id": f"{node}_{oid}",
                         "state_topic": self.label(camera, label), "payload_on": "ON", "payload_off": "OFF"}))
        if snapshots:
            out.append((f"{self.discovery_prefix}/camera/{node}/snapshot/config",
                        {**common, "name": "Latest event", "unique_id": f"{node}_snapshot",
                         "topic": self.snapshot(camera)}))
        return out


def event_payload(change: EventChange) -> bytes:
    """``{"type": "new" | "update" | "end", "before": event | null, "after": event}`` (webhooks send the same)."""
    return json.dumps({"type": change.kind, "before": None if change.before is None else asdict(change.before),
                       "after": asdict(change.after)}, separators=(",", ":")).encode()
