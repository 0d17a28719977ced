"""Pause-first preemption, the parts that need no service (docs/preempt-pause.md): when an
interactive job must wait for its victims' saves (preemption.drain_fit, what its user reads),
the pilot's request kind, where `pause_first = "auto"` turns it on (Slurm's ProctrackType and
SelectTypeParameters, plugins.slurm.proctrack; the agent's answer, agent.pause_checkpoint.enabled)
and the configuration file the drainer reads. The crash of an agent mid-way is
tests/test_pause_recover.py. The path itself runs on the dev cluster with a real guest as an
ordinary user in tests/test_realjob_slurm.py (the interactive job runs before the save ends,
the victim comes back with its memory intact); bench/preempt_pause.py measures it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.pause_checkpoint import enabled
from pilot.pause_drain import config_for_drainer, drain
from plugins.slurm.proctrack import READ_EVERY_S, ProctrackReader, read_settings, spares_detached
from preemption.drain_fit import drain_wait_text, short_of_memory
from tests.stand_ins import SuspendingAdapter
from vjob.config import parse
from vjob.errors import CommandError, ConfigError, InputError, VjobError
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind
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


# -- where pause-first is on: `[agent] pause_first = "auto"` (the default) ---------------------
SHOW_CONFIG = """Configuration data as of 2026-11-29T19:00:00
PropagateResourceLimits = ALL
ProctrackType           = {proctrack}
SelectType              = select/cons_tres
SelectTypeParameters    = {params}
"""
"""The lines plugins.slurm.proctrack reads, laid out as Slurm 22.05's `scontrol show config`."""


@pytest.mark.parametrize("proctrack", ["proctrack/linuxproc", "proctrack/pgid"])
def test_slurm_whose_suspend_spares_a_detached_process_and_counts_memory_gets_pause_first(proctrack: str) -> None:
    on, why = spares_detached(read_settings(SHOW_CONFIG.format(proctrack=proctrack, params="CR_CORE_MEMORY")))
    assert on and proctrack in why


def test_proctrack_cgroup_or_memory_not_counted_keeps_save_first_and_says_why() -> None:
    on, why = spares_detached(read_settings(SHOW_CONFIG.format(proctrack="proctrack/cgroup", params="CR_CORE_MEMORY")))
    assert not on and "proctrack/cgroup" in why and "frozen" in why
    on, why = spares_detached(read_settings(SHOW_CONFIG.format(proctrack="proctrack/linuxproc", params="CR_CORE")))
    assert not on and "does not count memory" in why
    for bad in ("", "proctrack/linuxproc; rm -rf /", "x" * 300):
        with pytest.raises(CommandError, match="ProctrackType"):
            spares_detached(read_settings(SHOW_CONFIG.format(proctrack=bad, params="CR_CORE_MEMORY")))


def test_the_reader_asks_the_controller_once_then_again_when_a_minute_old() -> None:
    texts = [
        SHOW_CONFIG.format(proctrack=p, params="CR_CORE_MEMORY") for p in ("proctrack/linuxproc", "proctrack/cgroup")
    ]
    asked: list[int] = []
    now = [0.0]

    def run() -> str:
        asked.append(1)
        return texts[min(len(asked) - 1, 1)]

    reader = ProctrackReader(run, clock=lambda: now[0])
    assert reader.spares_detached()[0] and reader.spares_detached()[0] and len(asked) == 1
    now[0] = READ_EVERY_S  # a `scontrol reconfigure` since: ProctrackType is now cgroup
    assert not reader.spares_detached()[0] and len(asked) == 2


def test_pause_first_takes_true_false_or_auto_and_names_anything_else() -> None:
    assert parse({}).agent.pause_first == "auto"
    assert parse({"agent": {"pause_first": False}}).agent.pause_first is False
    for bad in ("yes", "on", 1, "Auto"):
        with pytest.raises(ConfigError, match=r"agent\.pause_first = .*must be true, false or \"auto\""):
            parse({"agent": {"pause_first": bad}}, source="vjob.toml")


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, event: str, **kw: object) -> None:
        self.lines.append((event, str(kw["why"])))

    warning = info


def _ports(setting: object, adapter: object) -> SimpleNamespace:
    return SimpleNamespace(cfg=parse({"agent": {"pause_first": setting}}), adapter=adapter, log=_Log())


def test_the_agent_decides_from_the_setting_and_the_rms_and_logs_each_answer_once() -> None:
    slurm = SuspendingAdapter(())
    ports = _ports("auto", slurm)
    assert enabled(ports) == (True, "stand-in: proctrack/linuxproc") and enabled(ports)[0]
    slurm.spares = (False, "ProctrackType=proctrack/cgroup: frozen")  # read again after a reconfigure
    assert not enabled(ports)[0] and not enabled(ports)[0]
    assert [on for on, _why in ports.log.lines] == [
        "pause-first preemption on",
        "pause-first preemption off (save-first)",
    ]
    assert enabled(_ports(True, slurm)) == (True, "[agent] pause_first = true")
    assert enabled(_ports(False, SuspendingAdapter(()))) == (False, "[agent] pause_first = false")
    pbs = SuspendingAdapter(())
    pbs.abilities = replace(pbs.abilities, cpu_handover=False)  # PBS: qsig suspend runs the checkpoint hook
    for setting in ("auto", True):
        assert not enabled(_ports(setting, pbs))[0]

    class Unreadable(SuspendingAdapter):
        def suspend_spares_detached(self) -> tuple[bool, str]:
            raise CommandError(["scontrol", "show", "config"], "Unable to contact slurm controller")

    on, why = enabled(_ports("auto", Unreadable(())))
    assert not on and "Unable to contact" in why


def test_the_drainer_reads_the_configuration_the_pilot_was_given(tmp_path: Path, monkeypatch) -> None:
    """`vjob --config FILE run` with no $VJOB_CONFIG: the drainer's order names FILE (absolute),
    and the drainer loads it, not the environment's or the site's file."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "pilot.toml"
    conf.write_text(f'data_dir = "{tmp_path / "data"}"\n[provisioning]\ndefault_uri = "test:///default"\n')
    assert config_for_drainer("pilot.toml") == str(conf) and config_for_drainer("") == ""
    monkeypatch.setenv("VJOB_CONFIG", str(tmp_path / "not-the-pilots.toml"))  # would fail to load
    pdir = PilotDir(tmp_path / "pilots", "slurm", "5")
    pdir.ensure()
    st = PilotStatus(
        job_id="5", vm="vjob-slurm-5", node="n1", uri="test:///default", state=PilotState.RUNNING, since=0.0
    )
    pdir.write_state(st.moved(PilotState.SAVING, request_id="r1"))
    order = {
        "pilot_root": str(pdir.root), "rms": "slurm", "job_id": "5", "vm": "vjob-slurm-5", "node": "n1",
        "request_id": "r1", "site": False, "real": False, "config": config_for_drainer("pilot.toml"),
    }  # fmt: skip
    assert drain(order) == 1  # no such VM on the test driver: the save fails, and says so
    answer = pdir.read_state()
    assert answer is not None and answer.request_error.startswith("save failed"), answer
    with pytest.raises(VjobError, match="must be a path"):
        drain({**order, "config": ["x"]})


def test_a_switch_for_a_job_the_view_does_not_hold_tells_nobody_to_wait() -> None:
    view = _view(node_mib=8192, victim_mib=4096, other_mib=1024, wanted_mib=3073)
    assert short_of_memory(view, "gone", ("n1",)) == {} and drain_wait_text(view, "gone", ("n1",), ("v",)) is None
