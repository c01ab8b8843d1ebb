"""Prometheus metrics of the controller (one registry per controller instance)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_MONITOR_COUNTERS = {
    "heartbeats": "Heartbeat datagrams received",
    "acks": "Probe answers received from suspected agents",
    "rejected": "Datagrams rejected (malformed, unknown kind)",
    "suspicions": "Servers suspected after an abnormal silence",
    "cleared": "Suspicions cleared by a heartbeat or a probe answer (declarations avoided)",
    "declarations": "Servers declared failed by the heartbeat monitor (silent, or dead)",
    "streams_lost": "Liveness streams closed without a goodbye (agent processes died)",
    "restarts": "Restarts of the heartbeat monitor process",
}

_FAST = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


class Metrics:
    """Counters and histograms the orchestrator and detector update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # process_start_time_seconds (with the process' CPU and memory): counters restart at
        # zero with the controller, and this tells a scraper (and rate()) when it happened.
        ProcessCollector(registry=r)
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
        self.failover_plan = Histogram("understudy_failover_plan_seconds",
                                       "Time the policy took to plan one server's failover",
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
        self.repairs = Counter("understudy_repairs_total",
                               "Discrepancies repaired and degraded apps upgraded by the "
                               "reconciler, by kind", ["kind"], registry=r)
        self.events = Counter("understudy_events_total", "Events published", ["kind"],
                              registry=r)

    def watch_detector(self, stats: Callable[[], Any]) -> None:
        """Export the heartbeat monitor's counters (read from ``stats()`` at each scrape)."""
        self.registry.register(_MonitorCollector(stats))

    def watch_redis(self, stats: Callable[[], Any]) -> None:
        """Export Redis's availability and outages (``RedisHealth.stats()`` at each scrape)."""
        self.registry.register(_RedisCollector(stats))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class _MonitorCollector(Collector):
    """The heartbeat monitor process's counters and CPU time, as of its last report."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self.stats()
        for name, help_text in _MONITOR_COUNTERS.items():
            family = CounterMetricFamily(f"understudy_monitor_{name}", help_text)
            family.add_metric([], float(getattr(stats, name)))
            yield family
        cpu = CounterMetricFamily("understudy_monitor_cpu_seconds",
                                  "CPU time of the heartbeat monitor process")
        cpu.add_metric([], float(stats.cpu_s))
        yield cpu
        servers = GaugeMetricFamily("understudy_monitor_servers",
                                    "Servers the heartbeat monitor knows")
        servers.add_metric([], float(stats.servers))
        yield servers


class _RedisCollector(Collector):
    """Whether Redis answers, how many outages there were and how long they lasted."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        stats = self.stats()
        up = GaugeMetricFamily("understudy_redis_up",
                               "1 while Redis answers, 0 during an outage (API calls get 503)")
        up.add_metric([], 1.0 if stats.up else 0.0)
        yield up
        outages = CounterMetricFamily("understudy_redis_outages",
                                      "Redis outages since the controller started")
        outages.add_metric([], float(stats.outages))
        yield outages
        seconds = CounterMetricFamily("understudy_redis_outage_seconds",
                                      "Seconds Redis was unreachable, the outage under way "
                                      "included")
        seconds.add_metric([], float(stats.outage_seconds))
        yield seconds
