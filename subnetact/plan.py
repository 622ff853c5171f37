"""The one plan format of :func:`subnetact.convert`: what phase 1 (the trace, block rules or a model adapter)
describes and phase 2 inserts.

- :class:`ConvertConfig`: the options of ``convert`` (the search space it builds).
- :class:`ConversionPlan`: the stages, the space's dimensions, the channel groups and, per module path, the
  operator to insert there (an :class:`~subnetact.handlers.OperatorEntry` naming a registered kind).
  :meth:`ConversionPlan.merge` joins two analyses (block rules, then the trace) into one.
- :func:`register_model_adapter`: a whole-model analysis returning a plan, used instead of the default one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from torch import nn

from ._registry import ClassRegistry
from .checks import is_int, is_real
from .errors import ConfigError, UnsupportedModelError
from .handlers import OperatorEntry
from .layer_select import PREFIX, RULES, is_rule
from .space import Entry
from .state import ChannelGroup


@dataclass(frozen=True)
class ConvertConfig:
    """Options of :func:`convert`: the search space it builds.

    Args:
        width_choices: channel fractions every block may use, increasing. A block of C channels in groups of
            ``unit`` runs ``unit * ceil(w * C / unit)`` channels (``ceil(w * C)`` for ungrouped layers); see
            :func:`~subnetact.state.active_size`.
        min_depth: smallest number of blocks per stage (clamped to the stage's length; at least 1, because the
            first block of a stage changes the shape and always runs).
        depth_rule: which blocks a stage keeps at a smaller depth (:func:`~subnetact.kept_layers`): ``None`` (default)
            the analysis's own choice (``"prefix"`` for convolutional stages, ``"every_other"`` for transformer
            layer stacks), or ``"prefix"``, ``"every_other"`` or ``"spread"`` for every stage. ``"spread"`` keeps the
            first and the last block of each stage; use it when the output is read off the last block, as a
            sentence encoder's embedding is. Or a *keep order*: a tuple of block indices, most important first
            (:func:`subnetact.train.order_layers` measures one); every stage must then have that many blocks.
    """

    width_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    min_depth: int = 1
    depth_rule: str | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        choices = tuple(self.width_choices)
        object.__setattr__(self, "width_choices", choices)
        if not choices:
            raise ConfigError("width_choices=() must hold at least one fraction in (0, 1]")
        for w in choices:
            if not is_real(w) or not (0 < w <= 1):
                raise ConfigError(f"width_choices={choices!r}: every value must be a number in (0, 1], got {w!r}")
        if list(choices) != sorted(set(choices)):
            raise ConfigError(f"width_choices={choices!r} must be strictly increasing")
        if not is_int(self.min_depth) or self.min_depth < 1:
            raise ConfigError(f"min_depth={self.min_depth!r} must be an int >= 1")
        rule = self.depth_rule
        if isinstance(rule, (list, tuple)):
            rule = tuple(rule)
            object.__setattr__(self, "depth_rule", rule)
        if rule is not None and not is_rule(rule):
            raise ConfigError(
                f"depth_rule={self.depth_rule!r} must be None, one of {RULES}, or a keep order (distinct block "
                "indices >= 0, most important first)"
            )

    def to_dict(self) -> dict:
        return asdict(self)


def depth_choices(n_blocks: int, min_depth: int) -> tuple[int, ...]:
    """The depths a stage of ``n_blocks`` may run: ``min(min_depth, n_blocks) .. n_blocks``."""
    return tuple(range(min(min_depth, n_blocks), n_blocks + 1))


@dataclass
class StagePlan:
    """One ``LayerSelect`` to insert: the ``nn.Sequential`` at ``path`` (or an ``nn.ModuleList`` that its owner loops
    over, which becomes a :class:`LayerSelectList`), and how it keeps blocks."""

    path: str
    rule: str = PREFIX
    start: int = 0  # a run of positions [start, end) of the Sequential (end None: to its end)
    end: int | None = None


@dataclass
class ConversionPlan:
    """What phase 2 of :func:`convert` does, computed and validated by phase 1 (the trace, block rules or a model
    adapter).

    Every module to replace is an operator entry; ``slices``, ``norms`` and ``custom`` are shorthands for the
    built-in kinds ``"slice"``, ``"norm"`` and ``"custom"``, and ``operators`` takes any registered kind
    (:func:`~subnetact.handlers.register_operator_kind`). :meth:`entries` lists them all.

    Args:
        stages: the stages to wrap, in the order of the space's ``depth`` entries.
        dims: the search space's dimensions (``depth`` entries must match ``stages``).
        groups: the elastic channel groups.
        slices: conv/linear path -> (output group, input group), either None when not sliced.
        norms: norm path -> group (None: not sliced). Every other ``nn.BatchNorm2d`` becomes an unsliced
            SubnetNorm.
        custom: path -> factory building a user-defined :class:`~subnetact.operator.Operator` from the module there.
        prepare: called on the model first thing in phase 2, for adapters that restructure a model before operators
            go in (once-for-all: swap its dynamic wrappers for plain layers holding the same Parameters). Every
            other path of the plan refers to the prepared model. It must not fail on a model phase 1 accepted.
        links: keyword -> dimensions it sets together (:class:`~subnetact.Space` links), e.g.
            ``{"width": ("heads", "ffn")}``.
        operators: path -> :class:`~subnetact.handlers.OperatorEntry` of any registered kind.
        blocked: why channel groups were left at full width, most channels first (for the error when nothing is
            elastic).
        check: called on the converted model after phase 2 (and after the example-input check), for an adapter's
            own convert-time verification (the decoders: the largest subnet reproduces the original logits bit for
            bit on a tiny input the adapter builds); an exception rolls the conversion back.
    """

    stages: list[StagePlan]
    dims: dict[str, list[Entry]]
    groups: list[ChannelGroup]
    slices: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    norms: dict[str, int | None] = field(default_factory=dict)
    custom: dict[str, Callable[[nn.Module], nn.Module]] = field(default_factory=dict)
    prepare: Callable[[nn.Module], None] | None = None
    links: dict[str, tuple[str, ...]] = field(default_factory=dict)
    operators: dict[str, OperatorEntry] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)
    check: Callable[[nn.Module], None] | None = None

    def entries(self) -> list[tuple[str, OperatorEntry]]:
        """Every operator to insert, ``(path, entry)``, in the order phase 2 inserts them: ``custom`` first (a custom
        factory may build a parent whose children other entries replace), then ``operators``, ``slices``, ``norms``.

        Raises:
            UnsupportedModelError: a path is planned twice.
        """
        listed = [(path, OperatorEntry("custom", (), factory)) for path, factory in self.custom.items()]
        listed += list(self.operators.items())
        listed += [(path, OperatorEntry("slice", (o, i))) for path, (o, i) in self.slices.items()]
        listed += [(path, OperatorEntry("norm", (g,))) for path, g in self.norms.items()]
        seen: set[str] = set()
        for path, entry in listed:
            if path in seen:
                raise UnsupportedModelError(f"the plan inserts two operators at {path!r} (the second: {entry.kind!r})")
            seen.add(path)
        return listed

    def is_elastic(self) -> bool:
        """Whether the plan makes anything elastic: a channel group, or a stage with more than one depth."""
        return bool(self.groups) or any(len(e.choices) > 1 for e in self.dims.get("depth", ()))

    def merge(self, other: ConversionPlan) -> ConversionPlan:
        """One plan doing both: this plan's entries, then ``other``'s, with ``other``'s channel groups renumbered
        after this plan's and its entry indices after this plan's entries of the same dimension.

        Where both plan the same module path, this plan's entry wins (block rules over the trace). ``other`` may
        have no ``prepare`` and, unless this plan has no groups, no ``custom`` factories (their group indices cannot
        be renumbered).

        Raises:
            ConfigError: ``other`` has a ``prepare`` step or ``custom`` factories that cannot be renumbered.
        """
        if other.prepare is not None:
            raise ConfigError("ConversionPlan.merge: the second plan has a prepare step; only the first may")
        if other.check is not None:
            raise ConfigError("ConversionPlan.merge: the second plan has a check step; only the first may")
        if other.custom and self.groups:
            raise ConfigError(
                f"ConversionPlan.merge: the second plan's custom factories ({sorted(other.custom)}) cannot be "
                "renumbered after the first plan's channel groups; use operators= entries of a registered kind"
            )
        entry_offset = {dim: len(entries) for dim, entries in self.dims.items()}
        group_offset = len(self.groups)

        def renumber(g: ChannelGroup) -> ChannelGroup:
            if isinstance(g.dim, tuple):
                index = tuple(i + entry_offset.get(d, 0) for d, i in zip(g.dim, g.index))
            else:
                index = g.index + entry_offset.get(g.dim, 0)
            return ChannelGroup(g.dim, index, g.full, g.sizes)

        def shift(g: int | None) -> int | None:
            return None if g is None else g + group_offset

        def shift_entry(e: OperatorEntry) -> OperatorEntry:
            return e._replace(groups=tuple(shift(g) for g in e.groups))

        def joined(mine: dict, theirs: dict) -> dict:
            # this plan's entries first and winning; ``other``'s for the paths this plan does not plan
            return {**mine, **{path: value for path, value in theirs.items() if path not in mine}}

        dims = {}
        for dim in dict.fromkeys([*self.dims, *other.dims]):
            entries = list(self.dims.get(dim, ())) + list(other.dims.get(dim, ()))
            if entries:
                dims[dim] = entries
        return ConversionPlan(
            stages=list(self.stages) + list(other.stages),
            dims=dims,
            groups=list(self.groups) + [renumber(g) for g in other.groups],
            slices=joined(self.slices, {p: (shift(o), shift(i)) for p, (o, i) in other.slices.items()}),
            norms=joined(self.norms, {p: shift(g) for p, g in other.norms.items()}),
            custom=joined(self.custom, other.custom),
            prepare=self.prepare,
            links=joined(self.links, other.links),
            operators=joined(self.operators, {p: shift_entry(e) for p, e in other.operators.items()}),
            blocked=list(self.blocked) + list(other.blocked),
            check=self.check,
        )


ModelAdapter = Callable[[nn.Module, ConvertConfig, "Callable[[nn.Module, str], bool] | None"], "ConversionPlan | None"]


_ADAPTERS: ClassRegistry[ModelAdapter] = ClassRegistry()  # built-ins: subnetact/builtins.py


def register_model_adapter(model_type: type | str) -> Callable[[ModelAdapter], ModelAdapter]:
    """Decorator registering a whole-model analysis ``(model, config, filter_fn) -> ConversionPlan | None`` for a
    class (or its ``"module.QualName"``), used instead of the default analysis; returning None hands the model to
    the default analysis."""
    return _ADAPTERS.register(model_type)


def find_model_adapter(model: nn.Module) -> ModelAdapter | None:
    """The adapter registered for ``model``'s class (or a base class), else None."""
    return _ADAPTERS.lookup(type(model))
