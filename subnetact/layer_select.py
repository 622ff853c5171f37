"""``LayerSelect``: runs a subset of the blocks of one stage (elastic depth)."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from .config import SubnetConfig
from .errors import ConfigError
from .handlers import OperatorEntry, register_operator_kind
from .operator import Operator

PREFIX = "prefix"
EVERY_OTHER = "every_other"
SPREAD = "spread"
RULES = (PREFIX, EVERY_OTHER, SPREAD)


def kept_layers(num_layers: int, depth: int, rule: str | tuple[int, ...] = PREFIX) -> list[int]:
    """Indices of the blocks a stage of ``num_layers`` blocks runs at ``depth``.

    ``"prefix"`` (convolutional supernets, once-for-all): the first ``depth`` blocks.
    ``"every_other"`` (DynaBERT): ``[floor(i * L / D) for i in range(D)]``, which drops evenly spaced blocks and
    equals DynaBERT's choice for D/L = 0.5 and 0.75. It never keeps the last block when ``D < L``.
    ``"spread"``: ``D`` blocks evenly spread from the first to the last, both kept (``round(i * (L - 1) / (D - 1))``,
    halves rounded up; ``D = 1`` keeps the first). For models whose output is read off the last block unchanged, such
    as a sentence encoder's pooled embedding, dropping that block costs far more than dropping one in the middle: on
    all-MiniLM-L6-v2, untrained, 3 of 6 layers keep a mean cosine of 0.66 to the full model's embeddings with this rule
    and 0.36 with ``"every_other"`` (``docs/benchmarks.md``, issue 25).

    A tuple is a *keep order*: every block index once, most important first (what
    :func:`subnetact.train.order_layers` measures); ``depth`` keeps the first ``depth`` of them, run in model order,
    so smaller depths are nested in larger ones.

    ``depth=0`` runs no block: a stage of skippable blocks may be switched off entirely (once-for-all's ResNet
    drops the residual block of its input stem, issue 4). Whether 0 is allowed is the space's choice.
    """
    if not 0 <= depth <= num_layers:
        raise ConfigError(f"depth={depth!r} must be between 0 and num_layers={num_layers}")
    if isinstance(rule, tuple):
        check_keep_order(rule, num_layers)
        return sorted(rule[:depth])
    if rule == PREFIX:
        return list(range(depth))
    if rule == EVERY_OTHER:
        return [i * num_layers // depth for i in range(depth)]
    if rule == SPREAD:
        if depth <= 1:
            return list(range(depth))
        return [(2 * i * (num_layers - 1) + depth - 1) // (2 * (depth - 1)) for i in range(depth)]
    raise ConfigError(f"rule={rule!r} is not one of {RULES}")


def check_keep_order(order: tuple[int, ...], num_layers: int) -> None:
    """Raise ``ConfigError`` unless ``order`` lists each of ``0 .. num_layers - 1`` exactly once."""
    if sorted(order) != list(range(num_layers)):
        raise ConfigError(
            f"depth_rule={order!r}: a keep order must list each of the stage's {num_layers} blocks (0 to "
            f"{num_layers - 1}) exactly once"
        )


def is_rule(rule: object) -> bool:
    """A named rule of :data:`RULES` or a keep order (a tuple of ints)."""
    if isinstance(rule, tuple):
        indices = all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in rule)
        return indices and len(set(rule)) == len(rule)
    return rule in RULES


class _StageSelect(Operator):
    """What the two stage containers share: the keep rule, the plan entry (the kept blocks) and the conversions.

    ``_container`` is the plain container class a stage is (``nn.Sequential`` or ``nn.ModuleList``).
    """

    _container: type[nn.Module]

    def _init_select(self, rule: str | tuple[int, ...]) -> None:
        if not is_rule(rule):
            raise ConfigError(f"rule={rule!r} is not one of {RULES} or a keep order (a tuple of block indices)")
        self.rule = rule
        # (depth entry, first position, end position) per elastic run of blocks, set by convert. One segment
        # covering every block is a whole stage; several segments are runs inside one flat Sequential (MobileNetV2's
        # ``features``), whose positions outside every segment always run.
        self.segments: list[tuple[int, int, int]] = []
        self.member_ops: list[list[int]] = []  # operator indices inside each position; set by convert
        self._container = type(self)._container

    @classmethod
    def from_module(cls, stage: nn.Module, rule: str = PREFIX):
        new = cls(rule=rule)
        # ``_modules``, not ``named_children()``: the latter skips a block object held twice, which would collapse
        # the stage.
        for name, block in stage._modules.items():
            new.add_module(name, block)
        new.training = stage.training
        if isinstance(stage, new._container):
            new._container = type(stage)  # a Sequential subclass (torchvision's AnyStage) is exported as itself
        return new

    @property
    def depth_entry(self) -> int:
        """The depth entry of the first segment (-1 before convert wires it)."""
        return self.segments[0][0] if self.segments else -1

    @depth_entry.setter
    def depth_entry(self, entry: int) -> None:
        self.segments = [(entry, 0, len(self._modules))]

    def kept_positions(self, cfg: SubnetConfig) -> list[int]:
        depth = cfg["depth"]
        kept: list[int] = []
        position = 0
        for entry, start, end in self.segments:
            kept.extend(range(position, start))
            kept.extend(start + i for i in kept_layers(end - start, int(depth[entry]), self.rule))
            position = end
        kept.extend(range(position, len(self._modules)))
        return kept

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: object) -> tuple[nn.Module, ...]:
        children = list(self._modules.values())
        return tuple(children[i] for i in self.kept_positions(cfg))

    def active_blocks(self) -> tuple[nn.Module, ...]:
        """The blocks the current subnet runs, in order."""
        return self._subnetact_state.current().entries[self._op_index]

    def _empty_container(self) -> nn.Module:
        new = self._container.__new__(self._container)
        nn.Module.__init__(new)
        return new

    def export_dense(self, entry: tuple[nn.Module, ...], rebuild) -> nn.Module:
        dense = self._empty_container()
        for i, block in enumerate(entry):
            dense.add_module(str(i), rebuild(block))
        dense.training = self.training
        return dense

    def to_base(self) -> nn.Module:
        base = self._empty_container()
        for name, block in self._modules.items():
            base.add_module(name, block)
        base.training = self.training
        return base

    def extra_repr(self) -> str:
        return f"rule={self.rule!r}"


class LayerSelect(_StageSelect, nn.Sequential):
    """A stage whose blocks are switched on and off by the active subnet's depth for this stage.

    It is an ``nn.Sequential`` holding the very same block modules under the same names, so the model's
    ``state_dict`` keys do not change. The block that changes the tensor shape (the first one of a ResNet stage)
    is always kept: depth choices start at 1.

    Shapes: ``x`` (N, C_in, H, W) -> (N, C_out, H', W'), as the stage it replaces.
    """

    _container = nn.Sequential

    def __init__(self, *blocks: nn.Module, rule: str = PREFIX) -> None:
        super().__init__(*blocks)
        self._init_select(rule)

    def forward(self, x):
        for block in self._subnetact_state.current().entries[self._op_index]:
            x = block(x)
        return x

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._modules.values())


class LayerSelectList(_StageSelect, nn.ModuleList):
    """:class:`LayerSelect` for a stage held in an ``nn.ModuleList`` whose owner loops over it (the encoder of a
    Hugging Face transformer: ``for layer in self.layer: hidden = layer(hidden, ...)``).

    The owner's loop stays as it is: iterating yields the blocks the active subnet runs, in order, so the owner
    runs exactly those, with whatever arguments it passes them. Everything else sees the full list:
    ``len()``, indexing, ``children()``, ``named_modules()`` and ``state_dict()`` cover every block under its
    original name, so checkpoints keep their keys.
    """

    _container = nn.ModuleList

    def __init__(self, blocks: list[nn.Module] | None = None, rule: str = PREFIX) -> None:
        super().__init__(blocks)
        self._init_select(rule)

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._subnetact_state.current().entries[self._op_index])

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            if range(len(self))[idx] == range(len(self)):
                # The owner's loop over all its layers (Llama: ``self.layers[: config.num_hidden_layers]``): the
                # active subnet's layers, as iterating the list gives.
                return self
            return nn.ModuleList(list(self._modules.values())[idx])  # a plain list of those positions
        return nn.ModuleList.__getitem__(self, idx)

    # ModuleList's repr iterates ``self`` (the active blocks only); show every block, as ``state_dict`` does.
    __repr__ = nn.Module.__repr__


@register_operator_kind("layer_select")
def select_layers(stage: nn.Module, entry: OperatorEntry) -> LayerSelect | LayerSelectList:
    """Handler of kind ``"layer_select"``: a stage (``nn.Sequential``, or an ``nn.ModuleList`` its owner loops over)
    keeping blocks by the rule in ``entry.options``."""
    cls = LayerSelectList if isinstance(stage, nn.ModuleList) else LayerSelect
    return cls.from_module(stage, entry.options)
