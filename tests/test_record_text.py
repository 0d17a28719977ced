"""The one editor of a job's record field (vjob/record_text.py): vjob's wait reason and usage
words change, every other character of the text survives byte for byte (hypothesis, seeded)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vjob import record_text, usage_record
from vjob.errors import InputError
from vjob.record_text import notice, with_notice
from vjob.usage_record import Usage

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True)
# Any text an operator, job_submit.lua or the usage writers may leave: brackets, tabs, newlines,
# 'vjob' fragments, non-ASCII, double spaces — everything but a reason group of ours.
_ALPHABET = st.sampled_from(list(" \t\n[]:vjob-usage@=,.()/;é0123456789abcAB"))
TEXTS = st.text(_ALPHABET, max_size=80).filter(lambda t: record_text.NOTICE.search(t) is None)
REASONS = st.builds(
    lambda s: f"vjob: {s}", st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
).filter(lambda r: _valid(r))


def _valid(reason: str) -> bool:
    """A reason clean_notice takes (its refusals are tested below)."""
    try:
        record_text.clean_notice(reason)
    except InputError:
        return False
    return True


@SETTINGS
@given(TEXTS, REASONS)
def test_adding_then_removing_a_reason_gives_the_text_back(text: str, reason: str) -> None:
    told = with_notice(text, reason)
    assert notice(told) == record_text.clean_notice(reason)
    assert told.startswith(text)  # appended: everything before it untouched
    assert with_notice(told, None) == text


@SETTINGS
@given(TEXTS, REASONS, REASONS)
def test_a_new_reason_replaces_the_old_in_place(text: str, first: str, second: str) -> None:
    assert with_notice(with_notice(text, first), second) == with_notice(text, second)
    assert with_notice(text, None) == text  # nothing of ours: nothing changes


@SETTINGS
@given(TEXTS, REASONS, st.sampled_from(["n1", "node-2.site"]), st.integers(0, 10_000))
def test_usage_words_and_the_reason_keep_each_other(text: str, reason: str, node: str, cpu: int) -> None:
    """The node service adds usage while the reason stands (the race at a job's start): the
    usage word survives the reason's removal, the reason the usage word's addition."""
    run = Usage(float(cpu), 100, 1)
    both = usage_record.merged(with_notice(text, reason), node, run)
    assert notice(both) == record_text.clean_notice(reason)
    assert usage_record.parse(both)[node] == usage_record.parse(usage_record.merged(text, node, run))[node]
    assert with_notice(both, None) == usage_record.merged(text, node, run)


def test_the_labels_and_an_operators_words_stay_where_they_are() -> None:
    text = "vjob:class=interactive,os=debian12  ops:\tcheck disk vjob-usage@n1:cpu_s=1.00,peak_mib=2,runs=1"
    told = with_notice(text, "vjob: interactive cap reached (2/2 nodes; this job asks 1)")
    assert told == text + " [vjob: interactive cap reached (2/2 nodes; this job asks 1)]"
    again = with_notice(told, "vjob: no checkpointable victim (can free 0 of 1 nodes)")
    assert again == text + " [vjob: no checkpointable victim (can free 0 of 1 nodes)]"
    assert with_notice(again, None) == text


def test_an_operator_appending_after_the_reason_keeps_their_words() -> None:
    told = with_notice("label", "vjob: waits") + " operator note"
    assert with_notice(told, None) == "label operator note"
    assert with_notice("[vjob: waits] x", None) == "x"


def test_a_reason_is_one_safe_line() -> None:
    assert record_text.clean_notice("vjob: delay job 12[3].srv\nby 2 min") == "vjob: delay job 12(3).srv by 2 min"
    for bad in ("cap reached", "vjob:", "vjob: \n\t"):
        with pytest.raises(InputError, match="must be 'vjob: ' and a reason"):
            record_text.clean_notice(bad)
    with pytest.raises(InputError, match="record"):
        with_notice("x" * (record_text.MAX_FIELD_CHARS + 1), "vjob: waits")
