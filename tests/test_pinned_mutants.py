"""Four deliberate bugs that lived through the suite (issue 39, "Tests that would have caught
these"), each pinned here by the behaviour it breaks, with numbers worked out by hand:

- the guard's model of a victim's return: its hold again, delayed by the preemptor, plus a
  remote resume of **2 ×** its checkpoint time (preemption/scheduling/guard.py);
- the plan validator's rule that **the suspends of one vjob share one pool** (its resumes were
  pinned already, tests/test_planner_paper.py) (preemption/planner/validator.py);
- `assign` never hands out vmID **255**, the subnet's broadcast address, nor 0, its network
  address (vjob/store/identities.py through saline_bew/identity.py);
- the x-factor's **1-second floor** on the remaining time (preemption/deadline/xfactor.py).

Beside each, the neighbouring rules devkit/mutation.py found no test breaking (the free nodes
a preemptor takes, a victim past its estimate, the address formulas' bounds).
"""

from __future__ import annotations

import dataclasses

import pytest

from preemption.deadline import x_factor
from preemption.planner import Instance, NodeSpec, Plan, PlanAction, VMSpec, validate
from preemption.planner.plan import plan_cost
from preemption.planner.validator import PlanInvalidError
from preemption.scheduling.guard import harmful, keeps_reservation, returning
from saline_bew.identity import assign, ip_for, mac_for
from vjob.errors import ConfigError, ExhaustedError, InputError
from vjob.model import Action, VJobState
from vjob.store import identities
from vjob.store.db import Store

R, S = VJobState.RUNNING, VJobState.SLEEPING


# -- the guard: a victim returns after its remaining hold, the preemptor's run and 2 × its checkpoint


def test_a_victim_returns_after_the_preemptor_and_twice_its_checkpoint() -> None:
    # now 100; the victim's hold would end at 500, its checkpoint takes 50 s; the preemptor ends
    # at 400: the victim holds its 3 nodes again until 500 + (400 - 100) + 2 × 50 = 900.
    assert returning(100.0, [(500.0, 3, 50.0)], 400.0) == [(900.0, 3)]
    assert returning(0.0, [(10.0, 1, 0.0), (20.0, 2, 7.5)], 5.0) == [(15.0, 1), (40.0, 2)]


def test_a_victim_past_its_estimate_is_not_back_before_its_preemptor_ends() -> None:
    # Its hold "ended" at 50, before now (100): nothing left by its estimate, so it is back
    # right after the preemptor (ends at 400) and its resume: 100 + 300 + 2 × 10 = 420, not 370.
    assert returning(100.0, [(50.0, 1, 10.0)], 400.0) == [(420.0, 1)]


def test_the_guard_allows_exactly_the_slack_the_victims_2x_return_costs() -> None:
    # 4 nodes; the guard needs all 4; a victim holds 2 until t=100 (checkpoint 10 s), 2 are free
    # and stay free: the guard's reserved start is 100. Preempted by a 50 s interactive job on
    # the victim's nodes, the victim is back on them until 100 + 50 + 2 × 10 = 170: the guard
    # is 70 s later. A slack of 70 s allows it, 69.9 s does not (1 × or 3 × would each flip one).
    args = dict(now=0.0, free=2, need=4, holds=[(100.0, 2)], victims=[(100.0, 2, 10.0)], taken_free=0)
    assert keeps_reservation(**args, preemptor_end=50.0, slack=70.0) == (True, 100.0)
    assert keeps_reservation(**args, preemptor_end=50.0, slack=69.9) == (False, 100.0)


def test_free_nodes_the_interactive_job_takes_are_held_until_its_end() -> None:
    # No victim: the interactive job takes the 2 free nodes until t=300. The guard needs all 4
    # (2 more come back at 100): reserved at 100 before, at 300 after: 200 s later.
    args = dict(now=0.0, free=2, need=4, holds=[(100.0, 2)], victims=[], taken_free=2, preemptor_end=300.0)
    assert keeps_reservation(**args, slack=200.0) == (True, 100.0)
    assert keeps_reservation(**args, slack=199.0) == (False, 100.0)
    # A guard larger than the machine never starts: nobody delays it.
    assert keeps_reservation(0.0, 2, 9, [(100.0, 2)], [], 2, 300.0, 0.0) == (True, float("inf"))


def test_harmful_victims_are_those_whose_return_crosses_the_guards_start() -> None:
    # Preempted alone at 0, a victim ending at 100 with a 10 s checkpoint under a 50 s job is
    # back until 100 + (10 + 50) + 2 × 10 = 180: harmful for a guard reserved in [100, 180).
    one = [(100.0, 10.0)]
    assert [harmful(0.0, g, one, 50.0)[0] for g in (99.0, 100.0, 179.9, 180.0)] == [False, True, True, False]


