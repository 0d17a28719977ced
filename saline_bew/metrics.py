"""Prometheus metrics of the Saline manager: what a site operator graphs and alerts on.

Why a registry of its own (as the agent's): tests run several managers in one process, and
each must count only its own events. Served only when `[saline] metrics_port` is set.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from vjob import prometheus_web
from vjob.prometheus import describe_process, series_names

_SECONDS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


class SalineMetrics:
    """The manager's counters and gauges in one registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.vjobs = Gauge("vjob_saline_vjobs", "Best-effort vjobs this manager sees, by phase", ["phase"], registry=r)
        self.snapshots = Counter("vjob_saline_snapshots_total", "Snapshots made safe in a repository", registry=r)
        self.snapshot_failures = Counter(
            "vjob_saline_snapshot_failures_total", "Snapshots that did not reach the repository", registry=r
        )
        self.kills = Counter("vjob_saline_kills_total", "Best-effort vjobs OAR killed", registry=r)
        self.work_lost = Counter(
            "vjob_saline_work_lost_seconds_total", "Work lost at kills (time since the last snapshot)", registry=r
        )
        self.resubmissions = Counter("vjob_saline_resubmissions_total", "Killed vjobs submitted again", registry=r)
        self.step_failures = Counter(
            "vjob_saline_step_failures_total", "Passes over one vjob that failed (retried with back-off)", registry=r
        )
        self.refused = Gauge(
            "vjob_saline_refused_rows", "Store rows refused by their checks (never acted on)", registry=r
        )
        self.relocations = Counter(
            "vjob_saline_relocations_total",
            "OAR warnings (checkpoint signal) handled, by the path taken: live migration or suspension",
            ["path"],
            registry=r,
        )
        self.relocation_seconds = Histogram(
            "vjob_saline_relocation_seconds",
            "From OAR's warning to the VMs running elsewhere, by path",
            ["path"],
            buckets=_SECONDS,
            registry=r,
        )
        self.last_pass = Gauge("vjob_saline_last_pass_timestamp_seconds", "When the last pass ended", registry=r)
        describe_process(r, "saline")

    def set_phases(self, counts: dict[str, int]) -> None:
        self.vjobs.clear()
        for phase, n in counts.items():
            self.vjobs.labels(phase=phase).set(n)

    def serve(self, port: int, addr: str = "127.0.0.1", web_config: str = "") -> None:
        """Serve /metrics on `addr`:`port` (a daemon thread); OSError when the port is taken,
        ConfigError when `web_config` (TLS, basic auth: vjob.prometheus_web) does not hold."""
        if not web_config:
            start_http_server(port, addr=addr, registry=self.registry)
            return
        prometheus_web.serve(self.registry, port, addr, prometheus_web.load_web_config(web_config))

    def names(self) -> set[str]:
        """Every series name this registry exports, for checking dashboards and alert rules."""
        return series_names(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.registry.get_sample_value(name, labels or {}) or 0.0

    def text(self) -> str:
        return generate_latest(self.registry).decode()


__all__ = ["SalineMetrics"]
