"""``convert``: Algorithm 1 of the SuperServe paper, the pass that inserts SubNetAct's operators into a model."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from torch import nn

from ._registry import ClassRegistry
from .errors import UnsupportedModelError
from .layer_select import PREFIX, LayerSelect, LayerSelectList
from .operator import Operator
from .rules import BlockSpec, ChannelSpec, find_block_rule, unsupported_block_error
from .space import Entry, Space
from .state import ActuationState, ChannelGroup
from .subnet_norm import SubnetNorm
from .supernet import SupernetMixin, state_of, supernet_class
from .weight_slice import WeightSliceConv2d, WeightSliceLinear

_SLICEABLE = (nn.Conv2d, nn.Linear)


@dataclass(frozen=True)
class ConvertConfig:
    """Options of :func:`convert`: the search space it builds.

    Args:
        width_choices: channel fractions every block may use, increasing. A block of C channels in groups of
            ``unit`` runs ``unit * ceil(w * C / unit)`` channels (``ceil(w * C)`` for ungrouped layers).
        min_depth: smallest number of blocks per stage (clamped to the stage's length; at least 1, because the
            first block of a stage changes the shape and always runs).
    """

    width_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    min_depth: int = 1

    def __post_init__(self) -> None:
        choices = tuple(self.width_choices)
        object.__setattr__(self, "width_choices", choices)
        if not choices:
            raise ValueError("width_choices=() must hold at least one fraction in (0, 1]")
        for w in choices:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w <= 1):
                raise ValueError(f"width_choices={choices!r}: every value must be a number in (0, 1], got {w!r}")
        if list(choices) != sorted(set(choices)):
            raise ValueError(f"width_choices={choices!r} must be strictly increasing")
        if isinstance(self.min_depth, bool) or not isinstance(self.min_depth, int) or self.min_depth < 1:
            raise ValueError(f"min_depth={self.min_depth!r} must be an int >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


def active_size(width: float, spec: ChannelSpec) -> int:
    """Channels a block of ``spec`` runs at ``width``: whole units, at least one."""
    units = spec.size // spec.unit
    # The 1e-9 keeps e.g. ceil(0.3 * 10) at 3 despite 0.3 * 10 == 3.0000000000000004.
    return spec.unit * max(1, math.ceil(width * units - 1e-9))


@dataclass
class _Stage:
    path: str
    module: nn.Sequential
    blocks: list[tuple[str, nn.Module, BlockSpec]]


def convert(
    model: nn.Module,
    config: ConvertConfig | None = None,
    *,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> nn.Module:
    """Rewrite ``model`` in place into an actuatable supernet and return it (the same object).

    The pass (Algorithm 1): every ``nn.Sequential`` whose children are all blocks with a registered rule is a
    *stage* and becomes a :class:`LayerSelect`; inside each block the layers producing, normalising and consuming the
    block's elastic channels become :class:`WeightSliceConv2d` / :class:`WeightSliceLinear`; every
    ``nn.BatchNorm2d`` of the model becomes a :class:`SubnetNorm` (a norm outside the elastic channels still sees
    activations that depend on the subnet, so it needs per-subnet statistics too). Parameters and buffers are the
    original tensors; ``state_dict()`` keys do not change. The root's class becomes a subclass of its own class
    that adds ``actuate``, ``space``, ``active``, ``export`` and ``forward(..., subnet=cfg)``. The residual stream
    is not sliced.

    Everything is validated before the first change: on error the model is left exactly as it was.

    Args:
        model: the supernet, e.g. any torchvision ResNet / ResNeXt / Wide ResNet.
        config: the search space to build (width choices, minimum depth); defaults to :class:`ConvertConfig()`.
        filter_fn: ``(stage_module, fqn) -> bool``; only stages it accepts become elastic. Default: all.

    Returns:
        ``model`` itself, now actuated on its largest subnet.

    Raises:
        UnsupportedModelError: no stage was found, or a block type has no rule (the message names the module
            path and type and how to register a rule), or the model is already converted.

    Example::

        >>> model = subnetact.convert(torchvision.models.resnet50())
        >>> model.actuate(depth=[2, 3, 4, 2], width=0.5)
        >>> y = model(torch.randn(1, 3, 224, 224))
    """
    config = ConvertConfig() if config is None else config
    if not isinstance(config, ConvertConfig):
        raise TypeError(f"config={config!r} must be a subnetact.ConvertConfig")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, SupernetMixin):
        raise UnsupportedModelError("model is already converted (call subnetact.unconvert(model) first)")

    # Phase 1: analyse and validate (no mutation). A model adapter, if one is registered for the model's class,
    # replaces the generic block-rule analysis.
    adapter = find_model_adapter(model)
    plan = adapter(model, config, filter_fn) if adapter is not None else analyse_blocks(model, config, filter_fn)
    # Phase 2: rewrite.
    apply_conversion(model, plan, config)
    return model


@dataclass
class StagePlan:
    """One ``LayerSelect`` to insert: the ``nn.Sequential`` at ``path`` (or an ``nn.ModuleList`` that its owner loops
    over, which becomes a :class:`LayerSelectList`), and how it keeps blocks."""

    path: str
    rule: str = PREFIX


@dataclass
class ConversionPlan:
    """What phase 2 of :func:`convert` does, computed and validated by phase 1 (block rules or a model adapter).

    Args:
        stages: the stages to wrap, in the order of the space's ``depth`` entries.
        dims: the search space's dimensions (``depth`` entries must match ``stages``).
        groups: the elastic channel groups.
        slices: conv/linear path -> (output group, input group), either None when not sliced.
        norms: BatchNorm path -> group (None: not sliced). Every other ``nn.BatchNorm2d`` becomes an unsliced
            SubnetNorm.
        custom: path -> factory building a user-defined :class:`~subnetact.operator.Operator` from the module there.
        prepare: called on the model first thing in phase 2, for adapters that restructure a model before operators
            go in (once-for-all: swap its dynamic wrappers for plain layers holding the same Parameters). Every
            other path of the plan refers to the prepared model. It must not fail on a model phase 1 accepted.
        links: keyword -> dimensions it sets together (:class:`~subnetact.Space` links), e.g.
            ``{"width": ("heads", "ffn")}``.
    """

    stages: list[StagePlan]
    dims: dict[str, list[Entry]]
    groups: list[ChannelGroup]
    slices: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    norms: dict[str, int | None] = field(default_factory=dict)
    custom: dict[str, Callable[[nn.Module], nn.Module]] = field(default_factory=dict)
    prepare: Callable[[nn.Module], None] | None = None
    links: dict[str, tuple[str, ...]] = field(default_factory=dict)


ModelAdapter = Callable[[nn.Module, ConvertConfig, "Callable[[nn.Module, str], bool] | None"], ConversionPlan]


def _load_builtin_adapters() -> None:
    from . import ofa  # noqa: F401  (registers once-for-all adapters by class name; does not import ofa)


_ADAPTERS: ClassRegistry[ModelAdapter] = ClassRegistry(_load_builtin_adapters)


def register_model_adapter(model_type: type | str) -> Callable[[ModelAdapter], ModelAdapter]:
    """Decorator registering a whole-model analysis ``(model, config, filter_fn) -> ConversionPlan`` for a class
    (or its ``"module.QualName"``), used instead of the generic block-rule analysis."""
    return _ADAPTERS.register(model_type)


def find_model_adapter(model: nn.Module) -> ModelAdapter | None:
    return _ADAPTERS.lookup(type(model))


def analyse_blocks(
    model: nn.Module, config: ConvertConfig, filter_fn: Callable[[nn.Module, str], bool] | None
) -> ConversionPlan:
    """The generic analysis: stages are ``nn.Sequential`` of blocks with registered rules; one ``width`` entry
    per block with elastic channels, one ``depth`` entry per stage."""
    stages = _find_stages(model, filter_fn)
    depth_entries, width_entries, groups = [], [], []
    slices: dict[str, tuple[int | None, int | None]] = {}
    norms: dict[str, int | None] = {}
    for stage in stages:
        n = len(stage.blocks)
        for pos, (path, block, spec) in enumerate(stage.blocks):
            if pos > 0 and not spec.skippable:
                raise UnsupportedModelError(
                    f"block {path!r} ({type(block).__qualname__}) changes the tensor shape but is not the first block "
                    f"of stage {stage.path!r}, so LayerSelect cannot skip it"
                )
            if spec.width is None:
                continue
            _check_channel_spec(path, block, spec.width)
            group = len(groups)
            sizes = tuple((w, active_size(w, spec.width)) for w in config.width_choices)
            groups.append(ChannelGroup("width", len(width_entries), spec.width.size, sizes))
            width_entries.append(Entry(path, config.width_choices))
            outs, ins = set(spec.width.producers), set(spec.width.consumers)
            for name in sorted(outs | ins):
                slices[f"{path}.{name}"] = (group if name in outs else None, group if name in ins else None)
            for name in spec.width.norms:
                norms[f"{path}.{name}"] = group
        depth_entries.append(Entry(stage.path, tuple(range(min(config.min_depth, n), n + 1))))
    dims = {"depth": depth_entries}
    if width_entries:
        dims["width"] = width_entries
    return ConversionPlan([StagePlan(s.path) for s in stages], dims, groups, slices, norms)


def apply_conversion(model: nn.Module, plan: ConversionPlan, config: ConvertConfig) -> None:
    """Phase 2 of :func:`convert`: insert the operators ``plan`` describes and wire the shared state."""
    space = Space(plan.dims, plan.links)  # validates the entries before anything changes
    if len(space.entries("depth")) != len(plan.stages):
        raise UnsupportedModelError(f"{len(plan.stages)} stages but {len(space.entries('depth'))} depth entries")
    if plan.prepare is not None:
        plan.prepare(model)
    for path, factory in plan.custom.items():
        _replace(model, path, factory(model.get_submodule(path)))
    for path, (out_group, in_group) in plan.slices.items():
        layer = model.get_submodule(path)
        cls = WeightSliceConv2d if isinstance(layer, nn.Conv2d) else WeightSliceLinear
        _replace(model, path, cls.from_module(layer, out_group, in_group))
    for path, group in plan.norms.items():
        _replace(model, path, SubnetNorm.from_module(model.get_submodule(path), group))
    for path, module in list(model.named_modules()):
        if type(module) is nn.BatchNorm2d:
            _replace(model, path, SubnetNorm.from_module(module, None))
    for stage in plan.stages:
        module = model.get_submodule(stage.path)
        cls = LayerSelectList if isinstance(module, nn.ModuleList) else LayerSelect
        _replace(model, stage.path, cls.from_module(module, stage.rule))

    ops = [m for m in model.modules() if isinstance(m, Operator)]
    index = {id(op): i for i, op in enumerate(ops)}
    for stage_index, stage in enumerate(plan.stages):
        ls = model.get_submodule(stage.path)
        ls.depth_entry = stage_index
        # children(), not iteration: a LayerSelectList iterates over the active blocks only.
        ls.member_ops = [[index[id(m)] for m in block.modules() if id(m) in index] for block in ls.children()]
    state = ActuationState(space, ops, plan.groups, config)
    for i, op in enumerate(ops):
        op._op_index = i
        op._subnetact_state = state
    model.__class__ = supernet_class(type(model))
    model._subnetact = state
    state.invalidate()


def unconvert(model: nn.Module) -> nn.Module:
    """Undo :func:`convert` in place: plain layers holding the same Parameters, the root's original class.

    Registered statistics are dropped; the BatchNorm layers keep the supernet's own running statistics.
    """
    state_of(model)
    for path, module in reversed(list(model.named_modules())):
        if isinstance(module, Operator):
            _replace(model, path, module.to_base())
    del model._subnetact
    model.__class__ = type(model)._subnetact_base
    return model


# -- helpers -------------------------------------------------------------------------------------------------------
def _find_stages(model: nn.Module, filter_fn: Callable[[nn.Module, str], bool] | None) -> list[_Stage]:
    stages: list[_Stage] = []
    inside_stage: list[str] = []
    unknown: list[tuple[str, nn.Module]] = []
    for path, module in model.named_modules():
        if any(path.startswith(prefix + ".") for prefix in inside_stage):
            continue
        if not isinstance(module, nn.Sequential) or len(module) == 0:
            continue
        children = list(module.named_children())
        rules = [find_block_rule(child) for _, child in children]
        if not any(rules):
            unknown.extend(
                (f"{path}.{name}" if path else name, child) for name, child in children if _looks_like_block(child)
            )
            continue
        for (name, child), rule in zip(children, rules):
            if rule is None:
                raise unsupported_block_error(f"{path}.{name}" if path else name, child)
        if not path:
            raise UnsupportedModelError(
                f"the root module ({type(model).__qualname__}) is itself a stage of blocks; wrap it in a container "
                "module so convert can replace it in place"
            )
        if filter_fn is not None and not filter_fn(module, path):
            continue
        blocks = [(f"{path}.{name}", child, rule(child)) for (name, child), rule in zip(children, rules)]
        for block_path, _, spec in blocks:
            if not isinstance(spec, BlockSpec):
                raise TypeError(f"the block rule for {block_path!r} returned {spec!r}, not a subnetact.BlockSpec")
        stages.append(_Stage(path, module, blocks))
        inside_stage.append(path)
    if not stages:
        if unknown:
            raise unsupported_block_error(*unknown[0])
        raise UnsupportedModelError(
            f"found no stage in {type(model).__qualname__}: convert needs nn.Sequential containers of blocks with a "
            "registered rule (see subnetact.register_block_rule)"
        )
    return stages


def _looks_like_block(module: nn.Module) -> bool:
    if isinstance(module, (*_SLICEABLE, nn.BatchNorm2d, nn.Sequential)):
        return False
    return any(isinstance(m, _SLICEABLE) for m in module.modules())


def _check_channel_spec(path: str, block: nn.Module, spec: ChannelSpec) -> None:
    def get(name: str, kinds: tuple[type, ...]) -> nn.Module:
        try:
            layer = block.get_submodule(name)
        except AttributeError:
            raise UnsupportedModelError(
                f"block rule for {path!r} names {name!r}, which the block does not have"
            ) from None
        if type(layer) not in kinds:
            raise UnsupportedModelError(
                f"block rule for {path!r} names {name!r} of type {type(layer).__qualname__}; "
                f"expected one of {[k.__name__ for k in kinds]}"
            )
        return layer

    def out_size(layer: nn.Module) -> int:
        return layer.out_channels if isinstance(layer, nn.Conv2d) else layer.out_features

    def in_size(layer: nn.Module) -> int:
        return layer.in_channels if isinstance(layer, nn.Conv2d) else layer.in_features

    for name in spec.producers:
        layer = get(name, _SLICEABLE)
        if out_size(layer) != spec.size:
            raise UnsupportedModelError(f"{path}.{name} has {out_size(layer)} output channels, rule says {spec.size}")
    for name in spec.consumers:
        layer = get(name, _SLICEABLE)
        if in_size(layer) != spec.size:
            raise UnsupportedModelError(f"{path}.{name} has {in_size(layer)} input channels, rule says {spec.size}")
        if isinstance(layer, nn.Conv2d) and layer.groups > 1:
            if name not in spec.producers:
                raise UnsupportedModelError(f"grouped convolution {path}.{name} must be a producer of the same group")
            if spec.unit % (layer.out_channels // layer.groups):
                raise UnsupportedModelError(
                    f"{path}.{name} has groups of {layer.out_channels // layer.groups} channels; unit={spec.unit} "
                    "must keep whole groups"
                )
    for name in spec.norms:
        layer = get(name, (nn.BatchNorm2d,))
        if layer.num_features != spec.size:
            raise UnsupportedModelError(f"{path}.{name} has {layer.num_features} features, rule says {spec.size}")


def _replace(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, new)
