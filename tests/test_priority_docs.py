"""The worked example of docs/priority.md is what the code computes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from agent.prio_cmd import render
from plugins.slurm.config import SlurmConfig
from ubis_priority import compute
from vjob.config import PriorityConfig
from vjob.model import ClusterView

DOC = Path(__file__).resolve().parents[1] / "docs" / "priority.md"


def test_the_worked_example_prints_the_documented_table():
    example = DOC.read_text().split("## Worked example", 1)[1]
    blocks = re.findall(r"```(\w*)\n(.*?)```", example, flags=re.S)
    snapshot = next(body for lang, body in blocks if lang == "json")
    table = next(body for lang, body in blocks if lang == "" and body.startswith("JOBID"))
    view = ClusterView.from_dict(json.loads(snapshot), source="docs/priority.md")
    printed = render(compute(view, PriorityConfig()), "table", site_factor_max=SlurmConfig().site_factor_max)
    assert printed == table
