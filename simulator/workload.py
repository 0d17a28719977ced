"""A workload as parallel NumPy arrays: one row per job, in submission order.

Why arrays and not Job objects: a 100,000-job replay touches every job several times per
simulated hour; arrays keep the readers, the generator and the engine fast and let
`trace info` summarise a whole trace in a few vectorised lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# SWF status codes (field 11): 1 completed, 0 failed, 5 cancelled; 2/3/4 mark the partial
# records of a checkpointed job, whose whole-job line carries the total.
STATUS_FAILED = 0
STATUS_COMPLETED = 1
STATUS_PARTIAL = (2, 3, 4)
STATUS_CANCELLED = 5


@dataclass
class Workload:
    """Jobs of a trace; times in seconds from the trace's first submission (or as recorded).

    `walltime` is the user's estimate (the requested time when the trace has it, else the
    runtime itself); `memory_mb` is per node (-1 unknown); `user` is an integer id (-1
    unknown); `queue` is the queue number or -1; `os` the index of the OS image a job asks
    for (-1 none yet); `interactive` marks jobs of the interactive class.
    """

    job_id: np.ndarray
    submit: np.ndarray
    runtime: np.ndarray
    nodes: np.ndarray
    walltime: np.ndarray
    user: np.ndarray
    queue: np.ndarray
    status: np.ndarray
    memory_mb: np.ndarray
    os: np.ndarray
    interactive: np.ndarray
    header: dict[str, str] = field(default_factory=dict)
    source: str = ""
    skipped: dict[str, int] = field(default_factory=dict)
    """Records not turned into jobs, by reason (malformed, partial, not run, ...)."""
    properties: list[str] | None = None
    """Per-job free text from the trace (e.g. wagap's PBS resource request), or None."""
    account: np.ndarray | None = None
    """Per-job integer account (SWF's group id; -1 unknown), or None when the trace has none:
    what `[priority] account_targets` names, in decimal."""

    def __len__(self) -> int:
        return int(self.job_id.shape[0])

    @classmethod
    def from_columns(cls, cols: dict[str, list[float] | np.ndarray], **kwargs: object) -> Workload:
        """Build from equally long columns; missing optional columns get their 'unknown' value."""
        n = len(cols["submit"])
        defaults = {
            "job_id": np.arange(1, n + 1),
            "walltime": None,
            "user": np.full(n, -1),
            "queue": np.full(n, -1),
            "status": np.full(n, STATUS_COMPLETED),
            "memory_mb": np.full(n, -1),
            "os": np.full(n, -1),
            "interactive": np.zeros(n, dtype=bool),
        }
        arrays: dict[str, np.ndarray] = {}
        for name in ("job_id", "submit", "runtime", "nodes", "walltime", "user", "queue", "status", "memory_mb", "os"):
            value = cols.get(name, defaults.get(name))
            if value is None:
                value = cols["runtime"]
            dtype = np.float64 if name in ("submit", "runtime", "walltime") else np.int64
            arrays[name] = np.asarray(value, dtype=dtype)
        arrays["interactive"] = np.asarray(cols.get("interactive", defaults["interactive"]), dtype=bool)
        if "account" in cols and "account" not in kwargs:
            kwargs["account"] = np.asarray(cols["account"], dtype=np.int64)
        # An estimate below the actual runtime (common in real logs) would make EASY's
        # reservations lie; use the runtime in that case, as most simulators do.
        arrays["walltime"] = np.where(arrays["walltime"] > 0, arrays["walltime"], arrays["runtime"])
        arrays["walltime"] = np.maximum(arrays["walltime"], arrays["runtime"])
        return cls(**arrays, **kwargs)  # type: ignore[arg-type]

    def sorted_by_submit(self) -> Workload:
        """The same jobs in submission order (stable, so equal times keep file order)."""
        order = np.argsort(self.submit, kind="stable")
        if np.all(order[:-1] < order[1:]):
            return self
        return self.take(order)

    def take(self, index: np.ndarray) -> Workload:
        """A new workload holding the rows `index` (a sort order or a mask)."""
        props = None
        if self.properties is not None:
            idx = np.arange(len(self))[index]
            props = [self.properties[i] for i in idx]
        return Workload(
            **{name: getattr(self, name)[index] for name in ARRAY_FIELDS},
            header=dict(self.header),
            source=self.source,
            skipped=dict(self.skipped),
            properties=props,
            account=None if self.account is None else self.account[index],
        )


ARRAY_FIELDS = (
    "job_id",
    "submit",
    "runtime",
    "nodes",
    "walltime",
    "user",
    "queue",
    "status",
    "memory_mb",
    "os",
    "interactive",
)


def concat(a: Workload, b: Workload) -> Workload:
    """Both workloads' jobs in one, re-sorted by submission time."""
    props = None
    if a.properties is not None or b.properties is not None:
        props = (a.properties or [""] * len(a)) + (b.properties or [""] * len(b))
    account = None
    if a.account is not None or b.account is not None:
        account = np.concatenate([_accounts(a), _accounts(b)])
    merged = Workload(
        **{name: np.concatenate([getattr(a, name), getattr(b, name)]) for name in ARRAY_FIELDS},
        header=dict(a.header),
        source=a.source,
        skipped=dict(a.skipped),
        properties=props,
        account=account,
    )
    return merged.sorted_by_submit()


def _accounts(w: Workload) -> np.ndarray:
    return np.full(len(w), -1, dtype=np.int64) if w.account is None else w.account
