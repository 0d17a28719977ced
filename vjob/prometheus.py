"""What a Prometheus registry exports, by series name: for checking dashboards and alert rules
against the code (the agent's and the Saline manager's exporters alike)."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


def series_names(registry: CollectorRegistry) -> set[str]:
    """Every series name `registry` exports (counters with _total and _created, histograms with
    _bucket, _sum, _count and _created, gauges as they are)."""
    out: set[str] = set()
    for family in registry.collect():
        out.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
    return out


def describe_process(registry: CollectorRegistry, component: str) -> None:
    """What every exporter of vjob carries beside its own series: `vjob_build_info` (which
    release and Python answer, for an upgrade's dashboards) and the process's own `process_*`
    series (CPU seconds, resident memory, open files, start time) — a registry of our own does
    not get them from prometheus_client's default one."""
    try:
        release = version("vjob")
    except PackageNotFoundError:  # a plain checkout
        release = "source"
    info = Gauge(
        "vjob_build_info",
        "Always 1: the vjob release and Python of this exporter, as labels",
        ["component", "version", "python"],
        registry=registry,
    )
    info.labels(component=component, version=release, python=platform.python_version()).set(1)
    ProcessCollector(registry=registry)


__all__ = ["describe_process", "series_names"]
