"""The default analysis of :func:`subnetact.convert`: a :class:`~subnetact.plan.ConversionPlan` from one traced
forward (see :mod:`subnetact.trace`), for models no rule or adapter knows.

- **Width**: every channel group the trace left unfrozen becomes elastic. Groups are named after the module that owns
  them (the nearest module above all their layers that is not a container); the groups of one owner share one
  ``width`` entry, so a bottleneck block's two middle widths move together, as the built-in ResNet rule does.
- **Depth**: a module computing ``y = x + f(x)`` with equal shapes, called once, held directly by a plain
  ``nn.Sequential``, may be skipped. Each maximal run of such blocks in a Sequential, together with the block in
  front of it (always kept: it usually changes the shape), is one ``depth`` entry. A run may sit in the middle of a
  flat Sequential (MobileNetV2's ``features``); module names and ``state_dict`` keys do not change.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .attention import head_layout
from .handlers import OperatorEntry
from .layer_select import PREFIX
from .plan import ConversionPlan, StagePlan, depth_choices
from .space import Entry
from .state import ChannelGroup, width_sizes
from .trace import ChannelTrace, is_residual

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def analyse_trace(
    model: nn.Module,
    trace: ChannelTrace,
    width_choices: tuple[float, ...],
    *,
    min_depth: int = 1,
    covered: Callable[[str], bool] = lambda path: False,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> ConversionPlan:
    """Turn a trace into a plan: stages, channel groups and the operator each layer becomes.

    ``blocked`` of the plan says why groups were left at full width, most channels first.

    Args:
        min_depth: smallest depth of a stage (clamped to its length).
        covered: ``path -> bool``: layers and Sequentials another analysis (block rules) already handles; groups
            touching them and stages at them are left out.
        filter_fn: ``(module, path) -> bool`` on each candidate stage Sequential and each group's owner; rejected
            ones stay fixed.
    """
    uf = trace.groups
    # A layer runs one slicing: all its calls' output (input) variables are the same channels.
    for path, use in trace.layers.items():
        for variables in (use.outs, use.ins):
            for g in variables[1:]:
                uf.union(variables[0], g, f"module {path!r} (called {use.calls} times)")
    members: dict[int, list[str]] = {}
    has_producer: set[int] = set()
    for path, use in trace.layers.items():
        for g in {uf.find(g) for g in use.outs + use.ins}:
            members.setdefault(g, []).append(path)
        if use.kind in ("conv", "linear"):
            has_producer.update(uf.find(g) for g in use.outs)
    modules = dict(model.named_modules())

    elastic: dict[int, str] = {}  # root -> owner path
    blocked: list[tuple[int, str]] = []
    for root in sorted(members):
        paths = members[root]
        reason = uf.reason(root)
        if reason is None and root not in has_producer:
            reason = "no conv/linear layer produces them"
        if reason is None and uf.size[root] // uf.unit[root] < 2:
            reason = f"{uf.size[root]} channels in groups of {uf.unit[root]} cannot shrink"
        if reason is None and any(covered(p) for p in paths):
            continue  # a block rule owns these layers
        owner = _owner(paths, modules)
        if reason is None and filter_fn is not None and not filter_fn(modules[owner], owner):
            reason = f"filter_fn rejected {owner!r}"
        if reason is not None:
            blocked.append((uf.size[root], f"{uf.size[root]} channels of {paths[0]!r}: {reason}"))
            continue
        elastic[root] = owner if owner else paths[0]

    width_names: list[str] = []
    groups: list[ChannelGroup] = []
    index: dict[int, int] = {}
    for root, name in elastic.items():
        if name not in width_names:
            width_names.append(name)
        index[root] = len(groups)
        sizes = width_sizes(uf.size[root], width_choices, uf.unit[root])
        groups.append(ChannelGroup("width", width_names.index(name), uf.size[root], sizes))

    slices: dict[str, tuple[int | None, int | None]] = {}
    norms: dict[str, int | None] = {}
    operators: dict[str, OperatorEntry] = {}
    for path, use in trace.layers.items():
        out = index.get(uf.find(use.outs[0])) if use.outs else None
        inp = index.get(uf.find(use.ins[0])) if use.ins else None
        if use.kind == "norm":
            norms[path] = inp
        elif use.kind in ("layernorm", "groupnorm"):
            if inp is not None:  # a LayerNorm / GroupNorm of a full-width dimension stays a plain module
                operators[path] = OperatorEntry("slimmable_norm", (inp,))
        elif out is not None or inp is not None:
            slices[path] = (out, inp)

    # Attention heads: each attention's heads are one group of whole heads, its own width entry.
    for path in trace.attentions:
        if covered(path):
            continue
        module = modules[path]
        layout = trace.outside.get(path) or head_layout(module)
        if isinstance(layout, str):
            blocked.append((0, f"heads of {path!r}: {layout}"))
            continue
        if filter_fn is not None and not filter_fn(module, path):
            blocked.append((0, f"heads of {path!r}: filter_fn rejected it"))
            continue
        n_heads, head_dim = layout
        width_names.append(path)
        operators[path] = OperatorEntry("attention", (len(groups),))
        sizes = width_sizes(n_heads * head_dim, width_choices, head_dim)
        groups.append(ChannelGroup("width", len(width_names) - 1, n_heads * head_dim, sizes))

    blocked += [(size, f"{size} channels of {path!r}: {why}") for path, (size, why) in trace.unsliced.items()]
    stages, depth = [], []
    for path, start, end in _stages(model, trace, modules, covered, filter_fn):
        whole = start == 0 and end == len(modules[path]._modules)
        stages.append(StagePlan(path, PREFIX, start, end))
        depth.append(Entry(path if whole else f"{path}[{start}:{end}]", depth_choices(end - start, min_depth)))
    dims = {}
    if depth:
        dims["depth"] = depth
    if width_names:
        dims["width"] = [Entry(name, width_choices) for name in width_names]
    blocked.sort(key=lambda item: -item[0])
    return ConversionPlan(
        stages, dims, groups, slices, norms, operators=operators, blocked=[text for _, text in blocked]
    )


def _owner(paths: list[str], modules: dict[str, nn.Module]) -> str:
    """The nearest module above every path that is not a container ("" for the root)."""
    parts = [p.split(".") for p in paths]
    common: list[str] = []
    for names in zip(*parts):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    if len(paths) == 1:
        common = common[:-1]  # one layer: its parent owns it
    while common and isinstance(modules.get(".".join(common)), _CONTAINERS):
        common.pop()
    return ".".join(common)


def _stages(
    model: nn.Module,
    trace: ChannelTrace,
    modules: dict[str, nn.Module],
    covered: Callable[[str], bool],
    filter_fn: Callable[[nn.Module, str], bool] | None,
) -> list[tuple[str, int, int]]:
    """``(Sequential path, first position, end position)`` of each run of skippable blocks."""
    skippable = {
        call.path
        for call in trace.calls
        if call.path and trace.call_counts.get(call.path) == 1 and is_residual(trace, call)
    }
    stages = []
    for path, seq in modules.items():
        if (
            not path
            or type(seq).forward is not nn.Sequential.forward
            or not isinstance(seq, nn.Sequential)
            or trace.call_counts.get(path) != 1
            or covered(path)
            or (filter_fn is not None and not filter_fn(seq, path))
        ):
            continue
        children = list(seq._modules.items())
        ids = [id(m) for _, m in children]
        flags = [
            f"{path}.{name}" in skippable
            and not isinstance(child, _CONTAINERS)
            and ids.count(id(child)) == 1
            and modules.get(f"{path}.{name}") is child
            for name, child in children
        ]
        i = 0
        while i < len(flags):
            if not flags[i]:
                i += 1
                continue
            j = i
            while j < len(flags) and flags[j]:
                j += 1
            start = i - 1 if i > 0 else i
            if j - start >= 2:
                stages.append((path, start, j))
            i = j
    return stages
