"""The search space of a converted supernet: which values each dimension may take.

A space is an ordered set of *dimensions* (``"depth"``, ``"width"``, ...). Each dimension has one *entry* per place it
controls (a stage for depth, a block for width) and each entry has a finite tuple of allowed *choices*. A
:class:`~subnetact.SubnetConfig` picks one choice per entry of every dimension.
"""

from __future__ import annotations

import itertools
import math
import numbers
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .config import SubnetConfig, Value, as_value
from .errors import InvalidSubnetError

_LINKS_KEY = "__links__"  # in to_dict(): not a dimension name


@dataclass(frozen=True)
class Entry:
    """One place a dimension controls.

    Args:
        name: the module path it controls, e.g. ``"layer2"`` (a stage) or ``"layer2.1"`` (a block).
        choices: allowed values in increasing order of cost.
    """

    name: str
    choices: tuple[Value, ...]

    def __post_init__(self) -> None:
        if isinstance(self.choices, (str, bytes)) or not isinstance(self.choices, Sequence) or not self.choices:
            raise InvalidSubnetError(
                f"entry {self.name!r} needs a non-empty sequence of choices, got {self.choices!r}"
            )
        # Finite ints or floats only (numpy scalars become Python numbers): a NaN or a string choice could never match.
        object.__setattr__(self, "choices", tuple(as_value(self.name, i, c) for i, c in enumerate(self.choices)))
        if len(set(self.choices)) != len(self.choices):
            raise InvalidSubnetError(f"entry {self.name!r} has duplicate choices {self.choices!r}")

    def match(self, value: Value) -> Value | None:
        """The choice equal to ``value`` (floats compare with a 1e-9 relative tolerance), or None. Integer choices
        (block counts) take ints only: ``depth=2.0`` is a mistake (a width given as depth?), not 2."""
        if _non_integer(value) and all(isinstance(c, int) and not isinstance(c, bool) for c in self.choices):
            return None
        for choice in self.choices:
            if value == choice or (isinstance(value, float) and math.isclose(value, choice, rel_tol=1e-9)):
                return choice
        return None


def _non_integer(value: Any) -> bool:
    """A real number that is not an integer type (``2.0``, ``numpy.float32(2)``; numpy ints are integers)."""
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)


