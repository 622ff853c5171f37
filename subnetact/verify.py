"""The checks ``convert`` runs before returning (the example input they run on: :mod:`subnetact.examples`).

``convert`` never returns a model whose largest subnet differs from the original, nor one whose served subnets differ
from their exports: the converted model runs the example input at its largest subnet (output equal to the original's
bit for bit), then at its smallest and at one random (seeded) subnet, each of which must return the original's
shapes and equal its own :func:`~subnetact.export` (bit for bit, or within rounding where the kernels differ). Any
failure names the module that failed and undoes the conversion.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .errors import UnsupportedModelError
from .examples import (  # noqa: F401  (the example-input names stay importable from here)
    IMAGE_SIZES,
    Call,
    candidate_calls,
    detached_copy,
    eval_mode,
    example_call,
    one_thread,
    trace_model,
)
from .state import state_of
from .tree import iter_tensors, map_tensors

#: Modules whose forward picks a fast path by whether a ``TorchFunctionMode`` is active (``nn.TransformerEncoder``'s
#: nested-tensor path): the trace runs leaves outside its mode (``nn.MultiheadAttention``,
#: ``nn.TransformerEncoderLayer``), but not these containers, so for models holding one the trace's output may differ
#: from a plain forward in the last bits, and convert takes its reference from a plain forward.
MODE_SENSITIVE = (nn.TransformerEncoder, nn.TransformerEncoderLayer)


def plain_output(model: nn.Module, call: Call) -> Any:
    """``model(*args, **kwargs)`` in eval mode without grad (each module's training flag restored after)."""
    args, kwargs = call
    with eval_mode(model), torch.no_grad():
        return model(*args, **kwargs)


def same_output(a: Any, b: Any) -> bool:
    """Whether two outputs hold the same tensors (shapes and values, bit for bit)."""
    ta, tb = list(iter_tensors(a)), list(iter_tensors(b))
    return len(ta) == len(tb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(ta, tb))


def _shapes(out: Any) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in iter_tensors(out)]


def check_largest(model: nn.Module, largest: Any, reference: Any) -> None:
    """Raise unless the converted ``model``'s output at its largest subnet equals the original's, bit for bit.

    Raises:
        UnsupportedModelError: naming the largest absolute difference.
    """
    if same_output(largest, reference):
        return
    diffs = [
        (x.double() - y.double()).abs().max().item()
        for x, y in zip(iter_tensors(largest), iter_tensors(reference))
        if x.shape == y.shape
    ]
    raise UnsupportedModelError(
        f"the converted {type(model).__qualname__} at its largest subnet does not reproduce the original "
        f"model (max abs difference {max(diffs, default=float('nan')):.3g}); convert refuses rather than "
        "return a different model"
    )


#: The random subnet convert checks against its export is drawn with this seed: a model converts the same way twice.
RANDOM_SUBNET_SEED = 0

#: Relative difference (max abs difference over the reference's max abs value) below which an actuated subnet and
#: its export agree without further evidence. Above it, a float32 (or lower precision) model's export is also run in
#: float64 to tell rounding from a real difference (random weights can amplify float32 rounding past 1e-4, see
#: docs/coverage.md).
_DIRECT_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5}
#: An actuated subnet is accepted when its distance to the float64 export is at most this many times the float32
#: export's own distance to it (both are then rounding of the same computation).
_ROUNDING_FACTOR = 10.0
#: Without a float64 run (the model fails in float64), the largest relative difference accepted as rounding.
_FALLBACK_TOLERANCE = 1e-3


