"""`vjob tune apply` changes what the agent does (issue 34 item 3): a small seeded study of the
site's policy (vjob, the default), one of its trials applied to a vjob.toml, and the agent's
own scheduling pass (`preemption.scheduling.tick.decide`, called as agent/loop.py calls it)
deciding differently on one fixed cluster state with the applied file than with the default;
bad trials and files refused with the field named, the file left as it was."""

from __future__ import annotations

import tomllib
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from preemption.scheduling.tick import Decision, decide
from simulator.tune.cli import trial_updates
from simulator.tune.toml_edit import apply_file
from tests.conftest import TESTS
from vjob import config as vconfig
from vjob.cli import main
from vjob.config import Config, PriorityWeights
from vjob.errors import ConfigError, InputError
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.rms import PriorityKnob

LUBLIN = TESTS / "data" / "traces" / "lublin_256.swf"
NOW = 1_000_000.0
KNOB = PriorityKnob(0, 1_000_000, min_step=1000)
SITE = (
    "# the operator's file\n"
    '[logging]\nlevel = "warning"  # quiet\n\n'
    "[priority]\ninteractive_cap = 0.15  # 15 % of the nodes\n\n"
    '[scheduling]\nvictims = "cost"  # kept\n'
)


def _state() -> ClusterView:
    """10 nodes held by two running batch vjobs; a 10-node batch job and a 2-node interactive
    job queued. Under the default cap (0.15 × 10 = 1.5 nodes) the interactive job is beyond
    the cap: it queues behind the batch job and preempts nobody. Both are then in vjob's batch
    tier, ranked by UBIS priority: the batch job has waited 8 days, and its saturated
    queue-time term (0.13) outweighs what the smaller job gains on the node terms (0.12)."""
    running = [
        Job(
            id=str(k + 1),
            user=f"u{k}",
            job_class=JobClass.BATCH,
            nodes=5,
            memory_mb=1000,
            os_image="os0",
            submit_time=NOW - 2000,
            walltime=36_000.0,
            state=JobState.RUNNING,
            allocated_nodes=tuple(f"n{i}" for i in range(5 * k, 5 * k + 5)),
            start_time=NOW - 1000,
        )
        for k in range(2)
    ]
    big = Job(
        id="3",
        user="u3",
        job_class=JobClass.BATCH,
        nodes=10,
        memory_mb=1000,
        os_image="os0",
        submit_time=NOW - 8 * 86_400,
        walltime=3600.0,
        state=JobState.PENDING,
    )
    inter = Job(
        id="4",
        user="u9",
        job_class=JobClass.INTERACTIVE,
        nodes=2,
        memory_mb=512,
        os_image="os0",
        submit_time=NOW - 5,
        walltime=600.0,
        state=JobState.PENDING,
    )
    nodes = tuple(Node(f"n{i}", cpus=1, memory_mb=8192, os_image="os0") for i in range(10))
    return ClusterView(now=NOW, nodes=nodes, jobs=(*running, big, inter), images=("os0",))


def _as_the_agent(cfg: Config) -> Decision:
    """agent/loop.py `Agent._decide`'s call, every running vjob checkpointable."""
    view = _state()
    return decide(view, cfg, knob=KNOB, checkpointable=["1", "2"], sleeping={}, anchors=None)


def test_applied_trial_changes_the_agents_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'tune.sqlite'}"
    site = tmp_path / "vjob.toml"
    site.write_text(SITE)
    run = [
        "tune",
        "run",
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
        "--seed",
        "3",
        "--sampler",
        "tpe",
        "--trials",
        "3",
        "--no-defaults",  # every trial away from the configured values, inside these bounds
        "--bounds",
        "interactive_cap=0.3:0.5,head_slack_s=3000:7200,max_preemptions=3:5",
        "--study",
        "site",
        "--storage",
        url,
        "--no-progress",
        "--config",
        str(site),
    ]
    assert main(run) == 0
    study = optuna.load_study(study_name="site", storage=url)
    assert study.user_attrs["spec"]["policy"] == "vjob"  # the site's [scheduling] policy, by default
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 3
    # what the vjob policy reads, and only that: the tier order, the UBIS weights (they order the
    # tiers tier_order names) and its own
    assert set(done[0].params) == {
        "tier_order",
        *PriorityWeights.model_fields,
        "interactive_cap",
        "head_slack_s",
        "max_preemptions",
        "interactive_reserve_nodes",
    }
    chosen = done[0]

    assert main(["tune", "apply", "site", "--trial", str(chosen.number), "--storage", url, "--config", str(site)]) == 0
    text = site.read_text()
    assert text.startswith('# the operator\'s file\n[logging]\nlevel = "warning"  # quiet\n')
    assert "interactive_cap = " in text and "# 15 % of the nodes" in text and 'victims = "cost"  # kept' in text
    applied = vconfig.load(site)  # the agent's loader
    assert applied.scheduling.policy == "vjob"
    assert applied.priority.interactive_cap == pytest.approx(chosen.params["interactive_cap"], rel=1e-5)
    assert applied.scheduling.head_slack_s == pytest.approx(chosen.params["head_slack_s"], rel=1e-5)
    assert applied.scheduling.max_preemptions == chosen.params["max_preemptions"]
    assert applied.scheduling.tier_order == chosen.params["tier_order"]
    assert f'tier_order = "{chosen.params["tier_order"]}"' in text

    before = _as_the_agent(Config())
    after = _as_the_agent(applied)
    # default: the interactive job is beyond the cap, queues behind the batch job, nobody preempted
    assert before.order == ("3", "4") and before.preemptions == () and before.waiting_interactive == ("4",)
    # applied: within the raised cap it goes first and checkpoints a batch vjob to start now
    assert after.order == ("4", "3")
    assert [p.job_id for p in after.preemptions] == ["4"] and len(after.preemptions[0].victims) == 1
    assert "4" in after.starts and after.waiting_interactive == ()
    assert after.rms_priorities["4"] > after.rms_priorities["3"]
    assert before.rms_priorities["4"] < before.rms_priorities["3"]

    # a trial applied under another policy than the study's is refused, the file untouched
    capsys.readouterr()
    argv = ["tune", "apply", "site", "--trial", str(chosen.number), "--storage", url, "--config", str(site)]
    assert main([*argv, "--policy", "ubis"]) != 0
    assert "--policy ubis" in capsys.readouterr().err
    assert site.read_text() == text


