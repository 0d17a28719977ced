"""The agent's collector pace (agent.heap_pace): the heap frozen as each tick starts, and the
garbage cycles frozen meanwhile collected at each thaw, none kept for good."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.heap_pace import HeapPace
from agent.loop import Agent
from plugins import make_adapter
from tests.standin_recorded import recorded_standin
from vjob.config import parse


class Cyclic:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """The test process's heap handed back to the collector whatever the test did."""
    yield
    gc.unfreeze()


def _garbage_cycle() -> weakref.ref[Cyclic]:
    return weakref.ref(Cyclic())


def test_a_garbage_cycle_made_between_thaws_is_collected_at_the_next_thaw() -> None:
    pace = HeapPace(thaw_every=3)
    pace.tick_starts()  # tick 1: frozen
    assert gc.get_freeze_count() > 0
    cycle = _garbage_cycle()
    pace.tick_starts()  # tick 2: the cycle, garbage already, frozen with the rest
    gc.collect()
    assert cycle() is not None  # no pass scans the permanent generation
    pace.tick_starts()  # tick 3: thawed and collected
    assert gc.get_freeze_count() == 0 and cycle() is None
    assert pace.ticks == 0
    pace.tick_starts()  # and the count starts again
    assert pace.ticks == 1 and gc.get_freeze_count() > 0


def test_objects_still_referred_to_survive_a_thaw_and_frozen_ones_are_freed_by_reference() -> None:
    pace = HeapPace(thaw_every=2)
    kept = Cyclic()
    dropped = Cyclic()
    dropped.me = None  # no cycle: its reference count frees it, frozen or not
    gone = weakref.ref(dropped)
    pace.tick_starts()
    del dropped
    assert gone() is None
    pace.tick_starts()  # thaw
    assert kept.me is kept


def test_a_pace_of_less_than_one_tick_is_refused() -> None:
    with pytest.raises(ValueError, match="thaw_every"):
        HeapPace(thaw_every=0)


def test_each_tick_of_the_daemon_starts_a_tick_of_its_pace(tmp_path: Path) -> None:
    """Wired where the daemon starts each tick (Agent.run; the bench calls it the same way), not
    in a tick called alone (a test's), on the Slurm stand-in printing a recorded listing."""
    standin, _ = recorded_standin(tmp_path)
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "agent": {"pilot_dir": str(tmp_path / "pilots")},
            "slurm": {"bin_dir": str(standin.dir), "conf": str(tmp_path / "etc" / "slurm.conf")},
        }
    )
    with Agent(cfg, make_adapter("slurm", cfg), rms="slurm") as agent:
        agent.heap = HeapPace(thaw_every=2)
        agent.observe(track=False)
        assert agent.heap.ticks == 0 and gc.get_freeze_count() == 0  # a tick called alone: no pace
        gc.disable()  # only the pace's own freeze and collection act on the cycle below
        try:
            cycle = _garbage_cycle()
            assert agent.run(once=True)
            assert agent.heap.ticks == 1 and gc.get_freeze_count() > 0
            assert cycle() is not None  # frozen with the first tick's start
            assert agent.run(once=True)
            assert agent.heap.ticks == 0 and cycle() is None  # the second: thawed and collected
        finally:
            gc.enable()