# -- the validator: one vjob's suspends share one pool


def _two_vm_vjob() -> Instance:
    return Instance(
        nodes=(NodeSpec("N1", 2, 4096), NodeSpec("N2", 2, 4096)),
        vms=(VMSpec("a1", "a", 1, 512, R, "N1"), VMSpec("a2", "a", 1, 1024, R, "N2")),
        target={"a": S},
    )


def test_one_vjobs_suspends_split_over_two_pools_are_refused() -> None:
    """The first VM's memory would be saved while the second still runs: a vjob whose VMs were
    saved at different moments cannot be resumed consistently (Entropy's grouping)."""
    inst = _two_vm_vjob()
    a1, a2 = PlanAction(Action.SUSPEND, "a1", "a", "N1"), PlanAction(Action.SUSPEND, "a2", "a", "N2")
    mem = {"a1": 512, "a2": 1024}
    together = ((a1, a2),)
    validate(inst, Plan(pools=together, placement={}, cost=plan_cost(together, mem)))  # sound
    split = ((a1,), (a2,))
    with pytest.raises(PlanInvalidError, match=r"vjob a: its suspends are split over pools \[0, 1\]") as err:
        validate(inst, Plan(pools=split, placement={}, cost=plan_cost(split, mem)))
    assert len(err.value.problems) == 1  # that, and nothing else, is wrong with it


# -- identities: never the broadcast vmID


def test_assign_hands_out_vm_ids_1_to_254_and_never_the_broadcast(store: Store) -> None:
    net = {"site": "a", "mac_prefix": "52:54:00", "network": "10.0.0.0/8"}
    names = [f"big-{i}" for i in range(254)]
    got = assign(store, job_key="big", vm_names=names, **net)
    assert sorted(i.vm_id for i in got) == list(range(1, 255))
    assert not any(i.ip.endswith((".255", ".0")) or i.mac.endswith((":ff", ":00")) for i in got)
    with pytest.raises(ExhaustedError, match="no free vmID left"):
        assign(store, job_key="big", vm_names=[*names, "big-254"], **net)
    with pytest.raises(ExhaustedError, match="no free vmID left"):  # 255 at once, on an empty subnet
        assign(store, job_key="full", vm_names=[f"f-{i}" for i in range(255)], **net)
    identities.release(store, "full")
    assert assign(store, job_key="big", vm_names=names, **net) == got  # the refused call added nothing


# -- the x-factor: a job with less than a second left counts as having one second left


def test_the_x_factor_takes_at_least_one_second_of_remaining_time() -> None:
    # 0.5 s left, deadline in 0.25 s: (1 - 0.25) / 1 = 0.75, not (0.5 - 0.25) / 0.5 = 0.5.
    assert x_factor(0.5, 0.25) == 0.75
    assert x_factor(0.0, 10.0) == -9.0  # nothing left: on time by 9 "seconds" in 1, not -inf
    assert x_factor(0.0, -2.0) == 3.0
    assert x_factor(1.0, 0.5) == 0.5 and x_factor(2.0, 0.5) == 0.75  # from 1 s up, the plain ratio


def test_the_address_formulas_take_exactly_16_and_8_bits() -> None:
    """The formulas accept every subnetID 0..65535 and vmID 0..255 (which of them `assign`
    hands out is its business) and refuse one step outside, naming the field."""
    assert mac_for("52:54:00", 0, 0) == "52:54:00:00:00:00"
    assert mac_for("52:54:00", 65535, 255) == "52:54:00:ff:ff:ff"
    assert ip_for("10.0.0.0/8", 65535, 255) == "10.255.255.255"
    for subnet, vm, field in (
        (-1, 1, "subnetID = -1"),
        (65536, 1, "subnetID = 65536"),
        (1, -1, "vmID = -1"),
        (1, 256, "vmID = 256"),
    ):
        limit = "0..65535" if field.startswith("subnet") else "0..255"
        with pytest.raises(InputError, match=f"{field}: must be in {limit}$"):
            mac_for("52:54:00", subnet, vm)
        with pytest.raises(InputError, match=f"{field}: must be in {limit}$"):
            ip_for("10.0.0.0/8", subnet, vm)
    with pytest.raises(ConfigError, match=r"10\.0\.0\.0/9.*needs 24 free bits"):
        ip_for("10.0.0.0/9", 1, 1)


def test_an_identity_cannot_be_changed_once_handed_out(store: Store) -> None:
    (got,) = assign(store, site="a", job_key="j", vm_names=["v"], mac_prefix="52:54:00", network="10.0.0.0/8")
    assert not hasattr(got, "__dict__")  # slotted
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.vm_id = 9  # type: ignore[misc]
