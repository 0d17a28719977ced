"""`vjob tune run --submit slurm` refuses a SQLite study (issue 36 item 5): the array's tasks run
on many nodes and would share one SQLite file, which Optuna advises against. The refusal comes
before the study is created or sbatch is run, as the user who runs the command."""

from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path

import pytest

from simulator.tune.submit import require_server_storage
from tests.as_user import as_nobody
from tests.conftest import TESTS
from vjob.cli import main
from vjob.errors import UsageError

LUBLIN = TESTS / "data" / "traces" / "lublin_256.swf"
ARGS = ["tune", "run", "--trace", str(LUBLIN), "--nodes", "256", "--max-jobs", "200", "--study", "s1"]


def test_the_rule() -> None:
    for url in ("sqlite:////var/lib/vjob/tune.sqlite", "sqlite:///tune.sqlite", "sqlite+pysqlite:///x.db"):
        with pytest.raises(UsageError, match=r"SQLite file.*--storage a database server.*--submit local"):
            require_server_storage(url)
    require_server_storage("postgresql+psycopg://tune:pw@db/tune")  # a server: accepted


def test_a_user_is_told_before_anything_is_made() -> None:
    """As `nobody`: the default study (SQLite under the data directory) and an explicit SQLite
    --storage are both refused with exit 2 and one line naming the storage; no study file."""
    with tempfile.TemporaryDirectory(prefix="vjob-tune-submit-") as where:
        base = Path(where)
        nobody = pwd.getpwnam("nobody")
        os.chown(base, nobody.pw_uid, nobody.pw_gid)  # the user's own directory, nobody else's
        base.chmod(0o700)
        data, given = base / "data", base / "given.sqlite"

        def work() -> int:
            os.environ["VJOB_DATA_DIR"] = str(data)
            os.environ.pop("VJOB_TUNE_STORAGE", None)
            os.environ.pop("VJOB_CONFIG", None)
            first = main([*ARGS, "--submit", "slurm"])
            second = main([*ARGS, "--submit", "slurm", "--storage", f"sqlite:///{given}"])
            return 10 * first + second

        # Once here first: the modules it imports are then loaded (nobody cannot read this venv).
        assert main([*ARGS, "--submit", "slurm", "--storage", f"sqlite:///{base / 'warm.sqlite'}"]) == 2
        done = as_nobody(work, cwd=base)
        assert done.returncode == 22, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 2 and all("--submit slurm: the study storage sqlite:///" in ln for ln in lines)
        assert str(data / "tune.sqlite") in lines[0] and str(given) in lines[1]
        assert not (data / "tune.sqlite").exists() and not given.exists()
