"""vjob's parts of a job's free-text record field, and the one way to edit them.

Why one module: the field root writes into (Slurm's AdminComment, PBS's `comment`) is shared.
On Slurm it holds job_submit.lua's `vjob:class=...,os=...` label, each node's
`vjob-usage@<node>:...` word (vjob.usage_record), the reason a held-back interactive job waits
(`[vjob: ...]`, below) and whatever an operator wrote. Every writer goes through `put`, which
changes only the writer's own part and keeps every other character of the text as it was,
tabs and double spaces included; adding a part and removing it again gives the text back
byte for byte (tests/test_record_text.py holds both on random texts).

The wait reason is a bracketed group of words, `[vjob: interactive cap reached (2/2 nodes; ...)]`,
because it is a sentence the user reads, not a token: the brackets let a reader (and `notice`)
find where it ends. vjob writes it for a pending interactive job and removes it when the job
starts (agent.wait_notice).
"""

from __future__ import annotations

import re
import unicodedata

from vjob.errors import InputError

MAX_FIELD_CHARS = 16384
"""A record longer than this is not parsed or edited (an operator's novel, or garbage): refused."""
MAX_NOTICE_CHARS = 200
NOTICE = re.compile(r"(?<!\S)\[vjob: [^\[\]\r\n]*\](?!\S)")
"""The wait reason's group: `[vjob: ...]` standing apart from its neighbours, one line."""
_UNSAFE = str.maketrans({"[": "(", "]": ")"})


def check_size(text: str, what: str = "record") -> str:
    """`text`, or InputError when it is too long to be a job's record field."""
    if len(text) > MAX_FIELD_CHARS:
        raise InputError(f"{what}: {len(text)} characters, more than {MAX_FIELD_CHARS}")
    return text


def put(text: str, own: re.Pattern[str], new: str | None) -> str:
    """`text` with `new` in place of the first match of `own` (after the text, one space
    apart, when there was none) and every other match of `own` removed; `new` None removes
    them all. A part removed takes one space beside it along (the one before it, else the one
    after), the space `put` added with it: every other character stays as it was."""
    check_size(text)
    matches = list(own.finditer(text))
    if not matches:
        if new is None:
            return text
        return f"{text} {new}" if text else new
    out: list[str] = []
    at = 0
    for k, m in enumerate(matches):
        start, end = m.start(), m.end()
        if k == 0 and new is not None:
            out.append(text[at:start] + new)
            at = end
            continue
        if start > at and text[start - 1] == " ":
            start -= 1
        elif text[end : end + 1] == " ":
            end += 1
        out.append(text[at:start])
        at = end
    out.append(text[at:])
    return "".join(out)


def clean_notice(reason: str) -> str:
    """A wait reason as it may stand in the field: one line of words one space apart, no
    brackets (a PBS array id's `[4]` becomes `(4)`) nor control characters, `vjob: ` and at
    least one word, at most MAX_NOTICE_CHARS."""
    safe = "".join(" " if unicodedata.category(c) == "Cc" else c for c in reason.translate(_UNSAFE))
    words = safe.split()
    if len(words) < 2 or words[0] != "vjob:":
        raise InputError(f"wait reason {reason[:60]!r}: must be 'vjob: ' and a reason")
    return " ".join(words)[:MAX_NOTICE_CHARS].rstrip()


def notice(text: str) -> str | None:
    """The wait reason in a record's text (`vjob: ...`), None when it holds none."""
    m = NOTICE.search(check_size(text))
    return None if m is None else m.group(0)[1:-1]


def with_notice(text: str, reason: str | None) -> str:
    """`text` with its wait reason set to `reason` (None: removed), every other character kept."""
    return put(text, NOTICE, None if reason is None else f"[{clean_notice(reason)}]")


__all__ = ["MAX_FIELD_CHARS", "NOTICE", "check_size", "clean_notice", "notice", "put", "with_notice"]
