"""The events' figures for ``/metrics``, read from their ``/status`` at each scrape: changes by kind, the store's
writes, drops and pauses (a short disk pauses snapshots first), MQTT's connection, publishes and drops, each
webhook's deliveries by outcome (its URL as ``/status`` shows it, password hidden)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class EventsCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any] | None]) -> None:
        self._status = status

    def collect(self) -> Iterable[Metric]:
        st = self._status()
        if st is None:
            return
        changes = CounterMetricFamily("edge_event_changes", "Event changes (new, update, end) and state changes",
                                      labels=["kind"])
        for kind, n in st["changes"].items():
            changes.add_metric([kind], n)
        yield changes
        yield CounterMetricFamily("edge_event_store_written", "Events written to the store", value=st["written"])
        yield CounterMetricFamily("edge_event_store_dropped", "Event writes the store could not make",
                                  value=st["dropped"])
        paused = GaugeMetricFamily("edge_event_store_paused", "1 while the store pauses writing, by what: snapshots "
                                   "pause first when the disk is short, events when it is full", labels=["what"])
        paused.add_metric(["snapshots"], 1.0 if st["snapshots_paused"] else 0.0)
        paused.add_metric(["events"], 1.0 if st["events_paused"] else 0.0)
        yield paused
        mqtt = st.get("mqtt")
        if mqtt is not None:
            yield GaugeMetricFamily("edge_mqtt_connected", "1 while connected to the broker",
                                    value=1.0 if mqtt["connected"] else 0.0)
            yield GaugeMetricFamily("edge_mqtt_queued", "Event messages waiting for the broker", value=mqtt["queued"])
            yield CounterMetricFamily("edge_mqtt_published", "Messages the broker acknowledged",
                                      value=mqtt["published"])
            yield CounterMetricFamily("edge_mqtt_dropped", "Event messages dropped while the broker was away and "
                                      "the queue was full", value=mqtt["dropped"])
            yield CounterMetricFamily("edge_mqtt_disconnects", "Connections to the broker lost",
                                      value=mqtt["disconnects"])
        hooks = CounterMetricFamily("edge_webhook_deliveries", "Webhook deliveries by outcome (sent, retries, "
                                    "failed after its retries, dropped with its queue full)", labels=["url", "outcome"])
        for hook in st["webhooks"]:
            for outcome in ("sent", "retries", "failed", "dropped"):
                hooks.add_metric([hook["url"], outcome], hook[outcome])
        yield hooks
