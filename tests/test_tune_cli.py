"""`vjob tune run | worker | show | apply` end to end on a few hundred jobs (SQLite and
PostgreSQL), bad input, a worker killed mid-trial, and the configuration file it writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from simulator.tune.config import POLICY_PARAMS
from tests.conftest import TESTS
from vjob.cli import main
from vjob.config import parse

LUBLIN = TESTS / "data" / "traces" / "lublin_256.swf"
SMALL = [
    "--trace",
    str(LUBLIN),
    "--nodes",
    "256",
    "--max-jobs",
    "400",
    "--interactive-frac",
    "0.2",
    "--interactive-mean-size",
    "30",
    "--no-progress",
]


def _run(*argv: str) -> int:
    return main(["tune", *argv])


def test_small_study_end_to_end(db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ubis = ["--policy", "ubis", "--sampler", "tpe"]  # the weights decide under ubis (the site runs vjob)
    assert _run("run", *SMALL, "--trials", "4", "--study", "small", "--storage", db_url, *ubis) == 0
    study = optuna.load_study(study_name="small", storage=db_url)
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 4
    assert done[0].params["usage"] == pytest.approx(0.07)  # trial 0: the configured (paper) weights
    assert len({tuple(sorted(t.params.items())) for t in done}) == 4
    # resumable: the same study with a larger target runs only the missing trials
    assert _run("run", *SMALL, "--trials", "6", "--study", "small", "--storage", db_url, *ubis) == 0
    assert len(optuna.load_study(study_name="small", storage=db_url).get_trials(states=(TrialState.COMPLETE,))) == 6

    capsys.readouterr()
    png = tmp_path / "front.png"
    assert _run("show", "small", "--storage", db_url, "--json", "--png", str(png)) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in doc["rows"]]
    assert names[-3:] == ["defaults", "mms", "ubis"] and len(names) >= 4
    for row in doc["rows"]:
        assert len(row["test"]) == 2 and all(v > 0 for v in row["test"])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    cached = optuna.load_study(study_name="small", storage=db_url).user_attrs["test"]  # kept for the next show
    assert set(cached) == {str(r["trial"]) for r in doc["rows"] if r["trial"] is not None} | {"defaults", "mms", "ubis"}
    # the reference points admit interactive jobs at the configured cap; a trial's low cap may admit none
    assert all(r["admitted_wait"] >= 0 for r in doc["rows"] if r["trial"] is None)
    assert all(r["admitted_wait"] is None or r["admitted_wait"] >= 0 for r in doc["rows"])

    front = [r["trial"] for r in doc["rows"] if r["trial"] is not None]
    cfg = tmp_path / "vjob.toml"
    cfg.write_text('# site file\n[logging]\nlevel = "warning"  # quiet\n\n[priority]\ninteractive_cap = 0.15\n')
    assert _run("apply", "small", "--trial", str(front[0]), "--storage", db_url, "--config", str(cfg)) == 0
    text = cfg.read_text()
    assert text.startswith('# site file\n[logging]\nlevel = "warning"  # quiet\n')
    assert parse(tomllib.loads(text)).scheduling.policy == "ubis"  # the policy the weights were tuned for
    written = parse(tomllib.loads(text)).priority
    params = study.trials[front[0]].params
    assert written.weights.usage == pytest.approx(params["usage"], rel=1e-5)
    assert written.interactive_cap == pytest.approx(params["interactive_cap"], rel=1e-5)
    assert main(["config", "check", str(cfg)]) == 0


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 't.sqlite'}"
    assert _run("run", *SMALL, "--study", "x", "--storage", url, "--objectives", "interactive_response,speed") == 2
    assert "unknown objective 'speed'" in capsys.readouterr().err
    empty = tmp_path / "empty.swf"
    empty.write_text("; an SWF header and no job\n")
    argv = ["--trace", str(empty), "--nodes", "64", "--study", "x", "--storage", url]
    assert _run("run", *argv) == 2
    assert "no jobs in the trace" in capsys.readouterr().err
    assert _run("run", *SMALL, "--study", "x", "--storage", url, "--bounds", "w3=0.4:0.1") == 2
    assert "w3" not in (err := capsys.readouterr().err) and "os_available=0.4:0.1: bounds inverted" in err
    cfg = tmp_path / "vjob.toml"
    cfg.write_text("[tune.bounds]\nqueue_time = [0.3, 0.1]\n")
    assert main(["--config", str(cfg), "tune", "run", *SMALL, "--study", "x", "--storage", url]) == 2
    assert "queue_time = [0.3, 0.1]: bounds inverted" in capsys.readouterr().err
    assert _run("show", "nosuch", "--storage", url) == 2
    assert "study 'nosuch': not in" in capsys.readouterr().err
    assert not optuna.get_all_study_summaries(url)  # nothing was created by the refused runs


def test_worker_killed_mid_trial_leaves_it_failed_and_the_study_usable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.sqlite'}"
    argv = [
        sys.executable,
        "-m",
        "vjob.cli",
        "tune",
        "run",
        "--trace",
        str(LUBLIN),
        "--nodes",
        "256",
        "--max-jobs",
        "4000",
        "--interactive-frac",
        "0.2",
        "--interactive-mean-size",
        "30",
        "--trials",
        "3",
        "--study",
        "k",
        "--storage",
        url,
        "--heartbeat-s",
        "1",
        "--no-progress",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        running: list[int] = []
        searched = len(POLICY_PARAMS["vjob"])  # the site's policy, tuned by default
        while time.monotonic() < deadline and not running:
            time.sleep(0.2)
            try:
                trials = optuna.load_study(study_name="k", storage=url).trials
            except KeyError:
                continue
            # a trial holding every searched parameter (killed mid-suggestion, its retry could not
            # replay the parameters it never had)
            running = [t.number for t in trials if t.state == TrialState.RUNNING and len(t.params) == searched]
        assert running, "the worker never started a trial"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed = running[0]
    time.sleep(3.5)  # past the grace period (2 heartbeats, at least heartbeat + 2 s)
    assert main(["tune", "worker", "--study", "k", "--storage", url, "--heartbeat-s", "1", "--no-progress"]) == 0
    trials = optuna.load_study(study_name="k", storage=url).trials
    assert trials[killed].state == TrialState.FAIL
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 3
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
    assert retried and retried[0].params == trials[killed].params


def test_simulate_sweep_varies_the_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grid"
    argv = [
        "simulate",
        "--sweep",
        "--trace",
        str(LUBLIN),
        "--nodes",
        "256",
        "--max-jobs",
        "400",
        "--policy",
        "ubis",
        "--interactive-frac",
        "0.2",
        "--interactive-mean-size",
        "30",
        "--weight",
        "w3=0.05,0.3",
        "--weight",
        "interactive=0.3",
        "--no-plots",
        "--workers",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    rows = json.loads((out / "sweep_mean.json").read_text())
    assert sorted(r["weights"] for r in rows) == ["w3=0.05 w7=0.3", "w3=0.3 w7=0.3"]  # two cells, not averaged
    docs = [json.loads(p.read_text()) for p in sorted(out.glob("*/summary.json"))]
    assert len(docs) == 2 and docs[0]["makespan_s"] != docs[1]["makespan_s"]  # w3 changes the replay
    assert main([*argv[:-2], "--out", str(tmp_path / "bad"), "--weight", "w9=0.1"]) == 2
    assert "weight 'w9': not a UBIS weight" in capsys.readouterr().err


def test_help_does_not_import_optuna() -> None:
    code = (
        "import sys; from vjob.cli import main\n"
        "for argv in (['--help'], ['tune', '--help'], ['tune', 'run', '--help']):\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "print('optuna' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_apply_edits_only_its_lines(tmp_path: Path) -> None:
    from simulator.tune.toml_edit import apply_file
    from vjob.errors import ConfigError, InputError

    cfg = tmp_path / "vjob.toml"
    original = (
        "# the site's file\n[priority]\nweights.usage = 0.07   # w1, dotted\ninteractive_cap = 0.15\n\n"
        '[scheduling]\npolicy = "ubis"  # kept\n\n[agent]\ninterval_s = 5.0\n'
    )
    cfg.write_text(original)
    cfg.chmod(0o640)
    updates = [
        ("priority.weights", "usage", 0.25),
        ("priority.weights", "interactive", 0.4),
        ("priority", "interactive_cap", 0.3),
        ("scheduling", "max_preemptions", 3),
    ]
    text = apply_file(cfg, updates)
    assert "weights.usage = 0.25   # w1, dotted\n" in text and 'policy = "ubis"  # kept\n' in text
    assert "weights.usage = 0.25   # w1, dotted\nweights.interactive = 0.4\n" in text  # written like its siblings
    assert text.endswith("[agent]\ninterval_s = 5.0\n")
    assert '[scheduling]\npolicy = "ubis"  # kept\nmax_preemptions = 3\n' in text
    got = parse(tomllib.loads(cfg.read_text()))
    assert (got.priority.weights.usage, got.priority.weights.interactive) == (0.25, 0.4)
    assert got.scheduling.max_preemptions == 3 and got.agent.interval_s == 5.0
    assert cfg.stat().st_mode & 0o777 == 0o640
    inline = tmp_path / "inline.toml"
    inline.write_text("[priority]\nweights = { usage = 0.07 }\n")
    with pytest.raises(InputError, match="inline table on line 2"):
        apply_file(inline, [("priority.weights", "usage", 0.2)])
    broken = tmp_path / "broken.toml"
    broken.write_text("[priority]\nweigths = 1\n")
    with pytest.raises(ConfigError, match="weigths"):
        apply_file(broken, [("priority.weights", "usage", 0.2)])
    assert broken.read_text() == "[priority]\nweigths = 1\n"
