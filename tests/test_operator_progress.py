"""vjob.progress (issue 22, item 9): plain lines every few percent when the output is a file."""

from __future__ import annotations

import io

from vjob.progress import Progress, track


class _File(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_off_a_terminal_a_line_every_step_and_at_the_end() -> None:
    out = _File()
    with Progress(200, "sweep", stream=out, step_pct=10) as p:
        for _ in range(200):
            p.advance()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("sweep: 10% (20/200) elapsed")
    assert "about" in lines[0] and lines[-1].startswith("sweep: 100% (200/200)")


def test_big_steps_print_one_line_each_not_one_per_mark() -> None:
    out = _File()
    with Progress(10, "runs", stream=out, step_pct=5) as p:
        p.advance(5)
        p.advance(5)
    assert [line.split(" elapsed")[0] for line in out.getvalue().splitlines()] == [
        "runs: 50% (5/10)",
        "runs: 100% (10/10)",
    ]


def test_track_yields_everything_and_an_early_end_is_said() -> None:
    out = _File()
    assert list(track(range(7), 7, "t", stream=out, step_pct=50)) == list(range(7))
    assert out.getvalue().splitlines()[-1].startswith("t: 100% (7/7)")
    out = _File()
    with Progress(100, "sim", stream=out, step_pct=50) as p:
        p.advance(30)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sim: 30% (30/100)")


def test_on_a_terminal_rich_draws_the_bar() -> None:
    out = io.StringIO()
    with Progress(3, "live", stream=out, live=True) as p:
        for _ in range(3):
            p.advance()
    assert "live" in out.getvalue() and "3/3" in out.getvalue()
