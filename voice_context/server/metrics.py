"""Prometheus metrics for one server, on a registry of its own (never the global one).

Exposed at ``GET /metrics`` in the Prometheus text format:

- ``voice_context_sessions``: sessions open now (gauge)
- ``voice_context_connections``: websocket connections open now (gauge)
- ``voice_context_turns_appended_total``: turns accepted (counter)
- ``voice_context_notes_appended_total``: screen notes accepted (counter)
- ``voice_context_compactions_started_total`` / ``_completed_total`` / ``_failed_total``:
  compactions (counters, read from the session manager at scrape time)
- ``voice_context_compactions_in_flight``: compactions running now (gauge)
- ``voice_context_context_latency_seconds``: time to build a ``context`` reply (histogram)
- ``voice_context_errors_total{code}``: ``error`` replies by code (counter)
- ``voice_context_pushes_dropped_total``: compaction events not delivered because a
  connection's outbox was full (counter)
- ``voice_context_descriptors_refused_total{how}``: connections refused for want of file
  descriptors, at the handshake (``handshake``) or when ``accept()`` itself failed (``accept``)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ManagerCollector(Collector):
    """Reads the session manager's counters when scraped, so they are never out of step."""

    def __init__(
        self,
        counters: Callable[[], Mapping[str, int]],
        sessions: Callable[[], int],
        in_flight: Callable[[], int],
        indexing: Callable[[], tuple[int, int]] = lambda: (0, 0),
    ) -> None:
        self._counters = counters
        self._sessions = sessions
        self._in_flight = in_flight
        self._indexing = indexing

    def collect(self) -> Iterable[Metric]:
        counters = self._counters()
        for name in ("started", "completed", "failed"):
            yield CounterMetricFamily(
                f"voice_context_compactions_{name}",
                f"Compactions {name}.",
                value=counters.get(name, 0),
            )
        yield GaugeMetricFamily("voice_context_sessions", "Sessions open now.", value=self._sessions())
        yield GaugeMetricFamily(
            "voice_context_compactions_in_flight", "Compactions running now.", value=self._in_flight()
        )
        most, total = self._indexing()
        yield GaugeMetricFamily(
            "voice_context_indexing_lag_max",
            "Turns and notes of one session waiting for the recall index (the largest wait now).",
            value=most,
        )
        yield GaugeMetricFamily(
            "voice_context_indexing_lag",
            "Turns and notes waiting for the recall index, over every live session.",
            value=total,
        )


class Metrics:
    """The metrics of one server. ``render()`` is the body of ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.connections = Gauge(
            "voice_context_connections", "Websocket connections open now.", registry=self.registry
        )
        self.turns = Counter("voice_context_turns_appended", "Turns accepted.", registry=self.registry)
        self.notes = Counter("voice_context_notes_appended", "Screen notes accepted.", registry=self.registry)
        self.context_latency = Histogram(
            "voice_context_context_latency_seconds",
            "Time to build a context reply.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "voice_context_errors", "Error replies by code.", ["code"], registry=self.registry
        )
        self.pushes_dropped = Counter(
            "voice_context_pushes_dropped",
            "Compaction events not delivered because a connection's outbox was full.",
            registry=self.registry,
        )
        self.descriptors_refused = Counter(
            "voice_context_descriptors_refused",
            "Connections refused for want of file descriptors.",
            ["how"],
            registry=self.registry,
        )

    def watch_manager(
        self,
        counters: Callable[[], Mapping[str, int]],
        sessions: Callable[[], int],
        in_flight: Callable[[], int],
        indexing: Callable[[], tuple[int, int]] = lambda: (0, 0),
    ) -> None:
        """Expose the session manager's compaction counters and gauges, and its indexing lag."""
        self.registry.register(ManagerCollector(counters, sessions, in_flight, indexing))

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
