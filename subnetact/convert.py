"""``convert``: Algorithm 1 of the SuperServe paper, the pass that inserts SubNetAct's operators into a model."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

from ._registry import ClassRegistry
from .attention import attention_operators
from .errors import ConfigError, UnsupportedModelError
from .graph import analyse_trace
from .layer_select import PREFIX, LayerSelect, LayerSelectList
from .operator import Operator
from .rules import BlockSpec, ChannelSpec, find_block_rule, unsupported_block_error
from .slimmable_norm import slimmable_norm
from .space import Entry, Space
from .state import ActuationState, ChannelGroup
from .subnet_norm import SubnetNorm
from .supernet import SupernetMixin, state_of, supernet_class
from .trace import sliceable_kind
from .verify import (
    MODE_SENSITIVE,
    check_largest,
    check_smallest,
    detached_copy,
    one_thread,
    plain_output,
    same_output,
    trace_model,
)
from .weight_cache import check_budget_mb
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
            raise ConfigError("width_choices=() must hold at least one fraction in (0, 1]")
        for w in choices:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w <= 1):
                raise ConfigError(f"width_choices={choices!r}: every value must be a number in (0, 1], got {w!r}")
        if list(choices) != sorted(set(choices)):
            raise ConfigError(f"width_choices={choices!r} must be strictly increasing")
        if isinstance(self.min_depth, bool) or not isinstance(self.min_depth, int) or self.min_depth < 1:
            raise ConfigError(f"min_depth={self.min_depth!r} must be an int >= 1")

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
    example_inputs: Any = None,
    weight_cache_mb: float | None = None,
) -> nn.Module:
    """Rewrite ``model`` in place into an actuatable supernet and return it (the same object).

    The pass (Algorithm 1) finds the model's elastic dimensions and inserts SubNetAct's operators:

    - by default from one traced forward on an example input (:mod:`subnetact.trace`, :mod:`subnetact.graph`):
      every channel group that only sliceable layers read becomes elastic (one ``width`` entry per block owning
      groups), and every run of residual blocks ``y = x + f(x)`` in an ``nn.Sequential`` becomes a ``depth`` entry;
    - block rules (:func:`register_block_rule`) override the trace for the blocks they know (the built-in ones cover
      torchvision's ResNets), and a model adapter (once-for-all, Hugging Face) replaces the analysis entirely.

    Layers producing, normalising and consuming elastic channels become :class:`WeightSliceConv2d` /
    :class:`WeightSliceLinear` / :class:`SubnetNorm`; stages become :class:`LayerSelect`; every other
    ``nn.BatchNorm2d`` becomes an unsliced :class:`SubnetNorm` (its input still depends on the subnet). Parameters and
    buffers are the original tensors; ``state_dict()`` keys do not change. The root's class becomes a subclass of
    its own class that adds ``actuate``, ``space``, ``active``, ``export`` and ``forward(..., subnet=cfg)``. Residual
    streams are not sliced.

    Before returning, the converted model runs the example input at its largest subnet, whose output must equal the
    original model's bit for bit, and at its smallest, whose outputs must have the original's shapes. Everything is
    validated first and any failure undoes the conversion: on error the model is left exactly as it was.

    Args:
        model: the model to convert.
        config: the search space to build (width choices, minimum depth); defaults to :class:`ConvertConfig()`.
        filter_fn: ``(module, fqn) -> bool`` called on each candidate stage and each owner of channel groups; only
            those it accepts become elastic. Default: all.
        example_inputs: what ``model`` takes: a tensor, a tuple of positional arguments or a dict of keyword
            arguments (batch 1 is enough). Default: an image batch built from the first convolution (trying a few
            sizes, or the model's ``image_size``) or a vector batch for the first linear layer. The converted model
            keeps a detached CPU copy, which :func:`subnetact.save` records so :func:`subnetact.load` converts a
            fresh model the same way.
        weight_cache_mb: the budget of the CPU weight cache in MB (contiguous copies of registered subnets'
            strided convolution slices; ``model.set_weight_cache`` changes it later); None: the default (8 % of the
            supernet's weights), 0: off.

    Returns:
        ``model`` itself, now actuated on its largest subnet.

    Raises:
        UnsupportedModelError: nothing in the model can be made elastic (the message says why for the largest
            channel groups: the module path and the operation that blocks them), the converted model fails the check
            above, or the model is already converted.
        ConfigError: ``config``, ``example_inputs`` or ``weight_cache_mb`` is not valid.

    Example::

        >>> model = subnetact.convert(torchvision.models.resnet50())
        >>> model.actuate(depth=[2, 3, 4, 2], width=0.5)
        >>> y = model(torch.randn(1, 3, 224, 224))
    """
    config = ConvertConfig() if config is None else config
    if not isinstance(config, ConvertConfig):
        raise ConfigError(f"config={config!r} must be a subnetact.ConvertConfig")
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, SupernetMixin):
        raise UnsupportedModelError("model is already converted (call subnetact.unconvert(model) first)")
    check_budget_mb(weight_cache_mb, "convert: weight_cache_mb")

    # Phase 1: analyse and validate (no mutation). A model adapter, if one is registered for the model's class,
    # replaces the analysis and is trusted to be exact (its own tests check parity with its reference).
    adapter = find_model_adapter(model)
    plan = None if adapter is None else adapter(model, config, filter_fn)
    if plan is not None:
        replaced = apply_conversion(model, plan, config)
        if plan.check is not None:
            try:
                plan.check(model)
            except BaseException:
                rollback(model, replaced)
                raise
        if weight_cache_mb is not None:
            model.set_weight_cache(weight_cache_mb)
        return model
    with one_thread():
        plan, call, reference, traced = analyse_model(model, config, filter_fn, example_inputs)
        # Phase 2: rewrite, then check; undo everything on failure.
        replaced = apply_conversion(model, plan, config)
        if call is not None:
            try:
                largest = plain_output(model, call)
                if traced and not same_output(largest, reference):
                    # The reference came from the trace's forward; should it differ from a plain forward in the
                    # last bits (a fast path that a mode switches off, outside the leaves the trace runs plainly),
                    # ask the original model itself before refusing.
                    rollback(model, replaced)
                    reference = plain_output(model, call)
                    replaced = apply_conversion(model, plan, config)
                check_largest(model, largest, reference)
                check_smallest(model, call, reference)
            except BaseException:
                rollback(model, replaced)
                raise
        if example_inputs is not None and call is not None:
            model._subnetact.example_call = detached_copy(call)  # for ``save``: ``load`` converts the same way
    if weight_cache_mb is not None:
        model.set_weight_cache(weight_cache_mb)
    return model


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
        check: called on the converted model after phase 2 (an adapter's convert-time verification, e.g. the
            largest subnet reproducing the original output); an exception rolls the conversion back.
    """

    stages: list[StagePlan]
    dims: dict[str, list[Entry]]
    groups: list[ChannelGroup]
    slices: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    norms: dict[str, int | None] = field(default_factory=dict)
    custom: dict[str, Callable[[nn.Module], nn.Module]] = field(default_factory=dict)
    prepare: Callable[[nn.Module], None] | None = None
    links: dict[str, tuple[str, ...]] = field(default_factory=dict)
    check: Callable[[nn.Module], None] | None = None


ModelAdapter = Callable[[nn.Module, ConvertConfig, "Callable[[nn.Module, str], bool] | None"], "ConversionPlan | None"]


_ADAPTERS: ClassRegistry[ModelAdapter] = ClassRegistry()  # built-ins: subnetact/builtins.py


def register_model_adapter(model_type: type | str) -> Callable[[ModelAdapter], ModelAdapter]:
    """Decorator registering a whole-model analysis ``(model, config, filter_fn) -> ConversionPlan | None`` for a
    class (or its ``"module.QualName"``), used instead of the default analysis; returning None hands the model to
    the default analysis."""
    return _ADAPTERS.register(model_type)


def find_model_adapter(model: nn.Module) -> ModelAdapter | None:
    return _ADAPTERS.lookup(type(model))


def analyse_model(
    model: nn.Module,
    config: ConvertConfig,
    filter_fn: Callable[[nn.Module, str], bool] | None,
    example_inputs: Any,
) -> tuple[ConversionPlan, tuple[tuple, dict] | None, Any, bool]:
    """The default analysis: block rules where they apply, the trace everywhere else.

    Returns:
        The plan, the example call ``(args, kwargs)`` to verify with (None: no input could be built and the rules
        alone were used), the original model's output on it, and whether that output is the trace's (True) or a
        plain forward's.
    """
    rule_stages = _find_stages(model, filter_fn)
    rules = analyse_blocks(model, config, rule_stages)
    covered = _covered_by(rule_stages)
    found = trace_model(model, example_inputs, required=not rule_stages)
    if found is None:
        return rules, None, None, False
    call, trace = found
    # The original model's output, to check the converted one against, is the trace's: the trace runs the model's
    # own kernels (leaves outside its mode). Saves one forward, which is most of convert's time on large models.
    traced = not any(isinstance(m, MODE_SENSITIVE) for m in model.modules())
    reference = trace.output if traced else plain_output(model, call)
    graph = analyse_trace(model, trace, config.width_choices, covered=covered, filter_fn=filter_fn)

    stages = list(rules.stages)
    depth = list(rules.dims.get("depth", []))
    for path, start, end, n in graph.stages:
        whole = start == 0 and end == len(model.get_submodule(path)._modules)
        stages.append(StagePlan(path, PREFIX, start, end))
        depth.append(Entry(path if whole else f"{path}[{start}:{end}]", tuple(range(min(config.min_depth, n), n + 1))))
    width = list(rules.dims.get("width", []))
    offset_entries, offset_groups = len(width), len(rules.groups)
    width += [Entry(name, config.width_choices) for name in graph.width_names]
    groups = list(rules.groups) + [
        ChannelGroup(g.dim, g.index + offset_entries, g.full, g.sizes) for g in graph.groups
    ]

    def shift(g: int | None) -> int | None:
        return None if g is None else g + offset_groups

    slices = dict(rules.slices)
    slices.update({path: (shift(o), shift(i)) for path, (o, i) in graph.slices.items()})
    norms = {path: shift(g) for path, g in graph.norms.items()}
    norms.update(rules.norms)
    custom: dict[str, Callable[[nn.Module], nn.Module]] = {}
    for path, g in graph.heads.items():
        factories, layers = attention_operators(model.get_submodule(path), path, shift(g))
        custom.update(factories)
        slices.update(layers)
    if not groups and not any(len(e.choices) > 1 for e in depth):
        why = "; ".join(graph.blocked[:3]) or "it has no conv/linear layer whose channels could shrink"
        raise UnsupportedModelError(
            f"nothing in {type(model).__qualname__} can be made elastic: no residual block y = x + f(x) inside an "
            f"nn.Sequential, and every channel group stays at full width ({why})"
        )
    dims = {}
    if depth:
        dims["depth"] = depth
    if width:
        dims["width"] = width
    return ConversionPlan(stages, dims, groups, slices, norms, custom), call, reference, traced


def analyse_blocks(model: nn.Module, config: ConvertConfig, stages: list[_Stage]) -> ConversionPlan:
    """The block-rule analysis: one ``depth`` entry per stage of ruled blocks, one ``width`` entry per block with
    elastic channels."""
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
    dims = {}
    if depth_entries:
        dims["depth"] = depth_entries
    if width_entries:
        dims["width"] = width_entries
    return ConversionPlan([StagePlan(s.path) for s in stages], dims, groups, slices, norms)


def _covered_by(stages: list[_Stage]) -> Callable[[str], bool]:
    """``path -> bool``: whether a block rule handles the module at ``path`` (a ruled stage or inside a ruled
    block)."""
    names = {s.path for s in stages} | {path for s in stages for path, _, _ in s.blocks}

    def covered(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1))

    return covered


def apply_conversion(
    model: nn.Module, plan: ConversionPlan, config: ConvertConfig
) -> list[tuple[nn.Module, str, Any]]:
    """Phase 2 of :func:`convert`: insert the operators ``plan`` describes and wire the shared state.

    Returns:
        ``(parent, name, original module)`` for every replacement, in order, for :func:`rollback`.
    """
    space = Space(plan.dims, plan.links)  # validates the entries before anything changes
    n_depth = len(space.entries("depth")) if "depth" in space.dims else 0
    if n_depth != len(plan.stages):
        raise UnsupportedModelError(f"{len(plan.stages)} stages but {n_depth} depth entries")
    if plan.prepare is not None:
        plan.prepare(model)
    replaced: list[tuple[nn.Module, str, Any]] = []
    try:
        _insert_operators(model, plan, replaced)
        ops = [m for m in model.modules() if isinstance(m, Operator)]
        index = {id(op): i for i, op in enumerate(ops)}
        by_path: dict[str, list[tuple[int, StagePlan]]] = {}
        for stage_index, stage in enumerate(plan.stages):
            by_path.setdefault(stage.path, []).append((stage_index, stage))
        for path, segments in by_path.items():
            ls = model.get_submodule(path)
            n = len(ls._modules)
            ls.segments = sorted(
                ((i, s.start, n if s.end is None else s.end) for i, s in segments), key=lambda seg: seg[1]
            )
            # ``_modules``, not children(): a LayerSelectList iterates over the active blocks only, and children()
            # skips a block object held twice.
            ls.member_ops = [
                [index[id(m)] for m in block.modules() if id(m) in index] for block in ls._modules.values()
            ]
        state = ActuationState(space, ops, plan.groups, config)
        for i, op in enumerate(ops):
            op._op_index = i
            op._subnetact_state = state
        model.__class__ = supernet_class(type(model))
        model._subnetact = state
        state.invalidate()
    except BaseException:
        rollback(model, replaced)
        raise
    return replaced


def _insert_operators(model: nn.Module, plan: ConversionPlan, replaced: list) -> None:
    for path, factory in plan.custom.items():
        _replace(model, path, factory(model.get_submodule(path)), replaced)
    for path, (out_group, in_group) in plan.slices.items():
        layer = model.get_submodule(path)
        cls = WeightSliceConv2d if isinstance(layer, nn.Conv2d) else WeightSliceLinear
        _replace(model, path, cls.from_module(layer, out_group, in_group), replaced)
    for path, group in plan.norms.items():
        norm = model.get_submodule(path)
        if isinstance(norm, (nn.LayerNorm, nn.GroupNorm)):
            _replace(model, path, slimmable_norm(norm, group), replaced)
        else:
            _replace(model, path, SubnetNorm.from_module(norm, group), replaced)
    for path, module in list(model.named_modules()):
        if sliceable_kind(module) == "norm" and not isinstance(module, Operator):
            _replace(model, path, SubnetNorm.from_module(module, None), replaced)
    for path in dict.fromkeys(stage.path for stage in plan.stages):
        module = model.get_submodule(path)
        cls = LayerSelectList if isinstance(module, nn.ModuleList) else LayerSelect
        rule = next(s.rule for s in plan.stages if s.path == path)
        _replace(model, path, cls.from_module(module, rule), replaced)


def rollback(model: nn.Module, replaced: list[tuple[nn.Module, str, Any]]) -> None:
    """Undo :func:`apply_conversion`: put every original module back and restore the root's class."""
    for parent, name, original in reversed(replaced):
        setattr(parent, name, original)
    replaced.clear()
    base = getattr(type(model), "_subnetact_base", None)
    if base is not None and isinstance(model, SupernetMixin):
        model.__class__ = base
    model.__dict__.pop("_subnetact", None)


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
    for path, module in model.named_modules():
        if any(path.startswith(prefix + ".") for prefix in inside_stage):
            continue
        if not isinstance(module, nn.Sequential) or len(module) == 0:
            continue
        children = list(module._modules.items())
        rules = [find_block_rule(child) for _, child in children]
        if not any(rules):
            continue
        for (name, child), rule in zip(children, rules):
            if rule is None:
                # A stage mixing ruled and unknown blocks: converting only part of it would be a silent partial
                # conversion.
                raise unsupported_block_error(f"{path}.{name}" if path else name, child)
        if len({id(child) for _, child in children}) != len(children):
            raise UnsupportedModelError(
                f"stage {path!r} holds the same block object at several positions; LayerSelect cannot skip one of "
                "them without skipping the others"
            )
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
                raise UnsupportedModelError(
                    f"the block rule for {block_path!r} returned {spec!r}, not a subnetact.BlockSpec"
                )
        stages.append(_Stage(path, module, blocks))
        inside_stage.append(path)
    return stages


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


def _replace(root: nn.Module, path: str, new: nn.Module, replaced: list | None = None) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    if replaced is not None:
        replaced.append((parent, name, parent._modules[name]))
    setattr(parent, name, new)
