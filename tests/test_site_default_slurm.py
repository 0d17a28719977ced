"""Every job of a partition is a vjob (issue 33, item 6), on the real Slurm dev cluster.

The operator marks a partition in `[slurm] vjob_partitions`; vjob writes vjob-partitions.conf
beside job_submit.lua (plugins.slurm.site_default) and the Lua wraps every batch job Slurm puts
there, with no `#VJOB` line in the script. An ordinary user submits with a plain `sbatch` (held,
so no VM boots): what Slurm stores as the job's script (`scontrol write batch_script`) is the
wrapper holding the user's script byte for byte, and its admin comment names the image. A job
given no partition lands in Slurm's default one, which the Lua finds in part_list. `#VJOB off`
leaves the script as it is where `allow_opt_out` is set, and is refused, saying why, where not.

The dev cluster has one partition (`main`, the default), and a second one would show every
node twice to the adapters' tests; "another partition" is therefore the same job on `main`
while the operator marks only a partition of another name: untouched.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from devkit.devcluster import DevCluster
from plugins.slurm.adapter import make_adapter
from plugins.slurm.config import SlurmConfig
from plugins.slurm.images import parse_tag
from plugins.slurm.site_default import DEFAULTS_NAME, defaults_file, render, sync_partition_defaults
from tests.bench_scripts import load
from tests.test_realjob_slurm import USER, _user, wrapped_cluster  # noqa: F401 - the fixture, shared
from vjob.config import parse

SCRIPT = "#!/bin/bash\n#SBATCH -J plain\necho \"it's $HOME `id`\"\ncat <<'VJOB_SCRIPT_END'\nx\nVJOB_SCRIPT_END\n"
"""An unchanged user script: no #VJOB line, and a line that was the old wrapper's delimiter."""
MARK = "# vjob wrapper (job_submit.lua)"


# -- the file vjob writes (no cluster) ---------------------------------------------------------


