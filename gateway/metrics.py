"""The gateway's Prometheus metrics, per app (``GET /metrics``).

Per-app label children are cached, so a request costs a few increments, not label lookups.
Apps the routing table does not know are counted under ``app_id="unknown"`` (a client cannot
grow the label set with made-up names).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.exchange import Answer

UNKNOWN_APP = "unknown"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
DECISION_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                    1e-2)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class _AppChildren:
    __slots__ = ("requests", "latency", "answered")

    def __init__(self, metrics: GatewayMetrics, app_id: str) -> None:
        self.requests = metrics.requests.labels(app_id)
        self.latency = metrics.latency.labels(app_id)
        self.answered: dict[tuple[str, str], Counter] = {}


class GatewayMetrics:
    """Counters and histograms of one gateway, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("understudy_gateway_requests", "inference requests received",
                                ["app_id"], registry=r)
        self.errors = Counter("understudy_gateway_errors",
                              "requests answered with an error, by reason",
                              ["app_id", "reason"], registry=r)
        self.latency = Histogram("understudy_gateway_latency_seconds",
                                 "time from a request's arrival to its answer (resends "
                                 "included)", ["app_id"], buckets=LATENCY_BUCKETS, registry=r)
        self.answers = Counter("understudy_gateway_answers",
                               "answers, by the server and variant that gave them",
                               ["app_id", "server_id", "variant"], registry=r)
        self.resends = Counter("understudy_gateway_resends",
                               "attempts sent again: the app moved, or an attempt failed",
                               ["app_id", "cause"], registry=r)
        self.hedges = Counter("understudy_gateway_hedges",
                              "requests also sent to a warm backup, and how many it won",
                              ["app_id", "outcome"], registry=r)
        self.route_changes = Counter("understudy_gateway_route_changes",
                                     "times an app's serving replica changed", ["app_id"],
                                     registry=r)
        self.controller_connected = Gauge("understudy_gateway_controller_connected",
                                          "1 while the controller's event stream is open",
                                          registry=r)
        self.last_seq = Gauge("understudy_gateway_last_event_seq",
                              "sequence number of the last controller event applied",
                              registry=r)
        self.snapshots = Counter("understudy_gateway_snapshots",
                                 "routing table reloads from GET /v1/apps", registry=r)
        self.reconstructions = Counter(
            "understudy_gateway_reconstructions",
            "answers rebuilt from a parity model's output because the prediction was "
            "unavailable: its attempt failed, or it was late", ["app_id", "cause"], registry=r)
        self.substitutes = Counter(
            "understudy_gateway_substitute_answers",
            "answers that are not the model's own prediction, by source (reconstructed, "
            "default, approximate) and cause (failed, late)", ["app_id", "source", "cause"],
            registry=r)
        self.coding_groups = Counter(
            "understudy_gateway_coding_groups",
            "coding groups, by outcome: encoded (its parity query sent), filled (sent with "
            "stand-ins for a late query), timeout (closed unfilled), unencodable "
            "(a query's tensors unreadable, or shapes that differ)",
            ["app_id", "outcome"], registry=r)
        self.parity_queries = Counter(
            "understudy_gateway_parity_queries",
            "parity queries sent to parity models, by outcome (answered, failed)",
            ["app_id", "outcome"], registry=r)
        self.scheduler_decisions = Histogram(
            "understudy_gateway_scheduler_decision_cpu_seconds",
            "CPU time of a batch scheduler per batch decided (next_batch and the enqueues since "
            "the previous decision)", ["app_id", "scheduler"], buckets=DECISION_BUCKETS,
            registry=r)
        self.scheduler_decision_p50 = Gauge(
            "understudy_gateway_scheduler_decision_cpu_p50_seconds",
            "median CPU time of the app's scheduler per decision, over its recent decisions",
            ["app_id"], registry=r)
        self.batch_sizes = Histogram(
            "understudy_gateway_batch_size", "requests per batch a scheduler sent",
            ["app_id", "scheduler"], buckets=BATCH_BUCKETS, registry=r)
        self.batch_overheads = Histogram(
            "understudy_gateway_batch_overhead_seconds",
            "what a scheduled batch took beyond the model's own time (its latency minus the "
            "longest execution time the model reported; models that report one)",
            ["app_id"], buckets=LATENCY_BUCKETS, registry=r)
        self.profile_refreshes = Counter(
            "understudy_gateway_profile_refreshes",
            "Orloj's profile refreshes, built off the event loop, by outcome (installed: the "
            "distributions moved and the new curves are in use; unchanged: they had not "
            "moved; failed: the build raised and the profile in use was kept)",
            ["app_id", "outcome"], registry=r)
        self.scheduler_drops = Counter(
            "understudy_gateway_scheduler_drops",
            "requests a batch scheduler dropped before sending them, by reason "
            "(deadline-unreachable, expired, action-window-missed)",
            ["app_id", "scheduler", "reason"], registry=r)
        self.gc_pauses = Histogram(
            "understudy_gateway_gc_pause_seconds",
            "passes of the garbage collector (the event loop waits for each), by generation",
            ["generation"], buckets=PAUSE_BUCKETS, registry=r)
        self._apps: dict[str, _AppChildren] = {}

    def _app(self, app_id: str) -> _AppChildren:
        children = self._apps.get(app_id)
        if children is None:
            children = self._apps[app_id] = _AppChildren(self, app_id)
        return children

    # --- QueueObserver and ExchangeEvents ------------------------------------------------

    def answered(self, app_id: str, answer: Answer, latency_s: float) -> None:
        children = self._app(app_id)
        children.requests.inc()
        children.latency.observe(latency_s)
        key = (answer.route.server_id, answer.route.variant)
        counter = children.answered.get(key)
        if counter is None:
            counter = children.answered[key] = self.answers.labels(app_id, *key)
        counter.inc()
        if answer.hedge_won:
            self.hedges.labels(app_id, "won").inc()

    def failed(self, app_id: str, reason: str, latency_s: float) -> None:
        children = self._app(app_id)
        children.requests.inc()
        children.latency.observe(latency_s)
        self.errors.labels(app_id, reason).inc()

    def rejected(self, reason: str) -> None:
        """A request refused before it reached an app's queue (bad input, unknown app)."""
        self.requests.labels(UNKNOWN_APP).inc()
        self.errors.labels(UNKNOWN_APP, reason).inc()

    def resent(self, app_id: str, cause: str) -> None:
        self.resends.labels(app_id, cause).inc()

    def hedged(self, app_id: str) -> None:
        self.hedges.labels(app_id, "sent").inc()

    # --- ProtectionEvents -------------------------------------------------------------------

    def substituted(self, app_id: str, source: str, cause: str) -> None:
        self.substitutes.labels(app_id, source, cause).inc()
        if source == "reconstructed":
            self.reconstructions.labels(app_id, cause).inc()

    def group_closed(self, app_id: str, outcome: str) -> None:
        self.coding_groups.labels(app_id, outcome).inc()

    def parity_sent(self, app_id: str, outcome: str) -> None:
        self.parity_queries.labels(app_id, outcome).inc()

    # --- SchedulerEvents --------------------------------------------------------------------

    def decided(self, queue_id: str, scheduler: str, cpu_s: float, batch_size: int) -> None:
        self.scheduler_decisions.labels(queue_id, scheduler).observe(cpu_s)
        self.batch_sizes.labels(queue_id, scheduler).observe(batch_size)

    def dropped(self, app_id: str, scheduler: str, reason: str) -> None:
        self.scheduler_drops.labels(app_id, scheduler, reason).inc()

    def batch_overhead(self, queue_id: str, seconds: float) -> None:
        self.batch_overheads.labels(queue_id).observe(seconds)

    def profile_refreshed(self, queue_id: str, outcome: str) -> None:
        self.profile_refreshes.labels(queue_id, outcome).inc()

    def watch_scheduler(self, queue_id: str, p50_s: Callable[[], float]) -> None:
        """Expose a batch queue's scheduler's median CPU time per decision.

        Labelled with the app's id, or with the name of a queue that apps share.
        """
        self.scheduler_decision_p50.labels(queue_id).set_function(p50_s)

    def collector_paused(self, generation: int, seconds: float) -> None:
        self.gc_pauses.labels(str(generation)).observe(seconds)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
