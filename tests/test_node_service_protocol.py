"""The node service's parser: every byte is the caller's, so it is fuzzed (hypothesis, seeded by
the "ci" profile) — it raises nothing but ProtocolError, accepts no unknown field and no value
outside its rule — and the registry refuses specs that would break the envelope."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioning.node_service import protocol
from provisioning.node_service.grant import Grant
from provisioning.node_service.operations import registry
from provisioning.node_service.protocol import Flag, Integer, Items, OperationSpec, ProtocolError, Text

NAME_RE = re.compile(r"[a-z]{1,8}")


def _echo(grant: Grant, fields: Any) -> dict[str, Any]:
    return dict(fields)


OPS = {
    "net.up": OperationSpec(
        _echo,
        {
            "vms": Integer(1, 64),
            "names": Items(Text(NAME_RE, 8), 4, optional=True),
            "public": Flag(optional=True),
            "label": Text(NAME_RE, 8),
        },
    ),
    "hello": OperationSpec(_echo, {}),
}
GOOD = {"op": "net.up", "job": "123_4", "node": "node1", "vms": 2, "label": "abc"}


def _line(data: Any) -> bytes:
    return json.dumps(data).encode()


def test_a_good_request_is_read_with_its_fields_only() -> None:
    request = protocol.parse(_line({**GOOD, "names": ["a", "bb"], "public": True}), OPS)
    assert (request.op, request.job, request.node) == ("net.up", "123_4", "node1")
    assert dict(request.fields) == {"vms": 2, "label": "abc", "names": ("a", "bb"), "public": True}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "field 'colour' = 'red': unknown to operation 'net.up'"),
        ({"vms": 65}, "field 'vms': 65 is outside [1, 64]"),
        ({"vms": True}, "field 'vms': True is not an integer"),
        ({"vms": 2.0}, "field 'vms': 2.0 is not an integer"),
        ({"label": "abcdefghi"}, "field 'label': 'abcdefghi' is longer than 8 characters"),
        ({"label": "ab/c"}, "field 'label': 'ab/c' does not match [a-z]{1,8}"),
        ({"names": ["a"] * 5}, "field 'names': 5 items, more than 4"),
        ({"names": ["a", 3]}, "field 'names[1]': 3 is not a string"),
        ({"public": "yes"}, "field 'public': 'yes' is not true or false"),
        ({"job": "1; rm -rf /"}, "field 'job': '1; rm -rf /' does not match"),
        ({"job": "1" * 65}, "is longer than 64 characters"),
        ({"job": "12[3]/../x"}, "field 'job': '12[3]/../x' does not match"),
        ({"job": "12[x].server"}, "field 'job': '12[x].server' does not match"),
        ({"node": "../etc"}, "field 'node': '../etc' does not match"),
        ({"op": "net.down"}, "field 'op': 'net.down' is not an operation of this service"),
    ],
)
def test_a_bad_field_is_refused_naming_the_field_and_the_value(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        protocol.parse(_line({**GOOD, **change}), OPS)
    assert message in str(caught.value)


def test_missing_envelope_or_required_field_and_framing_errors_are_named() -> None:
    for key in ("op", "job", "node", "vms"):
        with pytest.raises(ProtocolError, match=f"field '{key}' is missing"):
            protocol.parse(_line({k: v for k, v in GOOD.items() if k != key}), OPS)
    cases = {
        b"\xff\xfe": "not UTF-8",
        b"[1, 2]": "not a JSON object",
        b'{"op": "hello", "op": "hello"}': "given twice",
        b'{"vms": NaN}': "not JSON",
        b"{" * 5000: "not JSON",
        b"x" * (protocol.MAX_REQUEST_BYTES + 1): "longer than 8192 bytes",
        _line({f"f{i}": i for i in range(40)}): "more than 32",
    }
    for line, message in cases.items():
        with pytest.raises(ProtocolError, match=message):
            protocol.parse(line, OPS)


def test_an_error_never_echoes_more_than_a_short_excerpt_of_the_value() -> None:
    with pytest.raises(ProtocolError) as caught:
        protocol.parse(_line({**GOOD, "label": "x" * 7000}), OPS)
    assert len(str(caught.value)) < 200


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
_field_names = st.sampled_from([*GOOD, "names", "public", "colour", "", "ok", "vms "]) | st.text(max_size=10)


def _accepted(line: bytes) -> protocol.Request | None:
    try:
        return protocol.parse(line, OPS)
    except ProtocolError:
        return None


def _meets_the_spec(request: protocol.Request) -> None:
    """What an accepted request must be, whatever was sent: known fields, each within its rule."""
    spec = OPS[request.op]
    assert set(request.fields) <= set(spec.fields)
    assert protocol.JOB_RE.fullmatch(request.job) and len(request.job) <= 64
    assert protocol.NODE_RE.fullmatch(request.node)
    for name, value in request.fields.items():
        rule = spec.fields[name]
        if isinstance(rule, Integer):
            assert type(value) is int and rule.low <= value <= rule.high
        elif isinstance(rule, Text):
            assert isinstance(value, str) and len(value) <= rule.max_len and rule.pattern.fullmatch(value)
        elif isinstance(rule, Items):
            assert isinstance(value, tuple) and len(value) <= rule.max_items
        else:
            assert type(value) is bool


@settings(max_examples=400)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes_raise_only_the_protocol_error(raw: bytes) -> None:
    request = _accepted(raw)
    if request is not None:
        _meets_the_spec(request)


@settings(max_examples=600)
@given(st.dictionaries(_field_names, _json, max_size=8), st.booleans())
def test_fuzz_arbitrary_objects_accepted_only_when_every_field_meets_its_rule(
    extra: dict[str, Any], keep_good: bool
) -> None:
    data = {**GOOD, **extra} if keep_good else extra
    request = _accepted(_line(data))
    if request is None:
        return
    _meets_the_spec(request)
    assert set(data) == set(request.fields) | {"op", "job", "node"}, "every field sent was checked and kept"


@settings(max_examples=300)
@given(st.sampled_from(sorted(GOOD)), st.text(min_size=1, max_size=30), st.integers(1, 9000))
def test_fuzz_oversize_or_mutated_values_are_never_accepted(key: str, junk: str, size: int) -> None:
    value = (junk * (size // len(junk) + 1))[:size]
    request = _accepted(_line({**GOOD, key: value}))
    if request is not None:  # only a value that meets the rule may pass
        _meets_the_spec(request)
        assert len(value) <= 64


def test_specs_and_registry_refuse_what_would_break_the_envelope() -> None:
    with pytest.raises(ValueError, match="reserved"):
        OperationSpec(_echo, {"job": Integer(0, 1)})
    with pytest.raises(ValueError, match="reserved or not a plain"):
        OperationSpec(_echo, {"Bad-Name": Flag()})
    ops = registry()
    assert "hello" in ops and all(protocol.OP_RE.fullmatch(op) for op in ops)


def test_answers_are_one_ascii_line_and_an_operation_cannot_forge_ok() -> None:
    line = protocol.encode(protocol.ok({"ok": False, "error": "forged", "note": "é\n"}))
    assert line.count(b"\n") == 1 and line.endswith(b"\n") and line.isascii()
    assert json.loads(line) == {"ok": True, "note": "é\n"}


@pytest.mark.parametrize("job", ["123", "123_4", "7+1", "12.server", "12[3].server", "12[3]", "42"])
def test_every_rms_job_id_form_is_read(job: str) -> None:
    assert protocol.parse(_line({**GOOD, "job": job}), OPS).job == job
