"""Torque accounting log reader: `MM/DD/YYYY HH:MM:SS;TYPE;JOBID;key=value ...` records.

Why from the E (end) records: an E record carries everything a replay needs (qtime, start,
end, node count, requested walltime, user, queue, memory), while Q/S/D records only mark
events of the same job. Q and S records are counted; D (deleted) jobs without an E record
never ran. The reader accepts one file, a directory of daily files, or a .tar.gz of them
(the KU Leuven archive), and is also what the PBS adapter uses to read a site's history.
"""

from __future__ import annotations

import re
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from plugins.pbs import units
from simulator.workload import STATUS_COMPLETED, STATUS_FAILED, Workload
from vjob.errors import InputError

RECORD_TYPES = frozenset("QSEDARCT")
# fullmatch, ASCII digits and a length cap: int() of 5000 digits raises ValueError, and a size
# or duration of more than 18 digits is not a real one.
_INTEGER = re.compile(r"-?[0-9]{1,18}")
MAX_MEMBER_BYTES = 1 << 30
"""A daily accounting file is megabytes; a larger tar member is refused rather than read."""


@dataclass(frozen=True, slots=True)
class Record:
    """One accounting record: when, which type, which job, and its key=value attributes."""

    time: datetime
    type: str
    job_id: str
    attrs: dict[str, str]
    where: str


def parse_records(
    lines: Iterable[str], source: str, *, lenient: bool = False, counts: dict[str, int] | None = None
) -> Iterator[Record]:
    """Parse accounting lines; a malformed one is an InputError naming source, line and field."""
    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            yield _parse_record(line, where)
        except InputError:
            if not lenient:
                raise
            if counts is not None:
                counts["malformed"] = counts.get("malformed", 0) + 1


def _parse_record(line: str, where: str) -> Record:
    parts = line.split(";", 3)
    if len(parts) < 3:
        raise InputError(f"{where}: expected 'date;type;jobid;attributes', got {line[:60]!r}")
    try:
        when = datetime.strptime(parts[0], "%m/%d/%Y %H:%M:%S")
    except ValueError:
        raise InputError(f"{where}: field date = {parts[0]!r}: expected MM/DD/YYYY HH:MM:SS") from None
    kind = parts[1]
    if kind not in RECORD_TYPES:
        raise InputError(f"{where}: field type = {kind!r}: must be one of {', '.join(sorted(RECORD_TYPES))}")
    if not parts[2]:
        raise InputError(f"{where}: field jobid is empty")
    attrs: dict[str, str] = {}
    for token in (parts[3] if len(parts) > 3 else "").split():
        key, sep, value = token.partition("=")
        if sep:
            attrs[key] = value
    return Record(when, kind, parts[2], attrs, where)


def duration_s(text: str, field: str, where: str) -> float:
    """Seconds from Torque's `[[HH:]MM:]SS` or plain seconds (the one PBS reader, plugins.pbs.units)."""
    return units.duration_s(text, where=f"{where}: field {field}")


def memory_mb(text: str, field: str, where: str) -> int:
    """MB from Torque sizes such as `2500mb`, `37014168kb`, `4gb` (plugins.pbs.units)."""
    return max(1, units.size_mb(text, where=f"{where}: field {field}"))


def _int(attrs: dict[str, str], key: str, where: str) -> int:
    """An attribute as an integer of at most 18 digits (epoch seconds, counts)."""
    value = attrs[key]
    if not _INTEGER.fullmatch(value):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise InputError(f"{where}: field {key} = {shown!r}: not an integer of at most 18 digits")
    return int(value)


