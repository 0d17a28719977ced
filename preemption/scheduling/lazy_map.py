"""A read-only mapping made into a dict only when first read.

Why: the pass's answer carries per-job mappings of the whole queue — the UBIS priority and
the tier of each of 100,000 jobs at a site's size — that the agent's tick never reads (it
sends `rms_priorities`; `vjob prio` and the tests read the others). Building a dict of
100,000 entries costs 15–25 ms each, a tenth of the decision. Kept as the keys and values
the pass has anyway, the dict is made at the first look, and then is what every look reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

V = TypeVar("V")


class LazyMap(Mapping[str, V]):
    """`dict(zip(keys, values))`, made when first read (equal to it, printed as it)."""

    __slots__ = ("_dict", "_keys", "_values")

    def __init__(self, keys: Sequence[str], values: Any) -> None:
        """`values`: a sequence as long as `keys`, or an array (its `tolist` gives the values)."""
        self._keys: Sequence[str] | None = keys
        self._values: Any = values
        self._dict: dict[str, V] | None = None

    def _made(self) -> dict[str, V]:
        made = self._dict
        if made is None:
            values = self._values
            if hasattr(values, "tolist"):
                values = values.tolist()
            assert self._keys is not None
            made = self._dict = dict(zip(self._keys, values, strict=True))
            self._keys = self._values = None
        return made

    def __getitem__(self, key: str) -> V:
        return self._made()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())

    def __contains__(self, key: object) -> bool:
        return key in self._made()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyMap):
            return self._made() == other._made()
        if isinstance(other, Mapping):
            return self._made() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._made())

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (self._made(),))  # pickled as the dict it stands for
