"""Every option that takes a value shows a placeholder that reads as a word (issue 36 item 4).

The rule, checked over the whole command tree (`vjob.cli.build_full_parser`): an option with a
value has `choices` (argparse shows them) or a metavar its author chose explicitly, and no
metavar holds an underscore. argparse's own default is the dest upper-cased (`--interactive-frac
INTERACTIVE_FRAC`, `--oaradmissionrules OARADMISSIONRULES`): a variable name, not a word; an
explicit metavar is a choice someone made (`FRACTION`, `SECONDS`, `FILE`, `N`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from vjob.cli import build_full_parser

FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction, argparse._HelpAction)


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif action.option_strings and action.nargs != 0 and not isinstance(action, FLAGS):
            yield " ".join(("vjob", *path)), action


def _placeholders(action: argparse.Action) -> list[str]:
    metavar = action.metavar
    return list(metavar) if isinstance(metavar, tuple) else [str(metavar)]


def test_every_option_value_has_a_word_for_a_placeholder() -> None:
    options = list(_options(build_full_parser(strict=True)))
    assert len(options) > 150, "the walk found too few options: is the tree built whole?"
    raw = [
        f"{cmd} {a.option_strings[-1]} {a.dest.upper()}"
        for cmd, a in options
        if a.metavar is None and a.choices is None
    ]
    assert raw == [], f"{len(raw)} options show their dest as placeholder: give each a metavar=:\n" + "\n".join(raw)
    underscored = [
        f"{cmd} {a.option_strings[-1]} {m}"
        for cmd, a in options
        if a.metavar is not None
        for m in _placeholders(a)
        if "_" in m
    ]
    assert underscored == [], "metavars with an underscore:\n" + "\n".join(underscored)


def test_the_rule_catches_argparses_default() -> None:
    """The walk sees an option left with argparse's placeholder (the check is not vacuous)."""
    parser = argparse.ArgumentParser(prog="vjob")
    sub = parser.add_subparsers()
    sim = sub.add_parser("simulate")
    sim.add_argument("--interactive-frac", type=float)
    sim.add_argument("--policy", choices=("vjob", "ubis"))
    sim.add_argument("--sweep", action="store_true")
    found = [(cmd, a.option_strings[-1]) for cmd, a in _options(parser) if a.metavar is None and a.choices is None]
    assert found == [("vjob simulate", "--interactive-frac")]
    assert "--interactive-frac INTERACTIVE_FRAC" in sim.format_usage()
