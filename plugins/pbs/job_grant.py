"""PBS's word on a job for the node service (provisioning.node_service.grant.JobAuthority), for
Torque and OpenPBS / PBS Pro, from the server's own record of that one job.

What is read, and why from there:
- the record: `qstat -f -F json JOB` on OpenPBS (`-x` added for `owned`, so a finished job still
  in the server's history is found), `qstat -x JOB` (XML) or `qstat -f JOB` (text) on Torque,
  as `[pbs] torque_format` says; the records are the adapter's (plugins.pbs.records), never
  read a second way;
- the state: only `R` grants. `E` (exiting), `S`/`U` (suspended), `Q`/`H`/`W`/`T`, `B` (an
  array parent) and finished states do not; `owned` takes any state the server still lists;
- the owner: `euser`, the account PBS runs the job (and so its pilot) as, when the server
  prints it, else the name part of `Job_Owner` (`user@submithost`); it must be a login on this
  node (pwd), since the uid SO_PEERCRED reports is compared with that login's;
- the node and its share: the node must be a host of `exec_host` (`host/0*2+host2/0*2` on
  OpenPBS, `host/0+host/1` or `host/0-3,5` on Torque); its CPUs are the `ncpus` of the job's
  `exec_vnode` chunks on it where the server prints one (OpenPBS), else the slots of its
  `exec_host` entries. `exec_vnode`'s chunks and `exec_host`'s entries are one-to-one and in the
  same order, so a chunk's vnodes (`host[0]`, or names unlike the host) belong to the host of
  its entry; a record where they differ in number is refused;
- the memory there: the `mem` of those chunks, else the smaller of the job's
  `Resource_List.pmem` times its CPUs there (Torque: per process) and `Resource_List.mem`
  shared over the job's CPUs in proportion, whichever are given, else 0 (unknown, as the OAR
  authority says).

Every field is the job's data (a job's name, variables and resource list are its user's):
each is checked for type, syntax and size before use, and a record that fails is an
InputError naming the job and field, which the service sends back. `qstat -f` text cannot tell
a value holding a newline from the next attribute (plugins/pbs/records.py prints such a line as
an attribute), so in that form a block naming one of the attributes read here twice is refused,
and `exec_vnode` (which Torque never prints) is ignored; the XML and JSON forms have no such gap
(docs/security.md, "The node service").
"""

from __future__ import annotations

import pwd
import re

from plugins.pbs import names, records
from plugins.pbs.adapter import PbsAdapter, check_job_id
from plugins.pbs.convert import _int, exec_hosts
from plugins.pbs.records import Record
from plugins.pbs.units import size_mb
from provisioning.node_service.grant import Grant
from vjob.errors import CommandError, InputError

MAX_FIELD_CHARS = 1 << 20
"""exec_host / exec_vnode longer than this is not a real allocation (20000 single slots ~ 250 KB)."""
MAX_CPUS = 1 << 20
"""More CPUs on one node than any node has: garbage, not an allocation."""
GONE = ("Unknown Job Id", "Job has finished")
"""What qstat prints for a job id the server does not list (or lists only in its history)."""
READ = ("job_state", "Job_Owner", "euser", "exec_host", "exec_vnode", "Resource_List.mem", "Resource_List.pmem")
"""The attributes a grant is made of: in `qstat -f` text each must appear at most once."""

_SLOTS = r"[0-9]{1,6}(?:-[0-9]{1,6})?(?:,[0-9]{1,6}(?:-[0-9]{1,6})?)*"
_ENTRY = re.compile(rf"([^/+\s]{{1,254}})/(?:([0-9]{{1,6}})\*([0-9]{{1,7}})|({_SLOTS}))")
"""One exec_host entry: `host/N*C` (OpenPBS, C CPUs) or `host/0`, `host/0-3,5` (Torque slots)."""
_CHUNK = re.compile(r"\(([^()]{1,65536})\)")
_PIECE = re.compile(r"([^:+()\s]{1,254})((?::[A-Za-z_][A-Za-z0-9_]{0,63}=[^:+()\s]{1,64})*)")
"""One vnode of an exec_vnode chunk: `name:ncpus=2:mem=4194304kb`."""


