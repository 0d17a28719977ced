"""Masking the secrets of URLs and DSNs before they are printed, logged or stored.

Why one function for every path: a database or REST URL reaches an operator's terminal, a log
line and the shared journal through many messages (`config show`, `db check`, "store
unavailable", a driver's error text). Each of them used its own partial masking, and each
missed a case (`?password=`, a raw `@` in the password). The rule is written once here:

- the password of the userinfo (`scheme://user:PASSWORD@host`) is replaced by `***`; it runs
  to the *last* `@` before the host, so a raw (not percent-encoded) `@` inside the password
  is masked too, and the user name is kept;
- the value of every query parameter whose (percent-decoded, case-insensitive) name contains
  one of `SECRET_WORDS` is replaced by `***` (`?password=`, `?sslpassword=`, `?api_key=`...);
- in free text (a driver's error message), every URL is masked as above, libpq keyword pairs
  such as `password=...` are masked, and the literal secret values of a known URL are removed.

Over-masking is preferred to a leak: a URL too odd to parse keeps its scheme and loses the rest.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
SECRET_WORDS = ("password", "passwd", "pass", "secret", "token", "key", "sslpassword")

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]*")
# libpq keyword/value DSN pairs (host=db password=x) and the like, in free text.
_PAIR_IN_TEXT = re.compile(
    r"(?i)\b([\w.\-]*(?:" + "|".join(SECRET_WORDS) + r")[\w.\-]*)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&;,]+)"
)


def is_secret_name(name: str) -> bool:
    """True when a parameter or key named `name` holds a secret (case-insensitive substring)."""
    low = unquote(name).lower()
    return any(word in low for word in SECRET_WORDS)


def _split_userinfo(rest: str) -> tuple[str, str, str] | None:
    """(user, password-with-colon-or-empty, after-host-start) or None when there is no userinfo.

    The userinfo ends at the last `@` whose user name (the part before the first `:`) holds no
    `/`, `?` or `#`: a raw `@` in the password is then inside the masked part, and an `@` in a
    file path (`sqlite:////tmp/a@b.db`) is not mistaken for one.
    """
    at = len(rest)
    while True:
        at = rest.rfind("@", 0, at)
        if at < 0:
            return None
        user, sep, password = rest[:at].partition(":")
        if not any(c in user for c in "/?#"):
            return user, (sep + password) if sep else "", rest[at + 1 :]
        # an '@' after a path or query separator in the user part: look at an earlier '@'


def raw_at_in_userinfo(url: str) -> bool:
    """True when the user name or password of `url` holds a raw (not percent-encoded) `@`.

    Why refuse rather than guess: SQLAlchemy (like most URL parsers) ends the password at the
    *first* `@`, so `postgresql://vjob:p@ss@db/vjob` is user `vjob`, password `p` and host
    `ss@db` — the tail of the password becomes a host name that every connection attempt,
    every tick, quotes in its error. The operator's intent (`%40`) is clear, but a silently
    repaired secret is a habit we do not want; the error says what to write instead.
    """
    m = _SCHEME.match(url)
    if m is None:
        return False
    split = _split_userinfo(url[m.end() :])
    return split is not None and "@" in split[0] + split[1]


def mask_url(url: str) -> str:
    """`url` with its userinfo password and its secret query parameters replaced by ***."""
    m = _SCHEME.match(url)
    if m is None:
        return mask_text_pairs(url)
    scheme, rest = url[: m.end()], url[m.end() :]
    split = _split_userinfo(rest)
    if split is not None:
        user, password, rest = split
        prefix = f"{scheme}{user}{':' + MASK if password else ''}@"
    else:
        prefix = scheme
    head, qmark, query = rest.partition("?")
    if not qmark:
        return prefix + rest
    query, hashmark, fragment = query.partition("#")
    params = []
    for param in re.split(r"([&;])", query):
        name, eq, _value = param.partition("=")
        params.append(f"{name}={MASK}" if eq and is_secret_name(name) else param)
    return f"{prefix}{head}?{''.join(params)}{hashmark}{fragment}"


def secret_values(url: str) -> list[str]:
    """The literal secrets of `url` (raw and percent-decoded), longest first, for scrubbing text."""
    m = _SCHEME.match(url)
    found: set[str] = set()
    if m is not None:
        rest = url[m.end() :]
        split = _split_userinfo(rest)
        if split is not None:
            if split[1]:
                found.add(split[1][1:])
            rest = split[2]
        query = rest.partition("?")[2].partition("#")[0]
        for param in re.split(r"[&;]", query):
            name, eq, value = param.partition("=")
            if eq and is_secret_name(name):
                found.add(value)
    for _name, _eq, value in _PAIR_IN_TEXT.findall(url):
        found.add(value.strip("'"))
    found |= {unquote(v) for v in found}
    # A raw '@' in the password makes a driver take the part after it for the host and quote
    # it in its error ("failed to resolve host 'rest@db'"): each piece is a secret as well.
    found |= {piece for v in found for piece in v.split("@")}
    return sorted((v for v in found if v), key=len, reverse=True)


def mask_text_pairs(text: str) -> str:
    """`text` with the values of `password=...`-like keyword pairs replaced by ***."""
    return _PAIR_IN_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)


def mask_text(text: str, *urls: str) -> str:
    """Free text (an error message, a log value) with every URL and secret pair masked, and the
    literal secrets of `urls` (the URL the message is about) removed wherever they appear."""
    out = _URL_IN_TEXT.sub(lambda m: mask_url(m.group(0)), text)
    out = mask_text_pairs(out)
    for url in urls:
        for value in secret_values(url):
            out = out.replace(value, MASK)
    return out