class Space:
    """The set of subnets a converted model can actuate.

    Args:
        dims: dimension name -> entries, in a fixed order (``depth`` first, then ``width``, then extras).
        links: keyword name -> dimensions it sets together, e.g. ``{"width": ("heads", "ffn")}`` for a transformer
            whose attention heads and FFN neurons are separate dimensions that ``width=`` moves in step. A link is a
            keyword of :meth:`make` and ``model.actuate`` only, not a dimension: configs never contain it, and it
            takes no part in equality or :meth:`to_dict` (the set of subnets does not depend on it).

    Example::

        >>> space = model.space
        >>> space.max(), space.min()
        >>> cfg = space.sample(random.Random(0))
        >>> cfg in space
        True
    """

    def __init__(self, dims: Mapping[str, Sequence[Entry]], links: Mapping[str, Sequence[str]] | None = None) -> None:
        if not dims:
            raise InvalidSubnetError("a Space needs at least one dimension")
        self._dims: dict[str, tuple[Entry, ...]] = {name: tuple(entries) for name, entries in dims.items()}
        self._links: dict[str, tuple[str, ...]] = {}
        for name, targets in (links or {}).items():
            targets = tuple(targets)
            if name in self._dims:
                raise InvalidSubnetError(f"link {name!r} has the name of a dimension; dimensions are {self.dims}")
            unknown = [t for t in targets if t not in self._dims]
            if not targets or unknown:
                raise InvalidSubnetError(
                    f"link {name!r} -> {targets!r} must name existing dimensions (unknown: {unknown}); "
                    f"dimensions are {self.dims}"
                )
            if len({len(self._dims[t]) for t in targets}) != 1:
                counts = {t: len(self._dims[t]) for t in targets}
                raise InvalidSubnetError(f"link {name!r} joins dimensions with different entry counts {counts}")
            self._links[name] = targets

    # -- structure -----------------------------------------------------------------------------------------------
    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(self._dims)

    def entries(self, dim: str) -> tuple[Entry, ...]:
        try:
            return self._dims[dim]
        except KeyError:
            hint = f" ({dim!r} is a link to {self._links[dim]})" if dim in self._links else ""
            raise InvalidSubnetError(f"the space has no dimension {dim!r}{hint}; it has {self.dims}") from None

    @property
    def links(self) -> dict[str, tuple[str, ...]]:
        """Keyword name -> the dimensions it sets together (see the class docstring)."""
        return dict(self._links)

    def expand_links(self, dims: Mapping[str, Any]) -> dict[str, Any]:
        """``dims`` with every link keyword replaced by its dimensions, each given the link's value.

        Raises:
            InvalidSubnetError: a link and one of its dimensions are both given.
        """
        out = {k: v for k, v in dims.items() if k not in self._links}
        for name, targets in self._links.items():
            if name not in dims:
                continue
            both = [t for t in targets if t in dims]
            if both:
                raise InvalidSubnetError(
                    f"{name}={dims[name]!r} sets {targets}, so it cannot be combined with {both[0]}="
                    f"{dims[both[0]]!r}; pass either {name}= or the separate dimensions {', '.join(targets)}"
                )
            out.update(dict.fromkeys(targets, dims[name]))
        return out

    @property
    def size(self) -> int:
        """Number of distinct configs (product of the choice counts; configs that differ only in the width of a
        block skipped by depth count separately, as they do in once-for-all)."""
        return math.prod(len(e.choices) for entries in self._dims.values() for e in entries)

    # -- building configs ----------------------------------------------------------------------------------------
    def validate(self, cfg: SubnetConfig) -> SubnetConfig:
        """Check ``cfg`` against the space and return it with every value snapped to its exact choice.

        Raises:
            InvalidSubnetError: naming the dimension, the index, the value and the allowed values.
        """
        if not isinstance(cfg, SubnetConfig):
            raise InvalidSubnetError(f"expected a SubnetConfig, got {type(cfg).__name__}: {cfg!r}")
        if set(cfg.dims) != set(self._dims):
            raise InvalidSubnetError(
                f"config has dimensions {sorted(cfg.dims)} but the space has {sorted(self._dims)}: {cfg!r}"
            )
        snapped: dict[str, tuple[Value, ...]] = {}
        for dim, entries in self._dims.items():
            values = cfg[dim]
            if len(values) != len(entries):
                names = ", ".join(e.name for e in entries)
                raise InvalidSubnetError(
                    f"{dim} has {len(values)} values but the space has {len(entries)} {dim} entries ({names})"
                )
            out = []
            for i, (value, entry) in enumerate(zip(values, entries)):
                choice = entry.match(value)
                if choice is None:
                    kind = "ints, " if _non_integer(value) and all(isinstance(c, int) for c in entry.choices) else ""
                    # "module" because entries are named by module path, and a path such as '1.0' (a block of an
                    # nn.Sequential) alone reads like a value.
                    raise InvalidSubnetError(
                        f"{dim}[{i}]={value!r} is not allowed for module {entry.name or '<root>'!r}: allowed values "
                        f"are {kind}{entry.choices}"
                    )
                out.append(choice)
            snapped[dim] = tuple(out)
        return SubnetConfig(**snapped)

    def make(self, **dims: Any) -> SubnetConfig:
        """Build and validate a config; a scalar applies to every entry of its dimension.

        ``space.make(depth=2, width=[0.5] * 16)`` is ``depth=(2, 2, 2, 2)`` for a four-stage space. A link
        keyword (see :attr:`links`) sets each of its dimensions to its value.
        """
        expanded = {}
        for dim, value in self.expand_links(dims).items():
            entries = self.entries(dim)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):  # numpy scalars included
                expanded[dim] = (value,) * len(entries)
            elif isinstance(value, (list, tuple)):
                expanded[dim] = tuple(value)
            else:
                raise InvalidSubnetError(
                    f"{dim}={value!r} must be a number or a list of {len(entries)} numbers (one per {dim} entry)"
                )
        return self.validate(SubnetConfig(**expanded))

    def __contains__(self, cfg: object) -> bool:
        if not isinstance(cfg, SubnetConfig):
            return False
        try:
            self.validate(cfg)
        except InvalidSubnetError:
            return False
        return True

    def max(self) -> SubnetConfig:
        """The largest subnet: the last (largest) choice everywhere."""
        return SubnetConfig(**{d: tuple(e.choices[-1] for e in es) for d, es in self._dims.items()})

    def min(self) -> SubnetConfig:
        """The smallest subnet: the first (smallest) choice everywhere."""
        return SubnetConfig(**{d: tuple(e.choices[0] for e in es) for d, es in self._dims.items()})

    def sample(self, rng: random.Random | int | None = None) -> SubnetConfig:
        """A uniformly random config.

        Args:
            rng: a ``random.Random``, a seed, or None for the module-level generator.
        """
        if rng is None or isinstance(rng, int):
            rng = random.Random(rng)
        return SubnetConfig(**{d: tuple(rng.choice(e.choices) for e in es) for d, es in self._dims.items()})

    def enumerate(self) -> Iterator[SubnetConfig]:
        """Every config, lazily, in lexicographic order of choice indices. Beware: :attr:`size` can be huge."""
        flat = [(d, e) for d, es in self._dims.items() for e in es]
        for combo in itertools.product(*(e.choices for _, e in flat)):
            values: dict[str, list[Value]] = {d: [] for d in self._dims}
            for (d, _), v in zip(flat, combo):
                values[d].append(v)
            yield SubnetConfig(**values)

    # -- serialisation -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """``{dimension: [{"name", "choices"}, ...]}``, plus ``"__links__": {keyword: [dimensions]}`` if there are
        links (a transformer's ``width`` -> ``heads`` and ``ffn``)."""
        out: dict[str, Any] = {
            d: [{"name": e.name, "choices": list(e.choices)} for e in es] for d, es in self._dims.items()
        }
        if self._links:
            out[_LINKS_KEY] = {name: list(targets) for name, targets in self._links.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Space:
        """The inverse of :meth:`to_dict` (links included)."""
        if not isinstance(data, Mapping):
            raise InvalidSubnetError(f"a space dict must be a mapping of dimension -> entries, got {data!r}")
        links = data.get(_LINKS_KEY)
        if links is not None and not isinstance(links, Mapping):
            raise InvalidSubnetError(f"{_LINKS_KEY} must map a keyword to dimension names, got {links!r}")
        dims = {}
        for d, es in data.items():
            if d == _LINKS_KEY:
                continue
            if isinstance(es, (str, bytes)) or not isinstance(es, Sequence):
                raise InvalidSubnetError(f"dimension {d!r} must be a list of entries, got {es!r}")
            dims[d] = [Entry(str(e["name"]), e["choices"]) for e in es]
        return cls(dims, links)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Space) and self._dims == other._dims

    def __hash__(self) -> int:
        return hash(tuple(self._dims.items()))

    def __repr__(self) -> str:
        lines = [f"Space(size={self.size:.3g}, dims=["]
        for d, es in self._dims.items():
            distinct = sorted({e.choices for e in es})
            shown = distinct[0] if len(distinct) == 1 else "per entry"
            lines.append(f"  {d}: {len(es)} entries, choices {shown}")
        lines.append("])")
        return "\n".join(lines)