def test_the_partitions_are_rendered_for_the_lua_and_written_only_when_needed(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    assert defaults_file(str(conf)) == tmp_path / DEFAULTS_NAME
    assert sync_partition_defaults(SlurmConfig(conf=str(conf))) is None
    assert not (tmp_path / DEFAULTS_NAME).exists(), "no partition marked: no file"
    cfg = SlurmConfig(conf=str(conf), vjob_partitions={"batch": "debian12", "long": "site"}, allow_opt_out=True)
    assert sync_partition_defaults(cfg) == tmp_path / DEFAULTS_NAME
    text = (tmp_path / DEFAULTS_NAME).read_text()
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == ["allow_opt_out=yes", "batch debian12", "long site"]
    assert (tmp_path / DEFAULTS_NAME).stat().st_mode & 0o777 == 0o644
    assert sync_partition_defaults(cfg) is None, "unchanged: not rewritten"
    assert sync_partition_defaults(SlurmConfig(conf=str(conf))) is not None, "unmarked: the old file is corrected"
    assert [x for x in (tmp_path / DEFAULTS_NAME).read_text().splitlines() if not x.startswith("#")] == [
        "allow_opt_out=no"
    ]
    assert render({}, False).endswith("allow_opt_out=no\n")


@pytest.mark.parametrize(
    ("partitions", "said"),
    [({"bad name": "debian12"}, "partition 'bad name'"), ({"batch": "../etc"}, "image '../etc'")],
)
def test_a_malformed_partition_or_image_is_refused_naming_it(partitions: dict[str, str], said: str) -> None:
    with pytest.raises(ValidationError) as err:
        SlurmConfig(vjob_partitions=partitions)
    assert said in str(err.value)


def test_an_unwritable_directory_is_logged_not_raised(tmp_path: Path) -> None:
    """The agent still starts when it cannot write the file (e.g. /etc/slurm read-only to it)."""
    missing = tmp_path / "no-such-dir" / "slurm.conf"
    assert sync_partition_defaults(SlurmConfig(conf=str(missing), vjob_partitions={"b": "debian12"})) is None


# -- on the dev cluster --------------------------------------------------------------------------


@pytest.fixture
def marked(wrapped_cluster: DevCluster) -> Iterator[DevCluster]:  # noqa: F811 - the shared fixture
    """The cluster with debian12 listed; the test marks partitions through `mark`; no file after."""
    path = wrapped_cluster.etc / DEFAULTS_NAME
    try:
        yield wrapped_cluster
    finally:
        path.unlink(missing_ok=True)


def mark(cluster: DevCluster, partitions: dict[str, str], allow_opt_out: bool) -> None:
    """What the agent does at its start, then wait out job_submit.lua's 2 s cache."""
    cfg = SlurmConfig(conf=str(cluster.conf), vjob_partitions=partitions, allow_opt_out=allow_opt_out)
    sync_partition_defaults(cfg)
    time.sleep(2.5)


def user_sbatch(cluster: DevCluster, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`sbatch --hold` by the ordinary user, the script on stdin, in /tmp."""
    _user()
    env = [f"{k}={v}" for k, v in cluster.env.items()] + ["PATH=/usr/bin:/bin"]
    return subprocess.run(
        ["runuser", "-u", USER, "--", "env", "-i", *env, "sbatch", "--parsable", "--hold", "-o", "/dev/null", *args],
        input=script,
        cwd="/tmp",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stored(cluster: DevCluster, job: str) -> tuple[str, str]:
    """(the script Slurm will run, the job's admin comment), then the job is cancelled."""
    env = {**os.environ, **cluster.env}
    try:
        out = Path(tempfile.mkdtemp()) / "script"
        subprocess.run(
            ["scontrol", "write", "batch_script", job, str(out)], env=env, check=True, capture_output=True, timeout=60
        )
        shown = subprocess.run(
            ["scontrol", "show", "job", job], env=env, check=True, capture_output=True, text=True, timeout=60
        ).stdout
        comment = re.search(r"AdminComment=(\S*)", shown)
        return out.read_text(), comment.group(1) if comment else ""
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30, check=False, capture_output=True)


def accepted(cluster: DevCluster, script: str, *args: str) -> tuple[str, str]:
    res = user_sbatch(cluster, script, *args)
    assert res.returncode == 0, res.stderr
    return stored(cluster, res.stdout.strip().split(";")[0])


def literal_body(wrapper: str) -> str:
    """The user's script inside the wrapper's quoted here-document."""
    _, _, rest = wrapper.partition("<<'")
    delim, _, rest = rest.partition("'\n")
    assert re.fullmatch(r"VJOB_SCRIPT_END_[0-9a-f]{12}", delim), delim
    assert rest.endswith(delim + "\n")
    return rest[: -len(delim) - 1]


@pytest.mark.slurm
def test_a_plain_sbatch_to_the_marked_default_partition_is_wrapped(marked: DevCluster) -> None:
    """No -p: Slurm's default partition, `main`; and -p main, said outright."""
    mark(marked, {"main": "debian12"}, allow_opt_out=False)
    for args in ((), ("-p", "main")):
        wrapper, comment = accepted(marked, SCRIPT, *args)
        assert wrapper.startswith("#!/bin/sh\n" + MARK), wrapper[:300]
        assert 'exec vjob run --os debian12 --script - -- "$@" <<' in wrapper
        assert literal_body(wrapper) == SCRIPT
        assert parse_tag(comment) == ("batch", "debian12"), comment


@pytest.mark.slurm
def test_opt_out_leaves_the_script_alone_where_allowed_and_is_refused_where_not(marked: DevCluster) -> None:
    script = SCRIPT.replace("#SBATCH -J plain\n", "#SBATCH -J plain\n#VJOB off\n")
    mark(marked, {"main": "debian12"}, allow_opt_out=True)
    wrapper, comment = accepted(marked, script)
    assert wrapper == script and parse_tag(comment) == ("batch", ""), comment
    both = user_sbatch(marked, script.replace("#VJOB off\n", "#VJOB off\n#VJOB os=debian12\n"))
    assert both.returncode != 0 and "says both '#VJOB off' and os=debian12: give one" in both.stderr, both.stderr
    mark(marked, {"main": "debian12"}, allow_opt_out=False)
    refused = user_sbatch(marked, script)
    assert refused.returncode != 0, refused.stdout
    assert (
        "every job of partition main runs in a VM (image debian12) and this site does not let a job opt out"
        in refused.stderr
    ), refused.stderr


@pytest.mark.slurm
def test_a_job_outside_the_marked_partitions_is_untouched(marked: DevCluster) -> None:
    mark(marked, {"batch": "debian12"}, allow_opt_out=False)
    for args in ((), ("-p", "main")):
        wrapper, comment = accepted(marked, SCRIPT, *args)
        assert wrapper == SCRIPT and parse_tag(comment) == ("batch", ""), comment


@pytest.mark.slurm
def test_a_default_image_missing_from_the_list_refuses_with_the_operator_named(marked: DevCluster) -> None:
    mark(marked, {"main": "nosuchimage"}, allow_opt_out=False)
    res = user_sbatch(marked, SCRIPT)
    assert res.returncode != 0, res.stdout
    assert "unknown OS image 'nosuchimage' (the partition's default: [slurm] vjob_partitions)" in res.stderr, res.stderr


@pytest.mark.slurm
def test_wrapping_a_4_mib_script_costs_a_submission_little(marked: DevCluster) -> None:
    """bench/submit_wrap.py's measure (which also checks both stored scripts), 3 rounds. Before,
    pure-Lua base64 took slurmctld ~1.4 s per 4 MiB (0.15 s per MiB here at load 1, measured by
    the same bench on its base64 path); the literal here-document is a copy. The bound is loose
    (a loaded machine slows both submissions alike): wrapped within 0.5 s of plain."""
    bench = load("submit_wrap")
    got = bench.measure(marked, bench.make_script(4095 << 10), 3)
    assert got["wrapped_s"] - got["plain_s"] < 0.5, got


def test_the_agent_writes_the_file_when_it_makes_its_adapter(tmp_path: Path) -> None:
    """`vjob agent --rms slurm` builds its adapter with make_adapter: that is when the file is
    brought in line with [slurm] (restarting the agent applies a changed configuration)."""
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "slurm": {"conf": str(tmp_path / "slurm.conf"), "vjob_partitions": {"batch": "debian12"}},
        }
    )
    make_adapter(cfg)
    assert "batch debian12" in (tmp_path / DEFAULTS_NAME).read_text().splitlines()
