"""`vjob trace generate|info` and `vjob simulate` end to end (small traces, real files)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from vjob.cli import main


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "small.swf.gz"
    assert (
        main(["trace", "generate", "--nodes", "64", "--jobs", "300", "--seed", "4", "--load", "0.8", "-o", str(path)])
        == 0
    )
    return path


def test_trace_info_json(trace: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["trace", "info", str(trace), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["jobs"] == 300 and info["machine_nodes"] == 64
    assert info["offered_load"] == pytest.approx(0.8, rel=0.01)


def test_simulate_writes_summary_csvs_and_plots(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "run"
    argv = ["simulate", "--trace", str(trace), "--nodes", "64", "--policy", "ubis", "--interactive-frac", "0.2"]
    argv += ["--interactive-mean-size", "8", "--interactive-cap", "0.15", "--out", str(out)]
    assert main(argv) == 0
    assert "utilisation" in capsys.readouterr().out
    doc = json.loads((out / "summary.json").read_text())
    for key in (
        "policy",
        "nodes",
        "jobs",
        "makespan_s",
        "throughput_jobs_per_hour",
        "utilization",
        "preemptions",
        "checkpoint_bytes",
        "wasted_node_seconds",
        "os_swaps",
    ):
        assert key in doc, key
    assert doc["policy"] == "ubis" and doc["jobs"] == 375 and 0 < doc["utilization"] <= 1
    for cls in ("interactive", "batch"):
        stats = doc["by_class"][cls]
        assert set(stats) >= {
            "count",
            "mean_wait_s",
            "median_wait_s",
            "p95_wait_s",
            "mean_response_s",
            "mean_bounded_slowdown",
        }
    assert doc["by_class"]["interactive"]["count"] == 75
    with (out / "jobs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 375
    assert list(rows[0])[:9] == [
        "job_id",
        "class",
        "submit",
        "first_start",
        "end",
        "nodes",
        "runtime",
        "preemptions",
        "os",
    ]
    with (out / "segments.csv").open() as fh:
        segments = list(csv.DictReader(fh))
    assert len(segments) == 375 + doc["preemptions"]
    for png in ("utilization.png", "throughput.png", "response_cdf.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_sweep_runs_the_grid_and_draws_comparisons(trace: Path, tmp_path: Path):
    out = tmp_path / "sweep"
    argv = ["simulate", "--sweep", "--trace", str(trace), "--nodes", "64", "--policy", "mms,ubis"]
    argv += ["--interactive-frac", "0.2", "--interactive-mean-size", "4,8", "--interactive-cap", "0.15"]
    argv += ["--no-plots", "--workers", "2", "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads((out / "sweep.json").read_text())
    assert len(rows) == 4
    assert {(r["policy"], r["interactive_mean_size"]) for r in rows} == {
        ("mms", 4),
        ("mms", 8),
        ("ubis", 4),
        ("ubis", 8),
    }
    assert (out / "compare_utilization.png").exists() and (out / "compare_throughput.png").exists()
    assert (out / "mms_f0.2_s4_c0.15" / "summary.json").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--interactive-frac", "1.5"], "--interactive-frac = 1.5: must be in 0..0.99"),
        (["--interactive-cap", "abc"], "--interactive-cap = 'abc': not a number"),
        (["--policy", "sjf"], "--policy = 'sjf': must be one of vjob, fcfs-easy, mms, mms-block, ubis"),
        (["--interactive-mean-size", "10,20"], "add --sweep"),
    ],
)
def test_bad_options_exit_2_naming_the_option(trace, tmp_path, capsys, extra, message):
    argv = ["simulate", "--trace", str(trace), "--nodes", "64", "--out", str(tmp_path / "x"), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_missing_trace_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["trace", "info", str(tmp_path / "none.swf")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_sweep_with_seeds_reports_mean_and_interval_per_cell(trace: Path, tmp_path: Path):
    out = tmp_path / "seeds"
    argv = ["simulate", "--sweep", "--trace", str(trace), "--nodes", "64", "--policy", "mms,vjob"]
    argv += ["--interactive-frac", "0.2", "--interactive-mean-size", "8", "--interactive-cap", "0.15"]
    argv += ["--seeds", "1,2,3", "--no-plots", "--workers", "2", "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads((out / "sweep.json").read_text())
    assert sorted((r["policy"], r["seed"]) for r in rows) == [(p, s) for p in ("mms", "vjob") for s in (1, 2, 3)]
    assert all("batch_large_count" in r and "batch_small_mean_response_s" in r for r in rows)
    means = {m["policy"]: m for m in json.loads((out / "sweep_mean.json").read_text())}
    assert set(means) == {"mms", "vjob"} and means["vjob"]["seeds"] == 3
    waits = [r["interactive_mean_wait_s"] for r in rows if r["policy"] == "vjob"]
    assert means["vjob"]["interactive_mean_wait_s"] == pytest.approx(sum(waits) / 3)
    assert means["vjob"]["interactive_mean_wait_s_ci95"] >= 0
    assert (out / "vjob_f0.2_s8_c0.15_seed2" / "summary.json").exists()


def test_bad_seeds_are_refused(trace: Path, tmp_path: Path, capsys):
    argv = ["simulate", "--trace", str(trace), "--nodes", "64", "--seeds", "1,x\n", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--seeds = 'x\\n': not an integer" in capsys.readouterr().err
