"""The OAR adapter: OAR's commands and REST API, `vjob rms parse --rms oar`, and the agent's
adapter. The Saline best-effort manager (saline_bew) drives OAR through `plugins.oar.client`.
"""

from __future__ import annotations

from typing import Any

from plugins.oar.adapter import ENVIRONMENT, OarAdapter
from plugins.oar.client import OarClient, OarCommands, OarRest, SubmitRequest
from plugins.oar.parse import OarJob, nodes_from_resources, parse_jobs, parse_resources
from vjob.errors import InputError
from vjob.model import Job, Node

__all__ = [
    "ENVIRONMENT",
    "OarAdapter",
    "OarClient",
    "OarCommands",
    "OarJob",
    "OarRest",
    "SubmitRequest",
    "make_adapter",
    "make_client",
    "parse_output",
]


def parse_output(kind: str, text: str, *, source: str) -> list[Job] | list[Node]:
    """Jobs from `oarstat -f -J` (or `-J`), nodes from `oarnodes -J`."""
    if kind == "jobs":
        return [j.to_job() for j in parse_jobs(text, source=source)]
    if kind == "nodes":
        return nodes_from_resources(parse_resources(text, source=source))
    raise InputError(f"kind = {kind!r}: must be jobs or nodes")


def make_client(config: Any, site: str | None = None) -> OarClient:
    """The client of `site` (default: the first configured site, else the local commands)."""
    timeout = config.agent.command_timeout_s
    sites = config.saline.sites
    chosen = None
    if site is not None:
        chosen = next((s for s in sites if s.name == site), None)
        if chosen is None:
            known = ", ".join(s.name for s in sites) or "none configured"
            raise InputError(f"site = {site!r}: not in saline.sites ({known})")
    elif sites:
        chosen = sites[0]
    if chosen is not None and chosen.oar_api_url:
        return OarRest(chosen.oar_api_url, timeout_s=timeout)
    return OarCommands(chosen.oar_bin_dir if chosen else "", timeout_s=timeout)


def make_adapter(config: Any) -> OarAdapter:
    return OarAdapter(make_client(config))