def read_torque_accounting(path: str | Path, *, lenient: bool = False) -> Workload:
    """All jobs that ended (E records) in a file, a directory or a .tar.gz of daily files.

    Submit time is `qtime` (when the job entered the queue), runtime is `end - start`, the
    node count is `unique_node_count` (else `Resource_List.nodect`), the estimate is
    `Resource_List.walltime`, memory per node comes from `Resource_List.mem` divided by the
    nodes (else `pmem` × processors per node). Times are shifted so the first submission is 0.
    """
    path = Path(path)
    counts: dict[str, int] = {"malformed": 0, "not_run": 0}
    seen: dict[str, int] = {}
    cols: dict[str, list[float]] = {
        k: [] for k in ("job_id", "submit", "runtime", "nodes", "walltime", "user", "queue", "status", "memory_mb")
    }
    users: dict[str, int] = {}
    queues: dict[str, int] = {}
    props: list[str] = []
    for name, lines in _sources(path):
        for rec in parse_records(lines, name, lenient=lenient, counts=counts):
            seen[rec.type] = seen.get(rec.type, 0) + 1
            if rec.type != "E":
                continue
            try:
                row = _job_row(rec)
            except InputError:
                if not lenient:
                    raise
                counts["malformed"] += 1
                continue
            if row is None:
                counts["not_run"] += 1
                continue
            submit, runtime, nodes, wall, mem, status = row
            cols["job_id"].append(len(cols["job_id"]) + 1)
            cols["submit"].append(submit)
            cols["runtime"].append(runtime)
            cols["nodes"].append(nodes)
            cols["walltime"].append(wall)
            cols["user"].append(users.setdefault(rec.attrs.get("user", ""), len(users)))
            cols["queue"].append(queues.setdefault(rec.attrs.get("queue", ""), len(queues)))
            cols["status"].append(status)
            cols["memory_mb"].append(mem)
            props.append(f"{rec.attrs.get('queue', '')} {rec.attrs.get('Resource_List.nodes', '')}".strip())
    if cols["submit"]:
        first = min(cols["submit"])
        cols["submit"] = [s - first for s in cols["submit"]]
    header = {f"Records{k}": str(v) for k, v in sorted(seen.items())}
    header["Queues"] = " ".join(f"{i}={q}" for q, i in queues.items())
    workload = Workload.from_columns(cols, header=header, source=str(path), skipped=counts, properties=props)
    return workload.sorted_by_submit()


def _job_row(rec: Record) -> tuple[float, float, int, float, int, int] | None:
    a = rec.attrs
    for key in ("qtime", "start", "end"):
        if key not in a:
            raise InputError(f"{rec.where}: E record of {rec.job_id} has no {key}=")
    qtime, start, end = _int(a, "qtime", rec.where), _int(a, "start", rec.where), _int(a, "end", rec.where)
    if start <= 0 or end <= start:
        return None
    nodes_key = "unique_node_count" if "unique_node_count" in a else "Resource_List.nodect"
    nodes = _int(a, nodes_key, rec.where) if nodes_key in a else 1
    wall = -1.0
    if "Resource_List.walltime" in a:
        wall = duration_s(a["Resource_List.walltime"], "Resource_List.walltime", rec.where)
    mem = -1
    if "Resource_List.mem" in a:
        mem = max(1, memory_mb(a["Resource_List.mem"], "Resource_List.mem", rec.where) // max(nodes, 1))
    elif "Resource_List.pmem" in a:
        slots = _int(a, "total_execution_slots", rec.where) if "total_execution_slots" in a else nodes
        mem = memory_mb(a["Resource_List.pmem"], "Resource_List.pmem", rec.where) * max(1, slots // max(nodes, 1))
    exit_status = a.get("Exit_status", "0")
    status = STATUS_COMPLETED if exit_status == "0" else STATUS_FAILED
    return float(min(qtime, start)), float(end - start), max(nodes, 1), wall, mem, status


def _sources(path: Path) -> Iterator[tuple[str, Iterable[str]]]:
    """(name, lines) for each accounting file under `path`, in name order."""
    if path.is_dir():
        for child in sorted(p for p in path.rglob("*") if p.is_file()):
            yield str(child), _read_lines(child)
        return
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):
        yield from _tar_members(path)
        return
    yield str(path), _read_lines(path)


def _tar_members(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(archive!member, lines) for each regular file of a tar archive, in name order.

    Why each member is read whole inside the try: a damaged archive fails while a member is
    read (zlib.error, EOFError, tarfile.ReadError), and a lazy stream would raise that later,
    in the caller, as a bare traceback. Links, devices and directories are not followed.
    """
    try:
        with tarfile.open(path) as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
            for member in members:
                name = f"{path}!{member.name!r}" if not member.name.isprintable() else f"{path}!{member.name}"
                if member.size > MAX_MEMBER_BYTES:
                    raise InputError(f"{name}: member of {member.size} bytes, at most {MAX_MEMBER_BYTES}")
                fh = tar.extractfile(member)
                if fh is None:
                    continue
                data = fh.read(MAX_MEMBER_BYTES + 1)
                yield name, data.decode("utf-8", errors="replace").splitlines()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: not a readable tar archive: {exc}") from None


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
