"""Every operation the node service offers: the modules' OPERATIONS merged, plus `hello`.

Why one registry built at start: the server validates a request against the one spec its `op`
names, so the set of names must be fixed, and a name two modules both claim is an error when
the service starts, not a coin toss at the first request.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from provisioning.node_service.grant import Grant, JobAuthority
from provisioning.node_service.protocol import OP_RE, OperationSpec

MODULES = (
    "provisioning.node_service.network_ops",
    "provisioning.node_service.nfs_ops",
    "provisioning.node_service.usage_ops",
)
"""The operations modules (protocol.py's docstring says what each exposes)."""


def hello(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
    """What the service knows of the caller's job on this node: for pilots that size their VMs
    from the RMS's word, and for tests that the checks before every operation hold."""
    return {
        "rms": grant.rms,
        "job": grant.job,
        "uid": grant.uid,
        "gid": grant.gid,
        "user": grant.user,
        "node": grant.node,
        "nodes": list(grant.nodes),
        "cpus": grant.cpus,
        "memory_mib": grant.memory_mib,
    }


OWN: dict[str, OperationSpec] = {"hello": OperationSpec(hello, {})}


def registry(modules: tuple[str, ...] = MODULES) -> dict[str, OperationSpec]:
    """`hello` and every module's OPERATIONS (a module not written yet is skipped; one that
    fails to import, or names an operation twice, stops the service at start)."""
    merged: dict[str, OperationSpec] = dict(OWN)
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        operations = getattr(module, "OPERATIONS", None)
        if not isinstance(operations, Mapping):
            raise TypeError(f"{name}: no OPERATIONS mapping")
        for op, spec in operations.items():
            if not isinstance(spec, OperationSpec):
                raise TypeError(f"{name}: OPERATIONS[{op!r}] is not an OperationSpec")
            if not isinstance(op, str) or len(op) > 32 or not OP_RE.fullmatch(op):
                raise ValueError(f"{name}: operation name {op!r} is not a plain dotted lower-case name")
            if op in merged:
                raise ValueError(f"{name}: operation {op!r} is already defined")
            merged[op] = spec
    return merged


Sweep = Callable[[JobAuthority], list[str]]
"""A module's clean-up of what ended jobs left on the node (their networks, NFS gateways):
asked of the RMS, run at start and now and then, off the accept loop."""


def sweepers(modules: tuple[str, ...] = MODULES) -> list[tuple[str, Sweep]]:
    """(module, sweep) of every operations module that has a `SWEEP` or `sweep`: the pilot's
    own `*.down` may come too late (a requeued job is no longer running when its pilot asks),
    so what a job made on a node is reaped by the service itself once the RMS says it ended."""
    found: list[tuple[str, Sweep]] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        sweep = getattr(module, "SWEEP", None) or getattr(module, "sweep", None)
        if callable(sweep):
            found.append((name.rsplit(".", 1)[-1], sweep))
    return found