class PbsJobAuthority:
    """JobAuthority over the PBS client commands (run as root, as an operator would)."""

    rms = "pbs"

    def __init__(self, adapter: PbsAdapter) -> None:
        self.adapter = adapter

    def grant(self, job: str, node: str) -> Grant | None:
        record = self._record(job, history=False)
        return None if record is None else grant_of(record, job, node)

    def owned(self, job: str, node: str) -> Grant | None:
        record = self._record(job, history=True)
        return None if record is None else grant_of(record, job, node, running=False)

    def command(self, job: str, *, history: bool) -> list[str]:
        """The qstat argument list for one job in the adapter's dialect and format."""
        config = self.adapter.config
        if config.dialect == "openpbs":
            return ["qstat", *(["-x"] if history else []), "-f", "-F", "json", job]
        return ["qstat", "-x", job] if config.torque_format == "xml" else ["qstat", "-f", job]

    def _record(self, job: str, *, history: bool) -> Record | None:
        """The server's record of `job`, or None when it lists no such job."""
        check_job_id(job)
        args = self.command(job, history=history)
        try:
            text = self.adapter._run(args, job=job)
        except CommandError as exc:
            if any(word in str(exc) for word in GONE):
                return None
            raise
        found = [r for r in job_records(text, source=" ".join(args)) if same_job(str(r.get("Job_Id", "")), job)]
        if len(found) > 1:
            raise InputError(f"{' '.join(args)}: {len(found)} records of job {job}")
        return found[0] if found else None


def job_records(text: str, *, source: str) -> list[Record]:
    """The flat records of a qstat output in any of the three forms (plugins.pbs.records)."""
    fmt = records.detect(text)
    if fmt in ("empty", "torque-xml-empty"):
        return []
    if fmt == "torque-xml-jobs":
        return records.torque_xml(text, source=source, element="Job")
    if fmt == "openpbs-json":
        kind, found = records.openpbs_json(text, source=source)
        if kind != "jobs":
            raise InputError(f"{source}: node output, not the job's record")
        return found
    if fmt == "pbs-text-jobs":
        found = records.pbs_text_jobs(text, source=source)
        _no_repeats(text, source)
        for record in found:
            record.pop("exec_vnode", None)  # Torque prints none: one here came out of a value
        return found
    raise InputError(f"{source}: not the output of qstat -x, -f or -f -F json: {text[:60]!r}")


def _no_repeats(text: str, source: str) -> None:
    """Refuse a `qstat -f` block naming an attribute of READ twice (module docstring)."""
    for block in re.split(r"\n(?=Job Id:)", text):
        for key in READ:
            count = len(re.findall(rf"^[ \t]+{re.escape(key)} = ", block, flags=re.MULTILINE))
            if count > 1:
                head = block.split("\n", 1)[0][:80]
                raise InputError(f"{source}: {head}: attribute {key} given {count} times (a value with a newline?)")


def same_job(listed: str, asked: str) -> bool:
    """Whether the server's id is the one asked: equal, or one the other with the server's name
    (`123` and `123.server`, `123.pbs` and `123.pbs.example.org`)."""
    return listed == asked or listed.startswith(asked + ".") or asked.startswith(listed + ".")


def grant_of(record: Record, job: str, node: str, *, running: bool = True) -> Grant | None:
    """The grant of `job` on `node` from its record: None when it is not `R` on `node` (with
    `running=False`, JobAuthority.owned: the job in any state, no CPUs or memory unless it runs
    there); InputError when a field the grant is made of is malformed or the owner unknown."""
    where = f"PBS job {job}"
    state = record.get("job_state")
    if not isinstance(state, str) or not re.fullmatch(r"[A-Z]", state.strip()):
        raise InputError(f"{where}: job_state = {str(state)[:20]!r}: not a PBS state letter")
    shares = node_shares(record, where) if record.get("exec_host") else {}
    runs_here = state.strip() == "R" and node in shares
    if running and not runs_here:
        return None
    login = owner(record, where)
    try:
        entry = pwd.getpwnam(login)
    except KeyError:
        raise InputError(f"{where}: its owner {login!r} is not a user of this node") from None
    cpus, memory = shares[node] if runs_here else (0, 0)
    return Grant("pbs", job, entry.pw_uid, entry.pw_gid, login, node, tuple(shares), cpus, memory)


def owner(record: Record, where: str) -> str:
    """The login the job runs as: `euser`, else the name part of `Job_Owner`, checked."""
    value = record.get("euser") or record.get("Job_Owner")
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: neither euser nor Job_Owner")
    return names.user(value.strip().split("@", 1)[0], field=f"{where}: owner")


