"""`vjob COMMAND --help` loads argparse-level code only (issue 36: `agent`, `status` and `prio
--help` spent about 1.6 s of CPU importing numba and SQLAlchemy; `run`, `simulate`, `trace`,
`node-service` and `besteffort` 0.7-0.9 s importing their whole command). The time itself is measured by
bench/cli_help.py; this checks the cause, which does not depend on the machine's load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numba", "sqlalchemy", "alembic", "pydantic", "numpy", "structlog")

PROBE = """\
import sys
from vjob.cli import main
try:
    main([sys.argv[1], "--help"])
except SystemExit:
    pass
print(" ".join(sorted(m for m in sys.argv[2:] if m in sys.modules)), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "command",
    ["agent", "status", "prio", "run", "simulate", "trace", "node-service", "besteffort", "oar", "vm", "image"],
)
def test_help_imports_no_heavy_module(command: str) -> None:
    res = subprocess.run(
        [sys.executable, "-c", PROBE, command, *HEAVY], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert f"vjob {command}" in res.stdout  # the help was printed
    assert res.stderr.strip() == "", f"vjob {command} --help imported: {res.stderr}"


def test_the_probe_sees_a_heavy_import() -> None:
    """The check itself: a command that does import numba when it runs is caught."""
    code = "import sys\nimport numba\nprint(' '.join(m for m in sys.argv[1:] if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code, *HEAVY], capture_output=True, text=True, timeout=60)
    assert "numba" in res.stdout.split()
