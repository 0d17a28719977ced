"""Slurm's job and node states reduced to vjob's, plus the small value parsers both layouts need.

Why one table: squeue --json, scontrol text and JSON-lines all spell the same Slurm states;
mapping them in one place keeps the JSON and text paths agreeing on what `held` means.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vjob.errors import InputError
from vjob.model import JobState, NodeState

_JOB_STATES = {
    "PENDING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.HELD,
    "REQUEUE_HOLD": JobState.HELD,
    "SPECIAL_EXIT": JobState.HELD,
    "RUNNING": JobState.RUNNING,
    "CONFIGURING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SUSPENDED": JobState.SUSPENDED,
    "STOPPED": JobState.SUSPENDED,
    "COMPLETED": JobState.COMPLETED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
}

# Reasons Slurm gives a pending job that will not start until someone releases it.
_HELD_REASONS = ("JobHeldAdmin", "JobHeldUser", "job requeued in held state", "launch_failed_requeued_held")


def job_state(state: str, reason: str = "", *, where: str) -> JobState:
    """vjob's JobState for a Slurm state word (first word of e.g. 'CANCELLED by 0')."""
    word = (state or "").strip().split(" ")[0].split("+")[0].upper()
    try:
        mapped = _JOB_STATES[word]
    except KeyError:
        raise InputError(f"{where}: job state {state[:40]!r} is not a Slurm job state vjob knows") from None
    if mapped is JobState.PENDING and any(r in (reason or "") for r in _HELD_REASONS):
        return JobState.HELD
    return mapped


def node_state(state: str, flags: tuple[str, ...] = (), *, where: str) -> NodeState:
    """vjob's NodeState for a Slurm node state ('IDLE+DRAIN', 'down*', 'mixed', ...)."""
    words = [w for w in re.split(r"[+ ]", (state or "").strip().upper()) if w]
    words += [f.strip().upper() for f in flags]
    if not words:
        raise InputError(f"{where}: empty node state")
    base = words[0].rstrip("*~#!%$@^-")
    extra = {w.rstrip("*~#!%$@^-") for w in words[1:]}
    if "DRAIN" in extra or "DRAINED" in extra or "DRAINING" in extra or base in ("DRAIN", "DRAINED", "DRAINING"):
        return NodeState.DRAINED
    if base in ("DOWN", "FAIL", "FAILING", "FUTURE", "UNKNOWN", "POWERED_DOWN", "POWER_DOWN", "INVAL") or (
        "NOT_RESPONDING" in extra or words[0].endswith("*")
    ):
        return NodeState.DOWN
    if base in ("IDLE", "PLANNED", "RESERVED"):
        return NodeState.IDLE
    if base in ("ALLOCATED", "ALLOC", "COMPLETING", "COMP"):
        return NodeState.ALLOCATED
    if base in ("MIXED", "MIX"):
        return NodeState.MIXED
    raise InputError(f"{where}: node state {state[:40]!r} is not a Slurm node state vjob knows")


_SIZE = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,6})?)([KMGTP]?)B?", re.IGNORECASE)
_FACTOR_MB = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}


def size_mb(text: str, *, where: str) -> int:
    """Megabytes of a Slurm size ('4000M', '62.50G', '2000' = MB)."""
    match = _SIZE.fullmatch((text or "").strip())
    if not match:
        raise InputError(f"{where}: size {text[:40]!r} is not a Slurm size like 4000M or 62.5G")
    return round(float(match.group(1)) * _FACTOR_MB[match.group(2).upper()])


def tres_memory_mb(tres: str, *, where: str) -> int | None:
    """The mem= entry of a TRES string (cpu=8,mem=4000M,node=3), in MB, or None."""
    for part in (tres or "").split(","):
        key, _, value = part.partition("=")
        if key.strip() == "mem" and value:
            return size_mb(value, where=where)
    return None


_DURATION = re.compile(r"(?:([0-9]{1,9})-)?(?:([0-9]{1,9}):)?([0-9]{1,12})(?::([0-9]{1,9}))?")


def duration_s(text: str, *, where: str) -> float | None:
    """Seconds of a Slurm time limit ('1-00:00:00', '05:46:31', '30' minutes); None = unlimited."""
    value = (text or "").strip()
    if value.upper() in ("", "UNLIMITED", "INFINITE", "NONE", "N/A", "PARTITION_LIMIT", "NOT_SET"):
        return None
    match = _DURATION.fullmatch(value)
    if not match:
        raise InputError(f"{where}: time {text[:40]!r} is not a Slurm duration like 1-00:00:00")
    days, a, b, c = match.groups()
    if a is None and c is None:  # plain minutes, or D-HH
        total = int(b) * 60 if days is None else int(b) * 3600
    elif c is None:  # MM:SS (or D-HH with a day part)
        total = int(a) * 60 + int(b) if days is None else int(a) * 3600 + int(b) * 60
    else:
        total = int(a) * 3600 + int(b) * 60 + int(c)
    return float(total + int(days or 0) * 86400)


@dataclass(frozen=True, slots=True)
class Partition:
    """A Slurm partition as `scontrol show partition` describes it."""

    name: str
    nodes: tuple[str, ...] = ()
    total_nodes: int = 0
    total_cpus: int = 0
    state: str = "UP"
    default: bool = False
    priority_tier: int = 1
    max_time_s: float | None = None
    preempt_mode: str = "OFF"