def node_shares(record: Record, where: str) -> dict[str, tuple[int, int]]:
    """Host → (CPUs, memory MiB) of the job there, in exec_host order (module docstring)."""
    hosts_text = _text(record, "exec_host", where)
    entries = _exec_host_entries(hosts_text, where)
    cpus: dict[str, int] = {}
    memory: dict[str, int] = {}
    vnodes = record.get("exec_vnode")
    if vnodes:
        chunks = _exec_vnode_chunks(_text(record, "exec_vnode", where), where)
        if len(chunks) != len(entries):
            raise InputError(
                f"{where}: exec_vnode has {len(chunks)} chunks, exec_host {len(entries)} entries: "
                "cannot tell which host a chunk is on"
            )
        for (host, _), (chunk_cpus, chunk_mem) in zip(entries, chunks, strict=True):
            cpus[host] = cpus.get(host, 0) + chunk_cpus
            if chunk_mem is not None:
                memory[host] = memory.get(host, 0) + chunk_mem
    else:
        for host, slots in entries:
            cpus[host] = cpus.get(host, 0) + slots
    for host, count in cpus.items():
        if not 0 < count <= MAX_CPUS:
            raise InputError(f"{where}: {count} CPUs on host {host}: expected 1..{MAX_CPUS}")
    total = sum(cpus.values())
    pmem = _size(record, "Resource_List.pmem", where)
    mem = _size(record, "Resource_List.mem", where)
    out = {}
    for host, count in cpus.items():
        # Both limits bind the job where both are given (Torque: mem job-wide, pmem per process).
        limits = [pmem * count] if pmem else []
        limits += [mem * count // total] if mem else []
        out[host] = (count, memory[host] if host in memory else min(limits, default=0))
    return out


def _text(record: Record, key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
        shown = f"{type(value).__name__} of {len(value)} characters" if isinstance(value, str) else repr(value)[:40]
        raise InputError(f"{where}: {key} is {shown}: expected text of at most {MAX_FIELD_CHARS} characters")
    return value.strip()


def _size(record: Record, key: str, where: str) -> int:
    value = record.get(key)
    if value is None or value == "":
        return 0
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    return size_mb(text, where=f"{where}: {key}")


def _exec_host_entries(text: str, where: str) -> list[tuple[str, int]]:
    """(host, CPUs) of every `+`-separated exec_host entry; the whole string must be entries."""
    entries = []
    for part in text.split("+"):
        match = _ENTRY.fullmatch(part)
        if match is None:
            raise InputError(f"{where}: exec_host entry {part[:60]!r}: not host/N, host/N*C or host/0-3,5")
        host, _, count, slots = match.groups()
        names.node(host, field=f"{where}: exec_host host")
        entries.append((host, _int(count, where=f"{where}: exec_host CPUs") if count else _slot_count(slots, where)))
    if tuple(dict.fromkeys(h for h, _ in entries)) != exec_hosts(text, where=f"{where}: exec_host"):
        raise InputError(f"{where}: exec_host {text[:60]!r}: hosts not read the way the adapter reads them")
    return entries


def _slot_count(slots: str, where: str) -> int:
    count = 0
    for item in slots.split(","):
        low, _, high = item.partition("-")
        first, last = int(low), int(high or low)
        if last < first:
            raise InputError(f"{where}: exec_host slot range {item!r} runs backwards")
        count += last - first + 1
    return count


def _exec_vnode_chunks(text: str, where: str) -> list[tuple[int, int | None]]:
    """(ncpus, mem MiB or None) of every `+`-separated `(vnode:ncpus=N:mem=S+...)` chunk."""
    chunks: list[tuple[int, int | None]] = []
    rest = text
    while rest:
        match = _CHUNK.match(rest)
        if match is None:
            raise InputError(f"{where}: exec_vnode {rest[:60]!r}: not (vnode:ncpus=N:mem=S)+...")
        rest = rest[match.end() :]
        if rest and not rest.startswith("+("):
            raise InputError(f"{where}: exec_vnode {rest[:60]!r}: chunks must be joined by '+'")
        rest = rest[1:]
        chunks.append(_chunk(match.group(1), where))
    if not chunks:
        raise InputError(f"{where}: exec_vnode is empty")
    return chunks


def _chunk(text: str, where: str) -> tuple[int, int | None]:
    cpus, memory = 0, None
    for piece in text.split("+"):
        match = _PIECE.fullmatch(piece)
        if match is None:
            raise InputError(f"{where}: exec_vnode piece {piece[:60]!r}: not vnode:ncpus=N:mem=S")
        for item in match.group(2).split(":")[1:]:
            key, _, value = item.partition("=")
            if key == "ncpus":
                if not re.fullmatch(r"[0-9]{1,7}", value):
                    raise InputError(f"{where}: exec_vnode ncpus = {value[:20]!r}: not a count of CPUs")
                cpus += int(value)
            elif key == "mem":
                memory = (memory or 0) + size_mb(value, where=f"{where}: exec_vnode mem")
    return cpus, memory
