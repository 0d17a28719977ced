"""`njit` that compiles with numba when it is installed, and runs plain Python when it is not.

Why: the decision pass the live agent runs (EASY backfill, the UBIS queue window) is shared
with the simulator, whose hot loops numba compiles. numba and llvmlite are ~200 MB, and an agent
deciding over a few thousand jobs per tick does not need them: on a base install (no `sim`
extra) the same functions run as Python, with the same results (numba's nopython subset is
Python; `NUMBA_DISABLE_JIT=1` runs the same path). Modules write `from vjob import jit as numba`
and keep `@numba.njit(cache=True, nogil=True)` unchanged.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def private_cache_dir(uid: int, base: Path) -> Path:
    """`base`/vjob-numba-<uid> when it is this uid's own private directory (made so when absent),
    else a fresh private one: numba's cache files are pickles, so a directory another user made
    or can write would hand them code to run as this user."""
    mine = base / f"vjob-numba-{uid}"
    try:
        mine.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix=f"vjob-numba-{uid}-", dir=base))
    st = os.lstat(mine)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
        return mine
    return Path(tempfile.mkdtemp(prefix=f"vjob-numba-{uid}-", dir=base))


def _cache_dir_needed(package: Path, home: Path) -> bool:
    """Whether numba would find no place for its cache: the package's tree is not writable (an
    installed vjob run by an ordinary user) and neither is the user's cache directory (a user
    with no home, e.g. nobody) — numba then refuses to compile a `cache=True` function at all."""
    if os.access(package, os.W_OK):
        return False
    cache = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache")
    probe = cache if cache.exists() else cache.parent
    return not os.access(probe, os.W_OK)


if "NUMBA_CACHE_DIR" not in os.environ and _cache_dir_needed(
    Path(__file__).resolve().parents[1], Path(os.path.expanduser("~"))
):
    os.environ["NUMBA_CACHE_DIR"] = str(private_cache_dir(os.geteuid(), Path(tempfile.gettempdir())))

try:
    import numba as _numba
except ImportError:  # the base install: no `sim` extra
    _numba = None

COMPILED = _numba is not None
"""Whether `njit` compiles (numba importable) or returns the Python function."""


def njit(*args: Any, **options: Any) -> Any:
    """numba.njit when numba is installed; otherwise the identity decorator (options ignored)."""
    if _numba is not None:
        return _numba.njit(*args, **options)
    if args and callable(args[0]):
        return args[0]

    def plain(func: Callable[..., Any]) -> Callable[..., Any]:
        return func

    return plain


__all__ = ["COMPILED", "njit"]
