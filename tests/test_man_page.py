"""vjob(1): written from the parsers by `vjob deploy install man-page` (issue 36 item 4) — every
command in it, its examples, and the sections an operator looks for; groff renders it without
a warning."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from plugins import deploy
from vjob.cli import build_full_parser
from vjob.cli.man_page import render

REPO = Path(__file__).resolve().parents[1]


def _page() -> str:
    return render(build_full_parser(), "1.0")


def test_every_command_and_the_operators_sections_are_in_it() -> None:
    page = _page()
    parser = build_full_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in sub.choices:
        assert f'.SS "vjob {name}"' in page, name
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS", "EXIT STATUS", "ENVIRONMENT", "FILES"):
        assert f".SH {section}\n" in page, section
    assert "vjob db upgrade" in page and page.count("examples:") >= 10
    assert page.count(".B \\-\\-config") == 1  # a global option described once, not under each command


def test_groff_renders_it_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "vjob.1"
    path.write_text(_page())
    r = subprocess.run(["groff", "-man", "-ww", "-z", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_roff_requests_in_help_text_are_text() -> None:
    from vjob.cli.man_page import _text

    assert _text(".rm x\n'br\nplain \\ back") == "\\&.rm x\n\\&'br\nplain \\e back"
    assert _text("→") == "\\[u2192]"


def test_deploy_installs_it_and_has_no_packaged_path(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "deploy", "install", "man-page", "--dest", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "vjob.1").read_text().startswith(".TH VJOB 1 ")
    assert deploy.find("man-page").target == "/usr/local/share/man/man1/vjob.1"
    r = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "deploy", "path", "man-page"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "written from this vjob's code" in r.stderr
