"""`njit` that compiles with numba when it is installed, and runs plain Python when it is not.

Why: the decision pass the live agent runs (EASY backfill, the UBIS queue window) is shared
with the simulator, whose hot loops numba compiles. numba and llvmlite are ~200 MB, and an agent
deciding over a few thousand jobs per tick does not need them: on a base install (no `sim`
extra) the same functions run as Python, with the same results (numba's nopython subset is
Python; `NUMBA_DISABLE_JIT=1` runs the same path). Modules write `from vjob import jit as numba`
and keep `@numba.njit(cache=True, nogil=True)` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
