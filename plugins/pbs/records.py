"""Turn the raw outputs of Torque, OpenPBS and Moab commands into flat attribute records.

Why a flat record (`{"Resource_List.mem": "4gb", ...}`) in between: Torque's XML nests
resources, its text form writes them dotted and wraps long values over tab-indented lines,
and OpenPBS's JSON nests them again. Reducing all of them to the dotted names the PBS manuals
use lets one converter (plugins.pbs.convert) turn any dialect into the vjob model, and lets a
parse error name the record and attribute whatever the format was.

Every function raises InputError naming `source` and the record when the text is not what
the command prints.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any

from plugins.pbs.units import size_mb
from vjob.errors import InputError

Record = dict[str, Any]
"""Dotted attribute name → value (str, int, or for Variable_List a dict of str)."""


def detect(text: str) -> str:
    """Name the format of a recorded output, so `vjob rms parse` needs no --format flag."""
    head = text.lstrip()[:4096]
    if head.startswith("<"):
        if re.match(r"<\?xml[^>]*>\s*<Data>\s*<Job>|<Data>\s*<Job>", head):
            return "torque-xml-jobs"
        if re.match(r"(<\?xml[^>]*>\s*)?<Data>\s*<Node>", head):
            return "torque-xml-nodes"
        if re.match(r"(<\?xml[^>]*>\s*)?<Data>\s*<node\s", head):
            return "moab-xml-nodes"
        if re.match(r"(<\?xml[^>]*>\s*)?<Data>\s*</Data>", head):
            return "torque-xml-empty"
        return "unknown"
    if head.startswith("{"):
        return "openpbs-json"
    if head.startswith("Job Id:"):
        return "pbs-text-jobs"
    if re.match(r"(active|eligible|blocked) jobs-+", head):
        return "moab-showq"
    if re.match(r"node \S+\s*\n\s*\n?State:", head):
        return "moab-checknode"
    if re.match(r"[^\s=]+\s*\n[ \t]+\S+ = ", head):
        return "pbs-text-nodes"
    if not head:
        return "empty"
    return "unknown"


# -- Torque XML (qstat -x, pbsnodes -x) -------------------------------------------------------


def torque_xml(text: str, *, source: str, element: str) -> list[Record]:
    """Records of the <Job> or <Node> elements of Torque's XML output."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise InputError(f"{source}: not valid Torque XML: {exc}") from None
    if root.tag != "Data":
        raise InputError(f"{source}: expected <Data> at the top of Torque XML, found <{root.tag}>")
    records = []
    for index, item in enumerate(root):
        if item.tag != element:
            raise InputError(f"{source}: element {index + 1} is <{item.tag}>, expected <{element}>")
        record: Record = {}
        for child in item:
            if len(child):
                for grandchild in child:
                    record[f"{child.tag}.{grandchild.tag}"] = (grandchild.text or "").strip()
            else:
                record[child.tag] = (child.text or "").strip()
        if "Variable_List" in record:
            record["Variable_List"] = variable_list(record["Variable_List"])
        records.append(record)
    return records


# -- the text forms (qstat -f, pbsnodes -a) shared by Torque and OpenPBS ---------------------------

_KEY = re.compile(r"[A-Za-z_][\w.]*")


def _attribute_lines(lines: list[str], *, source: str, first_line: int, header: str) -> Record:
    """Attributes of one block; a tab-indented line continues the previous value verbatim."""
    record: Record = {}
    last: str | None = None
    for offset, line in enumerate(lines):
        if not line or line.isspace():
            continue
        if line[0] == "\t" or not line[0].isspace():
            # qstat wraps long values onto tab-indented lines, and prints a newline inside a
            # value (a Moab comment) as is, so the rest starts at column 0.
            if last is None:
                raise InputError(f"{source}:{first_line + offset}: continuation line before any attribute of {header}")
            record[last] += line[1:] if line[0] == "\t" else "\n" + line
            continue
        key, sep, value = line.strip().partition(" =")
        if not sep or not _KEY.fullmatch(key) or (value and value[0] != " "):
            raise InputError(f"{source}:{first_line + offset}: cannot read attribute line of {header}: {line[:80]!r}")
        last = key
        record[key] = value[1:].rstrip()
    return record