def test_bad_trials_and_files_are_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"parameter head_slack_s = 60\.0 is not read by policy ubis"):
        trial_updates("s", 1, {"usage": 0.3, "head_slack_s": 60.0}, "ubis")
    with pytest.raises(InputError, match="--policy vjob: trial 2 of study s was measured under policy ubis"):
        trial_updates("s", 2, {"usage": 0.3}, "ubis", "vjob")
    assert trial_updates("s", 2, {"usage": 0.3}, "ubis")[0] == ("scheduling", "policy", "ubis")

    site = tmp_path / "vjob.toml"
    site.write_text(SITE)
    with pytest.raises(ConfigError, match="head_slack_s"):  # out of range: refused by the loader's model
        apply_file(site, trial_updates("s", 1, {"head_slack_s": -5.0}, "vjob"))
    assert site.read_text() == SITE
    broken = tmp_path / "broken.toml"
    broken.write_text('[scheduling]\ninteractive_ahead = "sideways"\n')
    with pytest.raises(ConfigError, match="interactive_ahead"):  # a bad file is refused before any change
        apply_file(broken, trial_updates("s", 1, {"head_slack_s": 60.0}, "vjob"))
    assert broken.read_text() == '[scheduling]\ninteractive_ahead = "sideways"\n'
    written = apply_file(site, trial_updates("s", 1, {"head_slack_s": 60.0, "max_preemptions": 4.0}, "vjob"))
    got = tomllib.loads(written)["scheduling"]
    assert got == {"victims": "cost", "policy": "vjob", "head_slack_s": 60.0, "max_preemptions": 4}


def test_the_tier_order_is_tuned_written_and_validated(tmp_path: Path) -> None:
    """`tier_order` is a choice a vjob trial makes (the weights order nothing under "submit"),
    `apply` writes it as a string the loader's model checks, and ubis (which has no tiers)
    refuses it."""
    updates = trial_updates("s", 1, {"tier_order": "ubis-interactive", "usage": 0.3}, "vjob")
    assert ("scheduling", "tier_order", "ubis-interactive") in updates
    assert ("priority.weights", "usage", 0.3) in updates
    site = tmp_path / "vjob.toml"
    site.write_text(SITE)
    written = tomllib.loads(apply_file(site, updates))
    assert written["scheduling"]["tier_order"] == "ubis-interactive" and written["priority"]["weights"]["usage"] == 0.3
    assert vconfig.load(site).scheduling.tier_order == "ubis-interactive"
    before = site.read_text()
    with pytest.raises(ConfigError, match="tier_order"):  # not one of its values: refused, file kept
        apply_file(site, trial_updates("s", 2, {"tier_order": "sideways"}, "vjob"))
    assert site.read_text() == before
    with pytest.raises(InputError, match=r"parameter tier_order = 'ubis' is not read by policy ubis"):
        trial_updates("s", 3, {"tier_order": "ubis"}, "ubis")


def test_the_search_space_holds_the_tier_order_as_a_choice() -> None:
    from simulator.tune.config import TuneConfig
    from simulator.tune.space import space

    vjob = space(None, None, TuneConfig(), "vjob")
    assert vjob.choices == {"tier_order": ("submit", "ubis", "ubis-interactive")}
    assert "tier_order" not in vjob.bounds and vjob.names[0] == "tier_order"
    only = space("tier_order,w1", None, TuneConfig(), "vjob")
    assert only.names == ["tier_order", "usage"]
    assert space(None, None, TuneConfig(search=["tier_order"]), "vjob").bounds == {}
    with pytest.raises(InputError, match="--bounds tier_order: takes one of submit, ubis, ubis-interactive"):
        space(None, "tier_order=0:1", TuneConfig(), "vjob")
    with pytest.raises(InputError, match="--search tier_order: the ubis policy does not read it"):
        space("tier_order", None, TuneConfig(), "ubis")
    with pytest.raises(ValueError, match="'tier_orders': not a tunable parameter"):
        TuneConfig(search=["tier_orders"])
