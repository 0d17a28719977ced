"""Standard Workload Format reader (and writer): plain or gzip, with Alea's extended columns.

Why strict by default: a silently misread trace gives a plausible but wrong simulation, which
is worse than none. A malformed line is an InputError naming the file, line and field; with
`lenient=True` it is skipped and counted in `Workload.skipped["malformed"]` instead, logged, and
the first one is named in the header (SKIPPED_HEADER): never lost silently. A damaged gzip
stream is an InputError even then, since nothing after the damage can be read.

The 18 standard fields (Feitelson's SWF v2): 1 job number, 2 submit time, 3 wait time, 4 run
time, 5 allocated processors, 6 average CPU time, 7 used memory (KB per processor), 8 requested
processors, 9 requested time, 10 requested memory, 11 status, 12 user, 13 group, 14 executable,
15 queue, 16 partition, 17 preceding job, 18 think time. `-1` means unknown. Alea's extended
SWF (MetaCentrum traces such as wagap) adds the allocated CPU list in braces, the PBS queue
name and the PBS resource request; the last two are kept as the job's `properties`.
"""

from __future__ import annotations

import gzip
import io
import math
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import numpy as np

from simulator.workload import STATUS_PARTIAL, Workload
from vjob import log
from vjob.errors import InputError

_log = log.get("trace")

MAX_LINE_CHARS = 64 * 1024
"""An SWF line is well under a kilobyte; a longer one is garbage (and would be held in memory)."""
MAX_VALUE = 1e15
"""Above this no SWF field is meaningful (seconds: 30 million years); also keeps int() finite."""
SKIPPED_HEADER = "VjobSkippedFirst"
"""Header key under which a lenient read records where the first skipped line was and why."""

FIELDS = (
    "job_number",
    "submit_time",
    "wait_time",
    "run_time",
    "allocated_processors",
    "average_cpu_time",
    "used_memory",
    "requested_processors",
    "requested_time",
    "requested_memory",
    "status",
    "user_id",
    "group_id",
    "executable",
    "queue",
    "partition",
    "preceding_job",
    "think_time",
)


def open_text(path: Path) -> TextIO:
    """Open a trace as text, decompressing it when it is gzip (by magic number, not name)."""
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot open the trace: {exc.strerror}") from None
    magic = raw.read(2)
    raw.seek(0)
    # surrogateescape: a byte that is not UTF-8 is kept as a lone surrogate, so that it is the
    # error of its own line (skipped under --lenient), not of the whole file.
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", errors="surrogateescape")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape")


def read_swf(path: str | Path, *, lenient: bool = False) -> Workload:
    """Read an SWF trace into a Workload (submission order, times as recorded).

    Jobs whose status marks a partial record (2, 3, 4) are skipped (the job's own line holds
    its totals); jobs that never ran (run time <= 0 or no processors) are skipped too. Both
    are counted in `skipped`, as are malformed lines under `lenient`.
    """
    path = Path(path)
    header: dict[str, str] = {}
    cols: dict[str, list[float]] = {k: [] for k in ("job_id", "submit", "runtime", "nodes", "walltime", "user")}
    cols.update({k: [] for k in ("queue", "status", "memory_mb")})
    props: list[str] = []
    has_props = False
    skipped = {"malformed": 0, "partial": 0, "not_run": 0}
    first_skipped = ""
    lineno = 0
    with open_text(path) as fh:
        try:
            for lineno, line in _numbered(fh):
                try:
                    text = _checked_text(line, path, lineno)
                    if not text:
                        continue
                    if text.startswith(";"):
                        key, sep, value = text[1:].partition(":")
                        if sep and key.strip():
                            header.setdefault(key.strip(), value.strip())
                        continue
                    values, extra = _parse_line(text, path, lineno)
                except InputError as exc:
                    if not lenient:
                        raise
                    skipped["malformed"] += 1
                    first_skipped = first_skipped or str(exc)
                    continue
                status = int(values[10])
                if status in STATUS_PARTIAL:
                    skipped["partial"] += 1
                    continue
                nodes = values[4] if values[4] > 0 else values[7]
                if values[3] <= 0 or nodes <= 0:
                    skipped["not_run"] += 1
                    continue
                cols["job_id"].append(values[0])
                cols["submit"].append(values[1])
                cols["runtime"].append(values[3])
                cols["nodes"].append(nodes)
                cols["walltime"].append(values[8])
                cols["user"].append(values[11])
                cols["queue"].append(values[14])
                cols["status"].append(status)
                mem = values[6] if values[6] > 0 else values[9]
                # SWF memory is KB per processor; the model wants MB per node.
                cols["memory_mb"].append(round(mem / 1024) if mem > 0 else -1)
                if extra:
                    has_props = True
                props.append(" ".join(extra))
        except (OSError, EOFError, zlib.error) as exc:
            # A damaged gzip stream (BadGzipFile is an OSError, a truncated one an EOFError, a
            # corrupt block a zlib.error): nothing after it can be read, so even --lenient stops.
            raise InputError(f"{path}:{lineno + 1}: cannot read the trace beyond line {lineno}: {exc}") from None
    if skipped["malformed"]:
        header[SKIPPED_HEADER] = f"{skipped['malformed']} line(s), the first: {first_skipped}"
        _log.warning("malformed trace lines skipped", source=str(path), count=skipped["malformed"], first=first_skipped)
    workload = Workload.from_columns(
        cols, header=header, source=str(path), skipped=skipped, properties=props if has_props else None
    )
    return workload.sorted_by_submit()


