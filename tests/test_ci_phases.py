"""CI's two phases (.ci/run) run every test exactly once.

.ci/run runs the tests that need no service but PostgreSQL on both cores (pytest-xdist) and then
the tests of the other real services serially, each phase selected by a marker expression. Why a test: a marker added to
setup.cfg later, or an expression edited by hand, could leave a set of tests in neither phase (CI
would pass without running them) or in both (a service test on two workers at once). The
expressions are read from .ci/run itself and evaluated by pytest's own marker-expression code for
every combination of the markers setup.cfg declares.
"""

from __future__ import annotations

import configparser
import itertools
import re
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

REPO = Path(__file__).resolve().parent.parent
SERIAL_MARKERS = {"slurm", "libvirt", "realvm", "oar"}
"""The markers of tests whose service only the serial phase may start (PostgreSQL's tests run in
the parallel phase, all on one worker: tests/conftest.py groups them)."""


def _expression(name: str) -> Expression:
    """The marker expression assigned to `name` in .ci/run (`NAME="..."`)."""
    found = re.findall(rf'^{name}="([^"]+)"$', (REPO / ".ci" / "run").read_text(), flags=re.M)
    assert len(found) == 1, f".ci/run should assign {name} once, found {found}"
    return Expression.compile(found[0])


def _declared_markers() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["tool:pytest"]["markers"].strip().splitlines()
    return {line.split(":", 1)[0].strip() for line in lines if line.strip()}


def _selects(expression: Expression, marks: set[str]) -> bool:
    return expression.evaluate(lambda name, /, **kwargs: not kwargs and name in marks)


def test_every_combination_of_markers_but_soak_is_in_exactly_one_phase() -> None:
    parallel, serial = _expression("PARALLEL"), _expression("SERIAL")
    markers = sorted(_declared_markers())
    assert SERIAL_MARKERS | {"postgres", "soak", "slow"} <= set(markers)
    for size in range(len(markers) + 1):
        for combination in itertools.combinations(markers, size):
            marks = set(combination)
            phases = [_selects(parallel, marks), _selects(serial, marks)]
            if "soak" in marks:
                assert phases == [False, False], marks
            else:
                assert phases.count(True) == 1, (marks, phases)
                assert phases[1] == bool(marks & SERIAL_MARKERS), marks


KNOWN = [set(), {"slow"}, {"postgres"}, {"postgres", "slurm"}, {"slurm", "slow"}, {"slow", "soak"}]


@pytest.mark.parametrize("marks", KNOWN)
def test_the_phase_of_a_few_known_tests(marks: set[str]) -> None:
    """The same rule spelled out: a plain, slow or PostgreSQL test runs in parallel, a test of
    another service serially."""
    parallel, serial = _expression("PARALLEL"), _expression("SERIAL")
    expected = (False, False) if "soak" in marks else (not marks & SERIAL_MARKERS, bool(marks & SERIAL_MARKERS))
    assert (_selects(parallel, marks), _selects(serial, marks)) == expected
