"""The node service's wire format and the rules every request's fields must meet, checked
before anything acts on them.

Why a format this plain: every byte of a request comes from a job's user, who may be hostile.
One JSON object per line, at most MAX_REQUEST_BYTES, each field with a type and a size limit,
unknown fields refused: there is nothing else to parse, so nothing else to get wrong (the
parser is fuzzed: tests/test_node_service_protocol.py).

The registration contract (what an operations module gives the service):

    # provisioning/node_service/<kind>_ops.py
    from provisioning.node_service.protocol import Flag, Integer, Items, OperationSpec, Text
    from provisioning.node_service.grant import Grant

    def _up(grant: Grant, fields: Mapping[str, Any]) -> dict[str, Any]:
        ...  # fields hold only what the spec names, each already checked
        return {"bridge": "vj12"}

    OPERATIONS: Mapping[str, OperationSpec] = {
        "net.up": OperationSpec(_up, {"vms": Integer(1, 64), "mac": Text(MAC_RE, 17, optional=True)}),
    }

provisioning/node_service/operations.py merges every module's OPERATIONS (a name given twice
is an error at start). A request is `{"op": ..., "job": ..., "node": ..., <the op's fields>}`;
the service checks the envelope (RESERVED), then the op's fields against its spec, builds the
Grant (SO_PEERCRED + the RMS), and only then calls `run(grant, fields)`. An operation refuses a
request by raising vjob.errors.InputError (its message goes back to the caller); anything else
it raises is logged and answered with a generic error. The answer is one line:
`{"ok": true, **run's result}` or `{"ok": false, "error": "..."}`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioning.node_service.grant import Operation
from vjob.errors import InputError

MAX_REQUEST_BYTES = 8192
"""A request line's size limit, newline included: no operation needs more."""
MAX_ANSWER_BYTES = 65536
"""An answer line's size limit (the client reads no further)."""
MAX_FIELDS = 32
"""Fields per request beyond which nothing is even looked at."""

JOB_RE = re.compile(r"[0-9A-Za-z._+-]{1,64}|[0-9]{1,20}\[[0-9]{1,9}\](?:\.[0-9A-Za-z.-]{1,40})?")
"""An RMS job id: Slurm's `123`, `123_4`, `123+1`; PBS's `12.server` and an array task's
`12[3].server`; OAR's `42`. Only ever data (a record's field, hashed into a subnetID), never a
path or a command word."""
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}")
"""A node name as the RMS prints it (a DNS label or a dotted name)."""
OP_RE = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*")
FIELD_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


class ProtocolError(InputError):
    """A request the service refuses before any operation sees it: the message names the field
    and the value (cut short), never echoing more than a line."""


