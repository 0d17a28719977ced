"""Pause-first preemption, the parts that need no service (docs/preempt-pause.md): when an
interactive job must wait for its victims' saves (preemption.drain_fit, what its user reads),
and the pilot's request kind. The path itself runs on the dev cluster with a real guest as an
ordinary user in tests/test_realjob_slurm.py (the interactive job runs before the save ends,
the victim comes back with its memory intact); bench/preempt_pause.py measures it."""

from __future__ import annotations

import pytest

from preemption.drain_fit import drain_wait_text, short_of_memory
from vjob.errors import InputError
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.pilot_files import RequestKind
from vjob.pilot_files.records import request_from_json


def _view(node_mib: int, victim_mib: int, other_mib: int, wanted_mib: int) -> ClusterView:
    nodes = (Node("n1", 4, node_mib), Node("n2", 4, node_mib))
    jobs = (
        Job("v", "bob", memory_mb=victim_mib, cores=4, state=JobState.RUNNING, allocated_nodes=("n1",)),
        Job("o", "eve", memory_mb=other_mib, state=JobState.RUNNING, allocated_nodes=("n1", "n2")),
        Job("i", "ann", job_class=JobClass.INTERACTIVE, memory_mb=wanted_mib, nodes=2, cores=4),
    )
    return ClusterView(now=0.0, jobs=jobs, nodes=nodes)


def test_an_interactive_job_that_fits_beside_the_draining_victim_is_not_told_to_wait() -> None:
    view = _view(node_mib=8192, victim_mib=4096, other_mib=1024, wanted_mib=3072)  # 4096+1024+3072 = 8192
    assert short_of_memory(view, "i", ("n1", "n2")) == {}
    assert drain_wait_text(view, "i", ("n1", "n2"), ("v",)) is None


def test_one_that_does_not_fit_is_told_how_much_memory_it_waits_for_and_where() -> None:
    view = _view(node_mib=8192, victim_mib=4096, other_mib=1024, wanted_mib=3073)
    assert short_of_memory(view, "i", ("n1", "n2")) == {"n1": 1}  # n2 holds it: only the victim's node lacks
    text = drain_wait_text(view, "i", ("n1", "n2"), ("v",))
    assert text == (
        "vjob: waits for the memory of job v (4096 MiB) to be saved to disk "
        "(1 MiB short on n1; its CPUs are free already)"
    )


def test_the_pilot_takes_a_pause_checkpoint_request_and_refuses_an_unknown_kind() -> None:
    req = request_from_json({"request_id": "vm@1", "at": 1.0, "kind": "pause_checkpoint"}, source="t")
    assert req.kind is RequestKind.PAUSE_CHECKPOINT
    with pytest.raises(InputError, match="kind"):
        request_from_json({"request_id": "vm@1", "at": 1.0, "kind": "pause"}, source="t")
