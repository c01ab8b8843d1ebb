"""Prometheus metrics of the controller (one registry per controller instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_FAST = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


class Metrics:
    """Counters and histograms the orchestrator and detector update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.failovers = Counter("understudy_failovers_total",
                                 "Apps failed over, by how", ["kind"], registry=r)
        self.server_failures = Counter("understudy_server_failures_total",
                                       "Servers declared failed, by signal", ["reason"],
                                       registry=r)
        self.mttr = Histogram("understudy_mttr_seconds",
                              "Failure detection to client notification of a serving location",
                              ["kind"], buckets=_SLOW, registry=r)
        self.detection = Histogram("understudy_detection_latency_seconds",
                                   "Last heartbeat (or signal) to failure declaration",
                                   buckets=_FAST, registry=r)
        self.solve = Histogram("understudy_ilp_solve_seconds", "Warm-backup planning time",
                               buckets=_SLOW, registry=r)
        self.loads = Counter("understudy_model_loads_total", "Model loads, by result",
                             ["result"], registry=r)
        self.load_seconds = Histogram("understudy_model_load_seconds",
                                      "Agent-reported model load time", buckets=_SLOW,
                                      registry=r)
        self.apps = Gauge("understudy_apps", "Apps by status", ["status"], registry=r)
        self.servers = Gauge("understudy_servers", "Servers by state", ["state"], registry=r)
        self.events = Counter("understudy_events_total", "Events published", ["kind"],
                              registry=r)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
