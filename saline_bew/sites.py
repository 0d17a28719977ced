"""The sites of the grid as the manager sees them: an OAR, a resource filter, a repository.

Why capacity is observed, not configured: whether a killed vjob can resume at once depends on
what OAR runs right now. Free cores of a site = its Alive resources not held by a running
job (a best-effort job's cores count as taken: the vjob would only kill another one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plugins.oar as oar
from plugins.oar.client import OarClient
from plugins.oar.parse import HOLDING_STATES, resource_id
from saline_bew.repository import Repository
from vjob.errors import ConfigError


@dataclass
class Site:
    name: str
    client: OarClient
    repository: Repository
    properties: str = ""

    def free_cores(self) -> int:
        """Alive resources of this site that no running job holds."""
        resources = self.client.resources()
        busy = {r for j in self.client.jobs(HOLDING_STATES) for r in j.resources}
        mine = [r for r in resources if _belongs(r, self)]
        return sum(1 for r in mine if r["state"] == "Alive" and resource_id(r) not in busy)


def _belongs(resource: dict[str, Any], site: Site) -> bool:
    """Several sites on one OAR are told apart by the resources' `site` property."""
    if not site.properties:
        return True
    return str(resource.get("site", "")) == site.name


def from_config(config: Any) -> dict[str, Site]:
    sites: dict[str, Site] = {}
    for sc in config.saline.sites:
        if sc.name in sites:
            raise ConfigError(f"saline.sites: site name {sc.name!r} appears twice")
        sites[sc.name] = Site(
            sc.name, oar.make_client(config, sc.name), Repository(sc.name, sc.repository), sc.oar_properties
        )
    if not sites:
        raise ConfigError("saline.sites: no site configured (each needs a name, an OAR and a repository)")
    return sites
