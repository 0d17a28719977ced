"""The UBIS kernel's input checks and clamps, one column at a time (ubis_priority/kernel.py).

Why these: mutation testing (devkit/mutation.py, docs/development.md) found the checks only
ever exercised with several jobs and one bad value of one kind, so a check that looked at the
wrong condition (`&` for `|`, `>` for `>=`) or skipped a queue of one job passed the suite.
A wrong index or a negative share gives wrong priorities silently; each must be refused with
the column named.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ubis_priority import ClusterArrays, JobArrays, compute_arrays
from vjob.config import PriorityConfig
from vjob.errors import InputError

CFG = PriorityConfig()
NOW = 10_000.0


def jobs(n: int = 1, **columns: object) -> JobArrays:
    base: dict[str, object] = {
        "submit_time": np.full(n, NOW - 100.0),
        "nodes": np.ones(n, dtype=np.int64),
        "os_index": np.zeros(n, dtype=np.int64),
        "preempt_count": np.zeros(n, dtype=np.int64),
        "preempted_s": np.zeros(n),
        "interactive": np.zeros(n, dtype=np.bool_),
        "share_index": np.zeros(n, dtype=np.int64),
        "user_index": np.zeros(n, dtype=np.int64),
    }
    base.update({k: np.asarray(v) for k, v in columns.items()})
    return JobArrays(**base)  # type: ignore[arg-type]


def cluster(**fields: object) -> ClusterArrays:
    base: dict[str, object] = {
        "now": NOW,
        "total_nodes": 4,
        "free_nodes": 2,
        "free_by_os": np.array([2, 0], dtype=np.int64),
        "target": np.array([0.5]),
        "usage": np.array([0.25]),
        "interactive_held": 0,
        "user_interactive_held": np.zeros(1, dtype=np.int64),
    }
    base.update(fields)
    return ClusterArrays(**base)  # type: ignore[arg-type]


def test_the_arrays_are_frozen() -> None:
    """They are shared between the kernel, the explanation and the simulator's caches."""
    terms = compute_arrays(jobs(), cluster(), CFG)
    for value in (jobs(), cluster(), terms):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.now = 0.0  # type: ignore[misc, union-attr]


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("os_index", [2], r"jobs\.os_index\[0\] = 2: must be in -1\.\.1"),  # == len(free_by_os): not an image
        ("os_index", [-2], r"jobs\.os_index\[0\] = -2"),
        ("share_index", [1], r"jobs\.share_index\[0\] = 1: must be in 0\.\.0"),
        ("user_index", [1], r"jobs\.user_index\[0\] = 1"),
        ("submit_time", [float("nan")], r"jobs\.submit_time\[0\] = nan"),
        ("preempted_s", [-1.0], r"jobs\.preempted_s\[0\] = -1\.0"),
        ("preempted_s", [float("inf")], r"jobs\.preempted_s\[0\] = inf"),
        ("nodes", [0], r"jobs\.nodes\[0\] = 0: must be >= 1"),
    ],
)
def test_a_queue_of_one_job_with_one_bad_column_is_refused_naming_it(column: str, value: list[object], message: str):
    with pytest.raises(InputError, match=message):
        compute_arrays(jobs(1, **{column: value}), cluster(), CFG)


@pytest.mark.parametrize("name", ["target", "usage"])
@pytest.mark.parametrize("value", [-0.01, 1.01, float("nan")])
def test_a_share_outside_0_1_is_refused_naming_it(name: str, value: float) -> None:
    with pytest.raises(InputError, match=rf"cluster\.{name}\[0\] = {value}: must be a share in 0\.\.1"):
        compute_arrays(jobs(), cluster(**{name: np.array([value])}), CFG)


def test_a_job_submitted_after_now_has_waited_zero_not_a_negative_time() -> None:
    """A clock ahead on the submit host must not lower a priority below a job just submitted."""
    terms = compute_arrays(jobs(2, submit_time=[NOW + 500.0, NOW]), cluster(), CFG)
    assert terms.raw[1].tolist() == [0.0, 0.0] and terms.normalised[1].tolist() == [0.0, 0.0]
    assert terms.priority[0] == terms.priority[1]


def test_a_job_larger_than_the_cluster_has_its_node_terms_at_zero_not_below() -> None:
    """os_available = free nodes on its image − nodes asked: −10 on 4 nodes clips to −1, i.e. 0."""
    terms = compute_arrays(jobs(1, nodes=[10]), cluster(), CFG)
    assert terms.raw[2][0] == 2 - 10
    assert terms.normalised[2][0] == 0.0
    assert np.all((terms.normalised >= 0) & (terms.normalised <= 1))


def test_the_message_names_the_first_bad_job_not_an_earlier_good_one() -> None:
    with pytest.raises(InputError, match=r"jobs\.nodes\[1\] = 0: must be >= 1"):
        compute_arrays(jobs(2, nodes=[1, 0]), cluster(), CFG)
    with pytest.raises(InputError, match=r"jobs\.preempted_s\[1\] = -1\.0"):
        compute_arrays(jobs(2, preempted_s=[0.0, -1.0]), cluster(), CFG)
    with pytest.raises(InputError, match=r"jobs\.os_index\[1\] = 2"):
        compute_arrays(jobs(2, os_index=[1, 2]), cluster(), CFG)