def pbs_text_jobs(text: str, *, source: str) -> list[Record]:
    """Records of `qstat -f` (Torque and OpenPBS print the same layout)."""
    records: list[Record] = []
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Job Id:")]
    if not starts and text.strip():
        raise InputError(f"{source}: no 'Job Id:' line: not the output of qstat -f")
    if starts and any(line.strip() for line in lines[: starts[0]]):
        raise InputError(f"{source}:1: text before the first 'Job Id:' line")
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        job_id = lines[start].split(":", 1)[1].strip()
        if not job_id:
            raise InputError(f"{source}:{start + 1}: 'Job Id:' without an id")
        record = _attribute_lines(lines[start + 1 : end], source=source, first_line=start + 2, header=f"job {job_id}")
        record["Job_Id"] = job_id
        if "Variable_List" in record:
            record["Variable_List"] = variable_list(record["Variable_List"])
        records.append(record)
    return records


def pbs_text_nodes(text: str, *, source: str) -> list[Record]:
    """Records of `pbsnodes -a`: a name at column 0, then indented `key = value` lines."""
    records: list[Record] = []
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() and not line[0].isspace()]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        name = lines[start].strip()
        if " " in name or "=" in name:
            raise InputError(f"{source}:{start + 1}: expected a node name, found {name[:80]!r}")
        record = _attribute_lines(lines[start + 1 : end], source=source, first_line=start + 2, header=f"node {name}")
        record["name"] = name
        records.append(record)
    return records


# -- OpenPBS / PBS Pro JSON (qstat -f -F json, pbsnodes -av -F json) --------------------------------


MAX_JSON_DEPTH = 4
"""OpenPBS nests at most `Resource_List.<name>`; deeper objects are not its output."""


def _flatten(prefix: str, value: dict[str, Any], out: Record, *, where: str, depth: int = 1) -> None:
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, dict) and name != "Variable_List":
            if depth >= MAX_JSON_DEPTH:
                raise InputError(f"{where}: attribute {name[:80]!r} nested deeper than {MAX_JSON_DEPTH} levels")
            _flatten(name, item, out, where=where, depth=depth + 1)
        else:
            out[name] = item


