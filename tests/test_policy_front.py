"""docs/ubis-reproduction/policy_front.py, the table of issue 34 item 5: a cell counts only
when the candidate's mean admitted wait is lower and batch response, large-batch response and
utilisation are no worse than today's (means over the seeds both ran), strictly, or within
the stated tolerance in the looser reading; a cell without admitted jobs never counts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "ubis-reproduction" / "policy_front.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("policy_front", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(policy: str, label: str, cell: tuple[float, float, float], seed: int, **fig: float | None) -> str:
    admitted = fig.get("admitted", 1000.0)
    return json.dumps(
        {
            "frac": cell[0],
            "size": cell[1],
            "cap": cell[2],
            "seed": seed,
            "policy": policy,
            "label": label,
            "cap_mode": "preempt",
            "utilization": fig.get("util", 0.75),
            "batch_mean_response_s": fig.get("batch", 20_000.0),
            "batch_by_size": {"large": {"mean_response_s": fig.get("large", 80_000.0)}},
            "interactive_mean_wait_s": 3000.0,
            "interactive_within_cap_mean_wait_s": None if admitted is None else 2000.0,
            "interactive_admitted": {
                "count": 0 if admitted is None else 10,
                "mean_wait_s": admitted,
                "within_60s": None if admitted is None else 0.8,
            },
            "preemptions": 5,
        }
    )


A, B, C, D, E = (0.1, 50.0, 0.15), (0.2, 50.0, 0.15), (0.3, 50.0, 0.15), (0.1, 100.0, 0.05), (0.2, 100.0, 0.15)


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    today = [_line("mms", "mms", c, s, admitted=None, batch=19_000.0) for c in (A, B, C, D, E) for s in (1, 2)]
    today += [_line("vjob", "vjob", c, s) for c in (A, B, C, E) for s in (1, 2)]
    today += [_line("vjob", "vjob", D, s, admitted=None) for s in (1, 2)]
    cand = [
        # A: lower wait, the rest equal on average (one seed better, one worse): met both ways
        _line("vjob", "x", A, 1, admitted=900.0, batch=19_900.0),
        _line("vjob", "x", A, 2, admitted=900.0, batch=20_100.0),
        # B: batch 0.5 % longer: only within the tolerance
        *(_line("vjob", "x", B, s, admitted=900.0, batch=20_100.0) for s in (1, 2)),
        # C: utilisation 0.002 lower: neither
        *(_line("vjob", "x", C, s, admitted=900.0, util=0.748) for s in (1, 2)),
        # D: nobody admitted: never counts, whatever else
        *(_line("vjob", "x", D, s, admitted=None, batch=10_000.0) for s in (1, 2)),
        # E: equal wait is not lower; seed 3 (not in today's file) is left out of the means
        *(_line("vjob", "x", E, s) for s in (1, 2)),
        _line("vjob", "x", E, 3, admitted=10.0),
    ]
    (tmp_path / "today.jsonl").write_text("\n".join(today) + "\n")
    (tmp_path / "cand.jsonl").write_text("\n".join(cand) + "\n")
    return tmp_path / "today.jsonl", tmp_path / "cand.jsonl"


def test_cells_count_strictly_or_within_the_tolerance(files: tuple[Path, Path]) -> None:
    pf = _module()
    base = pf.load(files[0])
    rows = {r["cell"]: r for r in pf.compare(base["vjob"], base["mms"], pf.load(files[1], "vjob")["x"])}
    assert (rows[A]["strict"], rows[A]["loose"]) == (True, True)
    assert (rows[B]["strict"], rows[B]["loose"]) == (False, True)
    assert (rows[C]["strict"], rows[C]["loose"]) == (False, False)
    assert rows[D]["strict"] is None and rows[D]["loose"] is None
    assert (rows[E]["strict"], rows[E]["loose"]) == (False, False) and rows[E]["seeds"] == [1, 2]
    assert rows[B]["cand"]["batch"] / rows[B]["mms"]["batch"] == pytest.approx(20_100 / 19_000)


def test_the_script_ends_with_one_line_of_json(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    pf = _module()
    argv = ["policy_front.py", "--today", str(files[0]), "--candidates", str(files[1]), "--summary", "--table", "x"]
    old, sys.argv = sys.argv, argv
    try:
        pf.main()
    finally:
        sys.argv = old
    out = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(out[-1])["candidates"]["x"]
    assert doc["cells_with_admitted_jobs"] == 4 and doc["met_strict"] == 1 and doc["met_within_1pct"] == 2
    assert doc["admitted_wait_mean_s"] == [1000, 925]
    assert any(line.startswith("| 10%/50/15% | 1,000 / 900 |") and line.endswith("| yes | yes |") for line in out)