def shown(value: Any, limit: int = 60) -> str:
    """`value` as an error message may echo it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Text:
    """A string matching `pattern` whole, at most `max_len` characters."""

    pattern: re.Pattern[str]
    max_len: int
    optional: bool = False

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ProtocolError(f"field '{name}': {shown(value)} is not a string")
        if len(value) > self.max_len:
            raise ProtocolError(f"field '{name}': {shown(value)} is longer than {self.max_len} characters")
        if not self.pattern.fullmatch(value):
            raise ProtocolError(f"field '{name}': {shown(value)} does not match {self.pattern.pattern}")
        return value


@dataclass(frozen=True)
class Integer:
    """An integer (never a bool or a float) in [low, high]."""

    low: int
    high: int
    optional: bool = False

    def check(self, name: str, value: Any) -> int:
        if type(value) is not int:
            raise ProtocolError(f"field '{name}': {shown(value)} is not an integer")
        if not self.low <= value <= self.high:
            raise ProtocolError(f"field '{name}': {value} is outside [{self.low}, {self.high}]")
        return value


@dataclass(frozen=True)
class Flag:
    """true or false."""

    optional: bool = False

    def check(self, name: str, value: Any) -> bool:
        if type(value) is not bool:
            raise ProtocolError(f"field '{name}': {shown(value)} is not true or false")
        return value


@dataclass(frozen=True)
class Items:
    """A list of at most `max_items` values, each meeting `item` (a Text, Integer or Flag)."""

    item: Text | Integer | Flag
    max_items: int
    optional: bool = False

    def check(self, name: str, value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise ProtocolError(f"field '{name}': {shown(value)} is not a list")
        if len(value) > self.max_items:
            raise ProtocolError(f"field '{name}': {len(value)} items, more than {self.max_items}")
        return tuple(self.item.check(f"{name}[{i}]", v) for i, v in enumerate(value))


FieldRule = Text | Integer | Flag | Items


@dataclass(frozen=True)
class OperationSpec:
    """One operation: what runs it and the fields it takes (no other field is accepted)."""

    run: Operation
    fields: Mapping[str, FieldRule] = field(default_factory=dict)
    deadline_s: float | None = None
    """This operation's own deadline when it needs longer than [node] operation_deadline_s
    (e.g. starting an NFS server); None keeps the configured one."""
    after_end: bool = False
    """A clean-up that also serves the owner of a job no longer running (JobAuthority.owned):
    a pilot gives back its network, its NFS gateway and its VMs' usage after the save of a
    requeue, when the RMS already counts the job as not running. It can only undo or report
    what its own job made (each operation keys its records by job id)."""

    def __post_init__(self) -> None:
        for name in self.fields:
            if name in RESERVED or not FIELD_NAME_RE.fullmatch(name):
                raise ValueError(f"operation field {name!r}: reserved or not a plain lower-case name")


RESERVED = {
    "op": Text(OP_RE, 32),
    "job": Text(JOB_RE, 64),
    "node": Text(NODE_RE, 63),
}
"""The envelope every request carries: which operation, for which job, on which node."""


@dataclass(frozen=True)
class Request:
    """A request whose envelope and fields met their rules (the fields only those of its op)."""

    op: str
    job: str
    node: str
    fields: Mapping[str, Any]


def decode(line: bytes) -> dict[str, Any]:
    """One request line → its JSON object; ProtocolError for anything else (too long, not
    UTF-8, not JSON, not an object, a repeated key, too many fields, a non-finite number)."""
    if len(line) > MAX_REQUEST_BYTES:
        raise ProtocolError(f"request longer than {MAX_REQUEST_BYTES} bytes")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("request is not UTF-8") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"request is not JSON: {shown(str(exc), 80)}") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"request is not a JSON object: {shown(data)}")
    if len(data) > MAX_FIELDS:
        raise ProtocolError(f"request has {len(data)} fields, more than {MAX_FIELDS}")
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys appear once: `{"job": "1", "job": "2"}` is ambiguous, refused."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"field {shown(key)} given twice")
        data[key] = value
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def check(data: Mapping[str, Any], operations: Mapping[str, OperationSpec]) -> Request:
    """The request `data` checked against the envelope and its operation's spec: a Request, or
    ProtocolError naming the first field (and value) that breaks a rule."""
    values = {name: rule.check(name, data[name]) if name in data else _missing(name) for name, rule in RESERVED.items()}
    spec = operations.get(values["op"])
    if spec is None:
        raise ProtocolError(f"field 'op': {shown(values['op'])} is not an operation of this service")
    fields: dict[str, Any] = {}
    for name, value in data.items():
        if name in RESERVED:
            continue
        rule = spec.fields.get(name)
        if rule is None:
            raise ProtocolError(f"field {shown(name)} = {shown(value)}: unknown to operation '{values['op']}'")
        fields[name] = rule.check(name, value)
    for name, rule in spec.fields.items():
        if name not in fields and not rule.optional:
            _missing(name)
    return Request(values["op"], values["job"], values["node"], fields)


def _missing(name: str) -> Any:
    raise ProtocolError(f"field '{name}' is missing")


def parse(line: bytes, operations: Mapping[str, OperationSpec]) -> Request:
    """A request line, decoded and checked: the one entry point for what a caller sends."""
    return check(decode(line), operations)


def encode(answer: Mapping[str, Any]) -> bytes:
    """An answer as one JSON line (ASCII only, so no byte of it can be taken for a newline)."""
    return json.dumps(answer, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def ok(result: Mapping[str, Any]) -> dict[str, Any]:
    """The answer for an operation's result (its own "ok" or "error" keys cannot override)."""
    return {**{k: v for k, v in result.items() if k not in ("ok", "error")}, "ok": True}


def refused(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}
