"""``SubnetConfig``: an immutable, hashable, JSON-serialisable description of one subnet.

A config maps each dimension of the search space (``"depth"``, ``"width"``, and whatever else a space defines) to
a tuple of values, one per entry of that dimension (per stage for depth, per block for width). Whether the values
are allowed is the space's business (:meth:`subnetact.Space.validate`); the config only guarantees its own shape:
names are strings and values are tuples of ints or floats.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .errors import InvalidSubnetError

Value = int | float


def as_value(dim: str, index: int, v: Any) -> Value:
    """``v`` as a config value (a Python int or float), or :class:`InvalidSubnetError` naming ``dim[index]``."""
    # bool is an int subclass; True as a depth is almost certainly a bug, so refuse it (numpy's bool_ is no Integral).
    # numpy scalars (np.int64, np.float32, ...) register as numbers.Integral / Real: stored as Python int / float.
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InvalidSubnetError(f"{dim}[{index}]={v!r} has type {type(v).__name__}; expected an int or a float")
    if isinstance(v, numbers.Integral):
        return int(v)
    f = float(v)
    if not math.isfinite(f):
        raise InvalidSubnetError(f"{dim}[{index}]={v!r} is not a finite number")
    return f


class SubnetConfig:
    """One subnet of a supernet: a value per entry of every search-space dimension.

    Args:
        **dims: dimension name -> sequence of values, e.g. ``depth=(2, 3, 4, 2), width=(0.5,) * 16``.

    Configs are immutable, hashable, totally ordered (by their canonical form) and round-trip through
    :meth:`to_dict` / :meth:`from_dict` and JSON. :attr:`id` is a stable hash of the canonical form, usable as a
    file or dictionary key across processes.

    Example::

        >>> cfg = SubnetConfig(depth=[1, 2], width=[0.5, 1.0, 1.0])
        >>> cfg.depth
        (1, 2)
        >>> SubnetConfig.from_dict(cfg.to_dict()) == cfg
        True
    """

    __slots__ = ("_hash", "_items")

    def __init__(self, **dims: Sequence[Value]) -> None:
        if not dims:
            raise InvalidSubnetError("a SubnetConfig needs at least one dimension, e.g. depth=... or width=...")
        items = []
        for name in sorted(dims):
            values = dims[name]
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise InvalidSubnetError(f"{name}={values!r} must be a list or tuple of numbers")
            items.append((name, tuple(as_value(name, i, v) for i, v in enumerate(values))))
        self._items: tuple[tuple[str, tuple[Value, ...]], ...] = tuple(items)
        self._hash = hash(self._items)

    # -- mapping-like access -------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> tuple[Value, ...]:
        for key, values in self._items:
            if key == name:
                return values
        raise KeyError(f"SubnetConfig has no dimension {name!r}; it has {self.dims}")

    def get(self, name: str, default: Any = None) -> Any:
        for key, values in self._items:
            if key == name:
                return values
        return default

    def items(self) -> Iterator[tuple[str, tuple[Value, ...]]]:
        return iter(self._items)

    @property
    def dims(self) -> tuple[str, ...]:
        """Dimension names, sorted."""
        return tuple(name for name, _ in self._items)

    @property
    def depth(self) -> tuple[int, ...]:
        """Per-stage depth (number of blocks run in each stage)."""
        return self["depth"]  # type: ignore[return-value]

    @property
    def width(self) -> tuple[float, ...]:
        """Per-block width fraction."""
        return self["width"]  # type: ignore[return-value]

    def replace(self, **dims: Sequence[Value]) -> SubnetConfig:
        """A copy with some dimensions replaced."""
        merged: dict[str, Sequence[Value]] = dict(self._items)
        merged.update(dims)
        return SubnetConfig(**merged)

    # -- identity ------------------------------------------------------------------------------------------------
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, SubnetConfig):
            return NotImplemented
        return self._hash == other._hash and self._items == other._items

    def __lt__(self, other: SubnetConfig) -> bool:
        if not isinstance(other, SubnetConfig):
            return NotImplemented
        return self._items < other._items

    def __le__(self, other: SubnetConfig) -> bool:
        return self == other or self < other

    def __gt__(self, other: SubnetConfig) -> bool:
        if not isinstance(other, SubnetConfig):
            return NotImplemented
        return other < self

    def __ge__(self, other: SubnetConfig) -> bool:
        return self == other or self > other

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={list(values)!r}" for name, values in self._items)
        return f"SubnetConfig({body})"

    # -- serialisation -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, list[Value]]:
        """``{dimension: [values...]}``, JSON-serialisable."""
        return {name: list(values) for name, values in self._items}

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[Value]]) -> SubnetConfig:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, Mapping):
            raise InvalidSubnetError(f"SubnetConfig.from_dict expects a mapping, got {type(data).__name__}")
        return cls(**{str(k): v for k, v in data.items()})

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace. Equal configs give equal strings."""
        # 1 == 1.0 in Python (same hash, equal configs), so integral floats are written as ints to keep the
        # canonical text, and therefore ``id``, equal for equal configs.
        # (Ints stay ints: float() of a huge int overflows.)
        canonical = {
            name: [v if isinstance(v, int) or not v.is_integer() else int(v) for v in values]
            for name, values in self._items
        }
        return json.dumps(canonical, sort_keys=True, separators=(",", ":"))

    @property
    def id(self) -> str:
        """A stable 16-hex-digit id derived from the canonical JSON (same in every process and release)."""
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:16]
