"""Prometheus metrics of the agent: what an operator graphs and alerts on.

Why a registry of our own rather than the global default: tests and the demo create several
agents in one process, and each must count only its own events. The exporter is started only
when `[agent] metrics_port` is set (0 disables it), on `[agent] metrics_address` (127.0.0.1 by
default: the metrics name jobs and nodes, so exposing them is the operator's choice). The
shipped Grafana dashboard and alert rules use these names; tests/test_operator_deploy.py holds
them to `AgentMetrics().names()`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from vjob import prometheus_web
from vjob.prometheus import describe_process, series_names

# Checkpoints of a 128 MiB guest take 0.3-1.3 s; interactive waits range from seconds to hours.
_SECONDS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
_WAIT = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
_BYTES = tuple(float(2**k) for k in range(20, 36, 2))  # 1 MiB .. 32 GiB


class AgentMetrics:
    """The agent's counters, gauges and histograms in one registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue = Gauge(
            "vjob_queue_jobs", "Jobs the RMS reports, by class and state", ["job_class", "state"], registry=r
        )
        self.preemptions = Counter("vjob_preemptions_total", "vjobs checkpointed for an interactive job", registry=r)
        self.releases = Counter("vjob_releases_total", "Checkpointed vjobs released to run again", registry=r)
        self.checkpoint_seconds = Histogram(
            "vjob_checkpoint_seconds", "Time to save one VM, as its pilot measured it", buckets=_SECONDS, registry=r
        )
        self.checkpoint_bytes = Histogram(
            "vjob_checkpoint_bytes", "Size of one saved VM memory state", buckets=_BYTES, registry=r
        )
        self.switch_seconds = Histogram(
            "vjob_switch_seconds",
            "From deciding a switch to its victims being requeue-held",
            buckets=_SECONDS,
            registry=r,
        )
        self.interactive_wait = Histogram(
            "vjob_interactive_wait_seconds",
            "Queue time of interactive jobs, observed when they start",
            buckets=_WAIT,
            registry=r,
        )
        self.ticks = Counter("vjob_agent_ticks_total", "Agent loop iterations", registry=r)
        self.errors = Counter("vjob_agent_errors_total", "Agent failures, by kind", ["kind"], registry=r)
        self.store_up = Gauge("vjob_store_up", "1 when the state store answered in the last tick", registry=r)
        self.last_tick = Gauge("vjob_agent_last_tick_timestamp_seconds", "When the last tick ended", registry=r)
        self.active = Gauge(
            "vjob_agent_active", "1 while this agent holds its cluster's lease (0: standby)", registry=r
        )
        self.interval = Gauge(
            "vjob_agent_interval_seconds", "The agent's [agent] interval_s (the stall alert scales with it)", registry=r
        )
        describe_process(r, "agent")

    def set_queue(self, counts: dict[tuple[str, str], int]) -> None:
        """Replace the queue gauge with this tick's counts (states that vanished go to 0)."""
        self.queue.clear()
        for (job_class, state), n in counts.items():
            self.queue.labels(job_class=job_class, state=state).set(n)

    def serve(self, port: int, addr: str = "127.0.0.1", web_config: str = "") -> None:
        """Serve /metrics on `addr`:`port` (a daemon thread); OSError when the port is taken,
        ConfigError when `web_config` (TLS, basic auth: vjob.prometheus_web) does not hold."""
        if not web_config:
            start_http_server(port, addr=addr, registry=self.registry)
            return
        prometheus_web.serve(self.registry, port, addr, prometheus_web.load_web_config(web_config))

    def names(self) -> set[str]:
        """Every series name this registry exports (counters with _total and _created,
        histograms with _bucket, _sum, _count and _created), for checking dashboards."""
        return series_names(self.registry)

    def text(self) -> str:
        return generate_latest(self.registry).decode()
