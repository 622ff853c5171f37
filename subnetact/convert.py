"""``convert``: Algorithm 1 of the SuperServe paper, the pass that inserts SubNetAct's operators into a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from .errors import ConfigError, UnsupportedModelError
from .examples import detached_copy, example_call, one_thread, trace_model
from .graph import analyse_trace
from .handlers import OperatorEntry, build_operator, check_kinds
from .layer_select import check_keep_order
from .operator import Operator
from .plan import (  # noqa: F401  (ConvertConfig, register_model_adapter: kept importable from here)
    ConversionPlan,
    ConvertConfig,
    StagePlan,
    depth_choices,
    find_model_adapter,
    register_model_adapter,
)
from .rules import BlockSpec, ChannelSpec, find_block_rule, unsupported_block_error
from .space import Entry, Space
from .state import ActuationState, ChannelGroup, state_of, width_sizes
from .supernet import SupernetMixin, from_supernet, to_supernet
from .trace import sliceable_kind
from .verify import MODE_SENSITIVE, check_largest, check_subnets, plain_output, same_output
from .weight_cache import check_budget_mb

_SLICEABLE = (nn.Conv2d, nn.Linear)


@dataclass
class _Stage:
    path: str
    module: nn.Module
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

    Layers whose weights, buffers or sizes code outside them reads (``F.linear(x, self.fc1.weight)``,
    ``self.conv1.out_channels``) or that recompute their weight (weight norm) keep their full width.

    Before returning, the converted model runs the example input at its largest subnet, whose output must equal the
    original model's bit for bit, and at its smallest and one random (seeded) subnet, whose outputs must have the
    original's shapes and equal their own :func:`~subnetact.export` (bit for bit, or within float rounding where the
    kernels differ). Everything is validated first and any failure undoes the conversion: on error the model is left
    exactly as it was.

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
            channel groups: the module path and the operation that blocks them, e.g. "'fc1.weight' is read outside
            'fc1' at 'head' (linear)"), the converted model fails the checks above, or the model is already
            converted.
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

    # Phase 1: analyse and validate (no mutation): a model adapter registered for the model's class, else block
    # rules and the trace.
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
                check_subnets(model, call, reference)
            except BaseException:
                rollback(model, replaced)
                raise
        if plan.check is not None:  # an adapter's own convert-time check (decoders: on a tiny input it builds)
            try:
                plan.check(model)
            except BaseException:
                rollback(model, replaced)
                raise
        if example_inputs is not None and call is not None:
            state_of(model).example_call = detached_copy(call)  # for ``save``: ``load`` converts the same way
    if weight_cache_mb is not None:
        model.set_weight_cache(weight_cache_mb)
    return model


def analyse_model(
    model: nn.Module,
    config: ConvertConfig,
    filter_fn: Callable[[nn.Module, str], bool] | None,
    example_inputs: Any,
) -> tuple[ConversionPlan, tuple[tuple, dict] | None, Any, bool]:
    """Phase 1 of :func:`convert`: a model adapter's plan if one is registered for the model's class, else the
    block rules' plan merged with the trace's.

    Every plan is verified the same way whenever an example input exists (the caller's, or for the default analysis
    one built from the model's first layer): an adapter's plan is checked against a plain forward of the original.

    Returns:
        The plan, the example call ``(args, kwargs)`` to verify with (None: no input, nothing to verify), the
        original model's output on it, and whether that output is the trace's (True) or a plain forward's.
    """
    adapter = find_model_adapter(model)
    plan = None if adapter is None else adapter(model, config, filter_fn)
    if plan is not None:
        if example_inputs is None:
            return plan, None, None, False
        call = example_call(example_inputs)
        return plan, call, plain_output(model, call), False
    rule_stages = _find_stages(model, filter_fn)
    rules = analyse_blocks(model, config, rule_stages)
    found = trace_model(model, example_inputs, required=not rule_stages)
    if found is None:
        return rules, None, None, False
    call, trace = found
    # The original model's output, to check the converted one against, is the trace's: the trace runs the model's
    # own kernels (leaves outside its mode). Saves one forward, which is most of convert's time on large models.
    traced = not any(isinstance(m, MODE_SENSITIVE) for m in model.modules())
    reference = trace.output if traced else plain_output(model, call)
    graph = analyse_trace(
        model,
        trace,
        config.width_choices,
        min_depth=config.min_depth,
        covered=_covered_by(rule_stages),
        filter_fn=filter_fn,
    )
    plan = rules.merge(graph)
    if not plan.is_elastic():
        why = "; ".join(graph.blocked[:3]) or "it has no conv/linear layer whose channels could shrink"
        raise UnsupportedModelError(
            f"nothing in {type(model).__qualname__} can be made elastic: no residual block y = x + f(x) inside an "
            f"nn.Sequential, and every channel group stays at full width ({why})"
        )
    return plan, call, reference, traced


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
            sizes = width_sizes(spec.width.size, config.width_choices, spec.width.unit)
            groups.append(ChannelGroup("width", len(width_entries), spec.width.size, sizes))
            width_entries.append(Entry(path, config.width_choices))
            outs, ins = set(spec.width.producers), set(spec.width.consumers)
            for name in sorted(outs | ins):
                slices[f"{path}.{name}"] = (group if name in outs else None, group if name in ins else None)
            for name in spec.width.norms:
                norms[f"{path}.{name}"] = group
        depth_entries.append(Entry(stage.path, depth_choices(n, config.min_depth)))
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
    entries = plan.entries()
    check_kinds(entries)  # an unknown operator kind fails here, before the model changes
    if plan.prepare is not None:
        plan.prepare(model)
    replaced: list[tuple[nn.Module, str, Any]] = []
    try:
        _insert_operators(model, plan, entries, replaced, config.depth_rule)
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
            op.bind(state, i)
        to_supernet(model, state)
        state.invalidate()
    except BaseException:
        rollback(model, replaced)
        raise
    return replaced


def _insert_operators(
    model: nn.Module,
    plan: ConversionPlan,
    entries: list[tuple[str, OperatorEntry]],
    replaced: list,
    depth_rule: str | tuple[int, ...] | None = None,
) -> None:
    """Replace every planned module by the operator its kind's handler builds (:mod:`subnetact.handlers`), every
    other BatchNorm by an unsliced :class:`SubnetNorm`, and every stage by a :class:`LayerSelect` that keeps blocks
    by ``depth_rule`` (:attr:`ConvertConfig.depth_rule`) or, when that is ``None``, by the stage's plan."""
    for path, entry in entries:
        _replace(model, path, build_operator(path, model.get_submodule(path), entry), replaced)
    unsliced = OperatorEntry("norm", (None,))
    for path, module in list(model.named_modules()):
        if sliceable_kind(module) == "norm" and not isinstance(module, Operator):
            _replace(model, path, build_operator(path, module, unsliced), replaced)
    for path in dict.fromkeys(stage.path for stage in plan.stages):
        rule = depth_rule or next(s.rule for s in plan.stages if s.path == path)
        if isinstance(rule, tuple):  # a keep order names every block of the stage
            check_keep_order(rule, len(model.get_submodule(path)))
        select = OperatorEntry("layer_select", (), rule)
        _replace(model, path, build_operator(path, model.get_submodule(path), select), replaced)


def rollback(model: nn.Module, replaced: list[tuple[nn.Module, str, Any]]) -> None:
    """Undo :func:`apply_conversion`: put every original module back and restore the root's class."""
    for parent, name, original in reversed(replaced):
        setattr(parent, name, original)
    replaced.clear()
    from_supernet(model)


def unconvert(model: nn.Module) -> nn.Module:
    """Undo :func:`convert` in place: plain layers holding the same Parameters, the root's original class.

    Registered statistics are dropped; the BatchNorm layers keep the supernet's own running statistics.
    """
    state_of(model)
    for path, module in reversed(list(model.named_modules())):
        if isinstance(module, Operator):
            _replace(model, path, module.to_base())
    from_supernet(model)
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
        if any(spec is None for _, _, spec in blocks):
            # A rule declined its block (a ResNet with FrozenBatchNorm2d): the whole stage goes to the trace, whose
            # conversion is verified like every other.
            continue
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