def check_subnets(model: nn.Module, call: Call, reference: Any) -> None:
    """Run the converted ``model``'s smallest subnet and one random (seeded) subnet on ``call`` and compare each with
    its :func:`~subnetact.export`: it must run, return ``reference``'s shapes and equal the export's output (bit for
    bit, or within rounding where the kernels differ; see :func:`_agree`).

    This is the backstop of the trace's own checks: code that reads a sliced layer's weight or size without the
    trace seeing it makes a served subnet compute something other than its export.

    Raises:
        UnsupportedModelError: a subnet or its export fails (naming the module that was running), changes an output
            shape, or differs from the other (naming the first module whose outputs differ).
    """
    from .export import export_plan  # export imports the supernet machinery, which imports this module's users

    state = state_of(model)
    subnets = [("smallest subnet", state.space.min())]
    sampled = state.space.sample(RANDOM_SUBNET_SEED)
    if sampled not in (subnets[0][1], state.max_config):
        subnets.append((f"random subnet {sampled.to_dict()}", sampled))
    name = type(model)._subnetact_base.__qualname__
    for label, cfg in subnets:
        plan = state.compile(cfg)  # compiled directly: no plan cached, no uncalibrated-subnet warning
        actuated = _run_naming_failure(model, call, plan, f"the {label} of the converted {name}")
        if _shapes(actuated) != _shapes(reference):
            raise UnsupportedModelError(
                f"the {label} of the converted {name} returns shapes {_shapes(actuated)}, the original "
                f"{_shapes(reference)}"
            )
        dense = export_plan(model, plan)
        exported = _run_naming_failure(dense, call, None, f"export() of the {label} of the converted {name}")
        agree, diff = _agree(actuated, exported, dense, call)
        if agree:
            continue
        where = _first_difference(model, dense, call, plan)
        raise UnsupportedModelError(
            f"the {label} of the converted {name} differs from its export() on the example input (max relative "
            f"difference {diff:.3g}; {where}): code there reads a weight or a size of a layer convert sliced "
            "without the trace seeing it, so convert refuses rather than serve subnets that differ from their exports"
        )


def _run_naming_failure(model: nn.Module, call: Call, plan: Any, what: str) -> Any:
    """``model(*call)`` in eval mode without grad (pinned to ``plan`` if given); a failure is re-raised as an
    :class:`UnsupportedModelError` naming the module that was running."""
    try:
        return _run(model, call, plan, None)
    except Exception as exc:
        # Run again with hooks that name the module that fails (the first run had none: they cost on every call).
        running: list[str] = []
        try:
            _run(model, call, plan, running)
        except Exception:
            pass
        where = (running[-1] or "<root>") if running else "<root>"
        raise UnsupportedModelError(
            f"{what} fails in module {where!r} ({type(exc).__name__}: {exc}); this module reads channels convert "
            "sliced without knowing it"
        ) from exc


def _run(model: nn.Module, call: Call, plan: Any, running: list[str] | None) -> Any:
    """``model(*call)`` in eval mode without grad, pinned to ``plan`` if given; with ``running``, the paths of the
    modules running (innermost last) are kept there, so after a failure its last item is the failing module."""
    args, kwargs = call
    if plan is not None:
        state_of(model).local.plan = plan
    if running is None:
        try:
            with eval_mode(model), torch.no_grad():
                return model(*args, **kwargs)
        finally:
            if plan is not None:
                state_of(model).local.plan = None
    paths = {id(m): name for name, m in model.named_modules()}
    handles = [
        m.register_forward_pre_hook(lambda mod, _args: running.append(paths.get(id(mod), "?")))
        for m in model.modules()
    ]

    def leave(*_: Any) -> None:  # (a forward hook that returns a value replaces the output)
        running.pop()

    handles += [m.register_forward_hook(leave) for m in model.modules()]
    try:
        with eval_mode(model), torch.no_grad():
            return model(*args, **kwargs)
    finally:
        if plan is not None:
            state_of(model).local.plan = None
        for h in handles:
            h.remove()


