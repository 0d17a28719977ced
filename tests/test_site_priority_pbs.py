"""On PBS a job's owner may `qalter -p` their own job: the agent puts its order back at the next
tick (issue 34 item 2, PBS).

Torque and OpenPBS cannot run here: the recorded KU Leuven `qstat -f` records play the
server (tests/pbs_standins.py). Between two ticks of one agent, the recorded output is
rewritten as the server would hold it after the first tick (each queued job's Priority the
value the agent sent), except that the owner of the last batch job raised it to 1023, the
top of the range, above the interactive jobs. The second tick must send exactly one
`qalter -p` — vjob's value again, for that job — and nothing to the others; without the
check it sent nothing and the user's job stayed first. The Priority is read from all three
recorded formats (Torque text and XML, OpenPBS JSON); a value no server holds is left out.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent.loop import Agent
from plugins.pbs.adapter import PbsAdapter
from plugins.pbs.config import PbsConfig
from plugins.pbs.held_priority import held_priorities
from tests.pbs_standins import StandIns
from tests.test_pbs_agent import BATCH, INTERACTIVE, RUNNING, _records
from vjob.config import parse
from vjob.store.db import Store


def _with_priorities(text: str, values: dict[str, int]) -> str:
    """The recorded `qstat -f` blocks with each listed job's `Priority = N` set."""
    blocks = re.split(r"\n(?=Job Id: )", text)
    out = []
    for block in blocks:
        job = block.split("\n", 1)[0].removeprefix("Job Id: ").strip()
        if job in values:
            block, n = re.subn(r"\n    Priority = -?[0-9]+\n", f"\n    Priority = {values[job]}\n", block)
            assert n == 1, f"no Priority line in the record of {job}"
        out.append(block)
    return "\n".join(out)


def test_a_users_own_qalter_p_is_set_back_at_the_next_tick(tmp_path: Path, shared_dir: Path) -> None:
    torque = shared_dir / "data" / "fixtures" / "torque"
    standins = StandIns(tmp_path / "bin")
    recorded = _records((torque / "vsc_qstat_full.txt").read_text(), [*INTERACTIVE, *BATCH, RUNNING])
    qstat = tmp_path / "qstat.txt"
    qstat.write_text(recorded)
    standins.script("qstat", stdout_file=qstat)
    standins.script("pbsnodes", stdout_file=torque / "vsc_pbsnodes_thinking.txt")
    config = parse({"data_dir": str(tmp_path / "data"), "agent": {"rms": "pbs"}})
    Store(config.database_url).upgrade()
    adapter = PbsAdapter(PbsConfig(dialect="torque", torque_format="text", bin_dir=str(standins.dir)))
    agent = Agent(config, adapter, rms="pbs")

    first = agent.tick()
    assert not first.errors, first.errors
    sent = {c[3]: int(c[2]) for c in standins.calls() if c[0] == "qalter"}
    assert set(sent) == set(INTERACTIVE + BATCH)
    assert held_priorities(recorded, source="recorded") == dict.fromkeys([*INTERACTIVE, *BATCH, RUNNING], 0)

    cheat = BATCH[-1]
    assert sent[cheat] < min(sent[j] for j in INTERACTIVE)  # vjob put it below the interactive jobs
    qstat.write_text(_with_priorities(recorded, sent | {cheat: 1023}))  # the server after the tick; the user's qalter
    before = len(standins.calls())
    second = agent.tick()
    assert not second.errors, second.errors
    again = [c for c in standins.calls()[before:] if c[0] == "qalter"]
    assert again == [["qalter", "-p", str(sent[cheat]), cheat]]
    assert adapter.held[cheat] == 1023  # what the server held when the tick looked

    qstat.write_text(_with_priorities(recorded, sent))  # the server after the second tick
    before = len(standins.calls())
    assert not agent.tick().errors
    assert [c for c in standins.calls()[before:] if c[0] == "qalter"] == []  # nothing changed: nothing sent


def test_the_held_priority_is_read_from_every_recorded_format(shared_dir: Path) -> None:
    fixtures = shared_dir / "data" / "fixtures"
    openpbs = fixtures / "openpbs" / "metacentrum_pbspro19_qstat_xf_F_json.json"
    json_out = held_priorities(openpbs.read_text(), source="j")
    xml_out = held_priorities((fixtures / "torque" / "fyrd_qstat_x.xml").read_text(), source="x")
    text = (fixtures / "torque" / "vsc_qstat_full.txt").read_text()
    assert json_out == {"12860476.meta-pbs.metacentrum.cz": 0}
    assert len(xml_out) == 6 and set(xml_out.values()) == {0}
    assert len(held_priorities(text, source="t")) == 121
    # a value no PBS holds (out of range, not a number) is left out: vjob's value is sent again
    one = _records(text, [BATCH[0], BATCH[1]])
    odd = one.replace("    Priority = 0\n", "    Priority = 99999\n", 1)
    assert held_priorities(odd, source="t") == {BATCH[1]: 0}
    odd = one.replace("    Priority = 0\n", "    Priority = 1;reboot\n", 1)
    assert held_priorities(odd, source="t") == {BATCH[1]: 0}
