"""Every Slurm parser fuzzed (issue 23, item 13): any input is a result or an InputError naming
where it is, never another exception. Inputs are the recorded outputs (tests/data) mutated, and
their fields swept with hostile values; fixed seeds, a few hundred to a thousand cases each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugins.slurm import hostlist, parse_output
from plugins.slurm.states import duration_s, job_state, node_state, size_mb, tres_memory_mb
from vjob.errors import InputError

DATA = Path(__file__).resolve().parent / "data" / "fixtures" / "slurm"
FIXTURES = {
    "debian-22.05-squeue.json": "jobs",
    "rivos_squeue_out.json": "jobs",
    "rivos_sinfo_out.json": "nodes",
    "irush_scontrol_show_job_multi.txt": "jobs",
    "ood_owens_scontrol_show_partitions.txt": "partitions",
    "rivos_squeue_fallback.txt": "jobs",
    "rivos_sinfo_fallback.txt": "nodes",
    "rivos_sinfo_dataparser_23.02.json": "nodes",
    "zocalo_slurmrestd_23.11_v0.0.40_jobs.json": "jobs",
}
TEXTS = {name: (DATA / name).read_text() for name in FIXTURES}
HOSTILE = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["²", "-1", "1e999", "9" * 400, "", " ", "\n", "(null)", "N/A", "x UserId=root(0)", "[", "]", "n[0-9999999]"]
    ),
)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), HOSTILE),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["set", "number", "infinite", "x"]), inner, max_size=3),
    ),
    max_leaves=6,
)


def fast(examples: int) -> settings:
    """Fixed seed, no deadline (CI machines are shared), `examples` cases."""
    return settings(deadline=None, max_examples=examples, suppress_health_check=[HealthCheck.too_slow])


def _parse(kind: str, text: str) -> None:
    try:
        parse_output(kind, text, source="fuzz")
    except InputError as exc:
        assert str(exc).startswith("fuzz"), f"InputError without its source: {exc}"


@fast(300)
@given(name=st.sampled_from(sorted(FIXTURES)), data=st.data())
def test_mutated_recorded_outputs(name: str, data: st.DataObject) -> None:
    text = TEXTS[name]
    at = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 40))
    insert = data.draw(HOSTILE)
    _parse(FIXTURES[name], text[:at] + insert + text[at + cut :])


def _walk(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _walk(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:3]):
            out += _walk(value, (*path, i))
    return out


JSON_DOCS = {n: json.loads(TEXTS[n]) for n in FIXTURES if n.endswith(".json")}
JSON_PATHS = {n: [p for p in _walk(d) if p] for n, d in JSON_DOCS.items()}


@fast(600)
@given(name=st.sampled_from(sorted(JSON_DOCS)), data=st.data())
def test_json_field_sweep(name: str, data: st.DataObject) -> None:
    doc = json.loads(TEXTS[name])
    path = data.draw(st.sampled_from(JSON_PATHS[name]))
    holder = doc
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = data.draw(JSON_VALUES)
    _parse(FIXTURES[name], json.dumps(doc))


SCONTROL = TEXTS["irush_scontrol_show_job_multi.txt"]
KEYS = sorted({tok.split("=")[0] for tok in SCONTROL.split() if "=" in tok})


@fast(600)
@given(key=st.sampled_from(KEYS), value=HOSTILE)
def test_scontrol_field_sweep(key: str, value: str) -> None:
    _parse("jobs", SCONTROL.replace(f" {key}=", f" {key}={value}", 1))


@fast(600)
@given(text=st.one_of(HOSTILE, st.from_regex(r"[a-z\[\]0-9,\-]{0,30}", fullmatch=True)))
def test_hostlist_and_values(text: str) -> None:
    for parse in (
        hostlist.expand,
        lambda t: size_mb(t, where="w"),
        lambda t: duration_s(t, where="w"),
        lambda t: tres_memory_mb(t, where="w"),
        lambda t: job_state(t, where="w"),
        lambda t: node_state(t, where="w"),
    ):
        try:
            parse(text)
        except InputError:
            pass


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_absurd_nesting_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError):
        parse_output("jobs", text, source="deep")