def relative_difference(a: Any, b: Any) -> float:
    """The largest ``max |x - y| / max |y|`` over the tensors of two outputs of the same structure (NaNs at the same
    places agree; integer tensors count as 0 when equal, inf otherwise)."""
    worst = 0.0
    for x, y in zip(iter_tensors(a), iter_tensors(b)):
        if x.shape != y.shape:
            return math.inf
        if not (x.is_floating_point() or x.is_complex()):
            if not torch.equal(x, y):
                return math.inf
            continue
        x, y = x.detach().double(), y.detach().double()
        both_nan = torch.isnan(x) & torch.isnan(y)
        diff = torch.where(both_nan, 0.0, (x - y).abs())
        finite = y[torch.isfinite(y)].abs()
        scale = finite.max().item() if finite.numel() else 0.0
        err = diff.max().item() if diff.numel() else 0.0
        worst = max(worst, err / scale if scale > 0 else err)
    return math.nan if math.isnan(worst) else worst


def _agree(actuated: Any, exported: Any, dense: nn.Module, call: Call) -> tuple[bool, float]:
    """Whether an actuated subnet's output agrees with its export's, and their relative difference.

    Bit for bit agrees. Otherwise the kernels differ (strided weight slices against contiguous copies), and the
    difference must be rounding: within the dtype's direct tolerance, or, for float32 and lower precision, no more
    than ``_ROUNDING_FACTOR`` times the export's own distance to the same export run in float64.
    """
    if same_output(actuated, exported):
        return True, 0.0
    diff = relative_difference(actuated, exported)
    if len(list(iter_tensors(actuated))) != len(list(iter_tensors(exported))) or not diff <= math.inf:
        return False, diff
    dtypes = {t.dtype for t in iter_tensors(exported) if t.is_floating_point()}
    dtype = torch.float64 if torch.float64 in dtypes else max(dtypes, key=lambda d: torch.finfo(d).bits, default=None)
    if dtype is None:
        return False, diff
    direct = _DIRECT_TOLERANCE.get(dtype, 0.0)
    if diff <= direct:
        return True, diff
    if dtype == torch.float64:
        return False, diff
    try:
        exact = plain_output(dense.double(), _to_double(call))
    except Exception:  # a model that cannot run in float64 (a kernel without float64, a hard-coded float32 tensor)
        return diff <= _FALLBACK_TOLERANCE, diff
    rounding = relative_difference(exported, exact)
    off = relative_difference(actuated, exact)
    return off <= max(_ROUNDING_FACTOR * rounding, direct), diff


def _to_double(obj: Any) -> Any:
    return map_tensors(lambda t: t.double() if t.is_floating_point() else t, obj)


def _first_difference(model: nn.Module, dense: nn.Module, call: Call, plan: Any) -> str:
    """Where the actuated ``model`` (on ``plan``) and its export ``dense`` first disagree: the first module, in the
    order the supernet runs them, whose output differs (relatively, past 1e-3) from the export's module at the same
    path. Used only to word a refusal."""
    outputs: list[dict[str, Any]] = [{}, {}]
    order: list[str] = []
    for side, net in enumerate((model, dense)):
        handles = []
        for path, m in net.named_modules():
            if not path:
                continue

            def record(_m: nn.Module, _args: Any, out: Any, path: str = path, side: int = side) -> None:
                outputs[side].setdefault(path, detached_copy(out))
                if side == 0:
                    order.append(path)

            handles.append(m.register_forward_hook(record))
        if side == 0:
            state_of(net).local.plan = plan
        try:
            plain_output(net, _to_dtype_of(call, net))
        except Exception:  # the caller already ran both sides; a second run is only for the wording
            pass
        finally:
            if side == 0:
                state_of(net).local.plan = None
            for h in handles:
                h.remove()
    for path in order:
        if path in outputs[1] and not relative_difference(outputs[0][path], outputs[1][path]) <= 1e-3:
            module = model.get_submodule(path)
            return f"first at the output of {path!r} ({type(module).__name__})"
    return "the layers agree: the difference is in the model's own forward code, at '<root>'"


def _to_dtype_of(call: Call, net: nn.Module) -> Call:
    param = next(net.parameters(), None)
    if param is None or param.dtype != torch.float64:
        return call
    return _to_double(call)