def openpbs_json(text: str, *, source: str) -> tuple[str, list[Record]]:
    """("jobs" or "nodes", records) of an OpenPBS JSON document."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, a 5000-digit number, [[[[...
        raise InputError(f"{source}: not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a JSON object at the top level")
    if "Jobs" in data or ("nodes" not in data and "pbs_version" in data):
        kind, key, id_field = "jobs", "Jobs", "Job_Id"
    elif "nodes" in data:
        kind, key, id_field = "nodes", "nodes", "name"
    else:
        raise InputError(f"{source}: neither 'Jobs' nor 'nodes' in the JSON: not OpenPBS -F json output")
    entries = data.get(key) or {}
    if not isinstance(entries, dict):
        raise InputError(f"{source}: '{key}' is {type(entries).__name__}, expected an object")
    records = []
    for ident, attrs in entries.items():
        if not isinstance(attrs, dict):
            raise InputError(f"{source}: {key}[{ident!r}] is {type(attrs).__name__}, expected an object")
        record: Record = {}
        where = f"{source}: {key}[{str(ident)[:80]!r}]"
        _flatten("", attrs, record, where=where)
        variables = record.get("Variable_List")
        if isinstance(variables, dict):
            record["Variable_List"] = {str(k): str(v) for k, v in variables.items()}
        elif isinstance(variables, str):
            record["Variable_List"] = variable_list(variables)
        elif variables is not None:
            raise InputError(f"{where}: Variable_List is {type(variables).__name__}, expected an object or a string")
        record[id_field] = ident
        records.append(record)
    return kind, records


def variable_list(text: str) -> dict[str, str]:
    """KEY=VALUE pairs separated by commas; a backslash-escaped comma belongs to the value."""
    out: dict[str, str] = {}
    for item in re.split(r"(?<!\\),", text):
        if not item:
            continue
        key, _, value = item.partition("=")
        out[key.strip()] = value.replace("\\,", ",")
    return out


# -- Moab (showq, checknode) --------------------------------------------------------------------

_SHOWQ_SECTION = re.compile(r"(active|eligible|blocked) jobs-+\s*")
_SHOWQ_ROW = re.compile(
    r"(?P<id>\S+)\s+(?P<user>\S+)\s+(?P<state>[A-Za-z]+)\s+(?P<procs>[0-9]+)\s+(?P<time>-?[0-9:]+)\s+(?P<when>.+?)\s*"
)


def moab_showq(text: str, *, source: str) -> list[Record]:
    """One record per job row of `showq`, with the section it was listed in."""
    records: list[Record] = []
    section: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        heading = _SHOWQ_SECTION.fullmatch(stripped)
        if heading:
            section = heading.group(1)
            continue
        if not stripped or stripped.startswith("JOBID") or re.match(r"[0-9]+ (active|eligible|blocked) jobs", stripped):
            continue
        if stripped.startswith("Total jobs:") or re.match(r"[0-9]+ of [0-9]+ (processors|nodes)", stripped):
            continue
        if section is None:
            raise InputError(f"{source}:{number}: job row before any 'active/eligible/blocked jobs' heading")
        row = _SHOWQ_ROW.fullmatch(stripped)
        if not row:
            raise InputError(f"{source}:{number}: cannot read showq row: {stripped[:80]!r}")
        records.append({"section": section, "line": number, **row.groupdict()})
    return records


def moab_checknode_text(text: str, *, source: str) -> list[Record]:
    """One record per `node NAME` block of `checknode` text output."""
    records: list[Record] = []
    current: Record | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        head = re.fullmatch(r"node (\S+)\s*", line)
        if head:
            current = {"NODEID": head.group(1)}
            records.append(current)
            continue
        if current is None or not line.strip():
            continue
        if line.startswith("State:"):
            current["NODESTATE"] = _word(line, source=source, number=number)
        elif line.startswith("Configured Resources:"):
            procs = re.search(r"PROCS:\s*([0-9]+)", line)
            mem = re.search(r"MEM:\s*([0-9]+)([KMGT]?)", line)
            if not procs or not mem:
                raise InputError(f"{source}:{number}: node {current['NODEID']}: no PROCS/MEM in {line.strip()!r}")
            current["RCPROC"] = procs.group(1)
            where = f"{source}:{number}: node {current['NODEID']}: MEM"
            current["RCMEM"] = str(size_mb(mem.group(1) + mem.group(2), where=where, bare="m"))
        elif line.startswith("Opsys:"):
            current["OS"] = _word(line, source=source, number=number)
        elif line.startswith("Features:"):
            current["FEATURES"] = line.split(":", 1)[1].strip()
        elif line.startswith("Partition:"):
            current["PARTITION"] = _word(line, source=source, number=number)
    if not records and text.strip():
        raise InputError(f"{source}: no 'node NAME' line: not the output of checknode")
    return records


def _word(line: str, *, source: str, number: int) -> str:
    """The value after `Key:` on a checknode line (`State:  Idle  (in current state for ...)`)."""
    key, _, rest = line.partition(":")
    words = rest.split()
    if not words:
        raise InputError(f"{source}:{number}: {key}: no value")
    return words[0]


def moab_checknode_xml(text: str, *, source: str) -> list[Record]:
    """One record per <node> of `checknode --xml` (attributes are already flat)."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise InputError(f"{source}: not valid Moab XML: {exc}") from None
    records = [dict(node.attrib) for node in root if node.tag == "node"]
    for index, record in enumerate(records):
        if "NODEID" not in record:
            raise InputError(f"{source}: <node> number {index + 1} has no NODEID attribute")
    return records
