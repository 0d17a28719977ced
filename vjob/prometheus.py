"""What a Prometheus registry exports, by series name: for checking dashboards and alert rules
against the code (the agent's and the Saline manager's exporters alike)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


def series_names(registry: CollectorRegistry) -> set[str]:
    """Every series name `registry` exports (counters with _total and _created, histograms with
    _bucket, _sum, _count and _created, gauges as they are)."""
    out: set[str] = set()
    for family in registry.collect():
        out.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
    return out


__all__ = ["series_names"]