def _numbered(fh: TextIO) -> Iterator[tuple[int, str]]:
    yield from enumerate(fh, start=1)


def _checked_text(line: str, path: Path, lineno: int) -> str:
    """The stripped line, or an InputError if it is too long or holds bytes that are not UTF-8."""
    if len(line) > MAX_LINE_CHARS:
        raise InputError(f"{path}:{lineno}: line of {len(line)} characters, at most {MAX_LINE_CHARS}")
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: an undecodable byte (surrogateescape)
        raise InputError(f"{path}:{lineno}: not text (a byte that is not UTF-8 at column {exc.start + 1})") from None
    return line.strip()


def _parse_line(text: str, path: Path, lineno: int) -> tuple[list[float], list[str]]:
    """The 18 numeric fields of one line (validated) and its extended text columns."""
    tokens = text.split()
    if len(tokens) < len(FIELDS):
        raise InputError(f"{path}:{lineno}: {len(tokens)} fields, an SWF line needs {len(FIELDS)}")
    values: list[float] = []
    for i, token in enumerate(tokens[: len(FIELDS)]):
        try:
            value = float(token)
        except ValueError:
            shown = token if len(token) <= 40 else token[:37] + "..."
            raise InputError(f"{path}:{lineno}: field {i + 1} ({FIELDS[i]}) = {shown!r}: not a number") from None
        if not math.isfinite(value) or value < -1 or value > MAX_VALUE:  # NaN, inf, huge, or < -1
            shown = token if len(token) <= 40 else token[:37] + "..."
            raise InputError(
                f"{path}:{lineno}: field {i + 1} ({FIELDS[i]}) = {shown!r}: must be -1 or between 0 and "
                f"{MAX_VALUE:.0e} (--lenient skips the line)"
            )
        values.append(value)
    if values[1] < 0:
        raise InputError(f"{path}:{lineno}: field 2 (submit_time) = {tokens[1]!r}: a job needs a submit time")
    # Alea's extension: "{cpu,cpu,...}" then the queue name and the resource request.
    extra = [t for t in tokens[len(FIELDS) :] if not t.startswith("{")]
    return values, extra


def write_swf(workload: Workload, out: TextIO, *, header: dict[str, str] | None = None) -> None:
    """Write `workload` as SWF v2 (unknown fields as -1), header comments first."""
    for key, value in (header or workload.header).items():
        out.write(f"; {key}: {value}\n")
    for i in range(len(workload)):
        mem = workload.memory_mb[i]
        mem_kb = int(mem) * 1024 if mem > 0 else -1
        wall = round(workload.walltime[i]) if workload.walltime[i] != workload.runtime[i] else -1
        out.write(
            f"{int(workload.job_id[i])} {round(workload.submit[i])} -1 {round(workload.runtime[i])} "
            f"{int(workload.nodes[i])} -1 {mem_kb} {int(workload.nodes[i])} {wall} -1 "
            f"{int(workload.status[i])} {int(workload.user[i])} -1 -1 {int(workload.queue[i])} -1 -1 -1\n"
        )


def summarise(workload: Workload, nodes: int | None = None) -> dict[str, object]:
    """What `vjob trace info` prints: counts, span, size and runtime quantiles, offered load."""
    n = len(workload)
    if n == 0:
        return {"source": workload.source, "jobs": 0, "skipped": workload.skipped}
    span = float(workload.submit.max() - workload.submit.min())
    machine = nodes or _header_int(workload.header, "MaxNodes") or _header_int(workload.header, "MaxProcs")
    work = float(np.sum(workload.runtime * workload.nodes))
    q = [0.5, 0.9, 0.99]
    info: dict[str, object] = {
        "source": workload.source,
        "jobs": n,
        "skipped": workload.skipped,
        "span_s": span,
        "span_days": span / 86400.0,
        "machine_nodes": machine,
        "nodes": {"min": int(workload.nodes.min()), "max": int(workload.nodes.max())}
        | {f"p{int(p * 100)}": float(np.quantile(workload.nodes, p)) for p in q},
        "serial_share": float(np.mean(workload.nodes == 1)),
        "runtime_s": {"mean": float(workload.runtime.mean()), "max": float(workload.runtime.max())}
        | {f"p{int(p * 100)}": float(np.quantile(workload.runtime, p)) for p in q},
        "node_seconds": work,
        "interactive": int(workload.interactive.sum()),
        "users": int(np.unique(workload.user[workload.user >= 0]).size),
    }
    if machine and span > 0:
        info["offered_load"] = work / (machine * span)
    return info


def _header_int(header: dict[str, str], key: str) -> int | None:
    try:
        return int(header[key].split()[0])
    except (KeyError, ValueError, IndexError):
        return None
