"""``refit_sliced_linears``: a closed-form start for distillation. Every linear layer whose input the served subnets
slice gets the weights that let each subnet's prefix best reproduce the largest subnet's output (least squares).

A width-sliced subnet computes ``W[:, :k] @ a[:k] + b`` where the largest computes ``W @ a + b``: dropping the last
``n - k`` input features (FFN neurons, attention heads) drops their terms from the sum, and nothing else makes up
for them. With importance ordering the dropped terms are the small ones, but they do not cancel. The terms that are
kept can make up for them, since the dropped features correlate with the kept ones; how much follows from the
features' second moments alone, as in OBS / SparseGPT's layer-wise reconstruction. Here one weight matrix serves
every prefix, so the fit is nested: for a linear layer seen with input widths ``k_1 < ... < k_m = n`` by the served
subnets, with weights ``lam_j``, it solves

    min_W  sum_j lam_j E||W P_j a + b - (W0 a + b0)||^2  +  delta ||W - W0||^2

where ``P_j`` keeps the first ``k_j`` features, ``W0, b0`` are the current weights and bias, and ``a`` runs over the
layer's inputs in the largest subnet on sample batches. The bias is refit too (as a feature that every prefix
keeps); ``delta`` (``ridge`` times the mean feature energy) pulls the fit towards ``W0`` where the samples say little.
The solution needs only the input Gram matrix ``E[a a^T]`` of each layer (``W0`` times it is the cross term), so
one pass over the batches and one ``(n+1) x (n+1)`` solve per layer do it. The largest subnet's weight decides how
much it may give up for the others; with lam = 0 for it, it is not protected at all.

Measured on the real SmolLM2-135M (FFN 0.75 and 0.5, weights 4, 1 and 2, 32 batches of 512 tokens, 2.1 CPU-minutes;
``docs/benchmarks.md``): before any training, held-out perplexity 25.3 -> 22.0 and 58.4 -> 31.8, for 2.5 % on the
full model's. Too few samples (under about 10 tokens per input feature) make the fit follow them: raise ``ridge``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..checks import is_real
from ..config import SubnetConfig
from ..errors import ArgumentTypeError, ConfigError
from ..state import state_of
from .batches import call
from .losses import token_mask

_ROWS_PER_FEATURE = 4  # fewer sample tokens than this per input feature: warn (measured on SmolLM2, see below)


@dataclass(frozen=True)
class LayerRefit:
    """What :func:`refit_sliced_linears` did to one linear layer.

    Attributes:
        widths: the input widths the subnets use, ascending (the last one is the layer's ``in_features``).
        error_before, error_after: per width, ``E||y_k - y||^2 / E||y||^2`` on the sample batches, where ``y`` is
            the largest subnet's output of this layer (before the refit) and ``y_k`` the prefix's.
    """

    widths: tuple[int, ...]
    error_before: tuple[float, ...]
    error_after: tuple[float, ...]


@dataclass(frozen=True)
class RefitResult:
    """Per refit layer (by module name): a :class:`LayerRefit`; and how many sample tokens (rows) the fit saw."""

    layers: dict[str, LayerRefit]
    rows: int


def refit_sliced_linears(
    model: nn.Module,
    subnets: Sequence[SubnetConfig],
    batches: Iterable[Any],
    *,
    weights: Sequence[float] | None = None,
    ridge: float = 1e-3,
) -> RefitResult:
    """Refit, in place, every ``nn.Linear`` whose input width differs between ``subnets`` (see the module docstring).

    Typically the FFN down projections and the attention output projections of a width-sliced transformer, after
    importance reordering and before distillation; then call :func:`subnetact.train.distill` with ``reorder=False``,
    since reordering again would move other features into the prefixes that were fit. Linear layers that every
    subnet uses at full input width are not touched; nor is anything else.

    Args:
        model: a model returned by :func:`subnetact.convert`.
        subnets: the served configs; each contributes its input width at every linear layer it runs (a layer that
            a config skips by depth contributes nothing).
        batches: sample inputs, as :func:`subnetact.train.distill` takes them (dicts as keyword arguments, tuples
            as positional ones, or one tensor); a re-iterable. Padding positions (a dict's ``attention_mask`` of
            shape (B, T)) are left out of the statistics.
        weights: one weight >= 0 per config (default 1 each): how much its reconstruction error counts. Raise the
            largest subnet's to keep it closer to the original.
        ridge: >= 0, the pull towards the current weights, relative to the mean input energy. The default suits
            samples of 10 or more tokens per input feature (SmolLM2's 1,536-wide down projections: 16,384 tokens);
            with fewer, the fit follows the samples (a warning says so below 4 per feature): raise it.

    Returns:
        :class:`RefitResult`, with each layer's relative output error before and after, per width.

    Raises:
        NotConvertedError: ``model`` was not converted.
        ConfigError: no subnets, a config outside the space, ``weights`` of the wrong length or with a negative or
            non-finite value, ``ridge`` negative, or ``batches`` empty. Nothing is changed then.
    """
    state = state_of(model)
    subnets = _check(state, subnets, weights, ridge)
    weights = [1.0] * len(subnets) if weights is None else [float(w) for w in weights]
    batches = list(batches)
    if not batches:
        raise ConfigError("batches is empty: refit_sliced_linears needs sample inputs")

    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    flags = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            # Which input (and output) width each config uses at each linear layer: one forward per config.
            seen = _widths_per_config(model, linears, subnets, batches[0])
            targets = _layers_to_refit(linears, seen, weights)
            grams, rows = _input_grams(model, linears, targets, state.max_config, batches)
            widest = max((linears[name].in_features for name in targets), default=0)
            if rows < _ROWS_PER_FEATURE * widest:
                warnings.warn(
                    f"refit_sliced_linears: {rows} sample tokens for layers of up to {widest} inputs; with fewer than "
                    f"{_ROWS_PER_FEATURE} per input the fit follows the samples and can damage the full model badly. "
                    "Give more batches, or raise ridge (0.1 for SmolLM2 with 2,048 tokens).",
                    UserWarning,
                    stacklevel=2,
                )
            result = {}
            for name, uses in targets.items():
                result[name] = _solve(linears[name], grams[name], uses, ridge)
    finally:
        for module, flag in flags.items():
            module.training = flag
    state.invalidate()  # plans and cached slices hold copies of the old weights
    return RefitResult(result, rows)


def _check(state, subnets, weights, ridge) -> list[SubnetConfig]:
    if isinstance(subnets, (str, bytes)) or not isinstance(subnets, Sequence) or not subnets:
        raise ConfigError(f"subnets={subnets!r} must be a non-empty sequence of SubnetConfig")
    configs = []
    for i, cfg in enumerate(subnets):
        if not isinstance(cfg, SubnetConfig):
            raise ArgumentTypeError(f"subnets[{i}]={cfg!r} must be a SubnetConfig (model.space.make(...))")
        configs.append(state.space.validate(cfg))
    if weights is not None:
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or len(weights) != len(configs):
            raise ConfigError(f"weights={weights!r} must be a sequence of {len(configs)} numbers, one per subnet")
        for w in weights:
            if not is_real(w, finite=True) or w < 0:
                raise ConfigError(f"weights={list(weights)!r}: each must be a finite number >= 0")
        if sum(weights) == 0:
            raise ConfigError(f"weights={list(weights)!r}: at least one must be > 0")
    if not is_real(ridge, finite=True) or ridge < 0:
        raise ConfigError(f"ridge={ridge!r} must be a finite number >= 0")
    return configs


def _widths_per_config(model, linears, subnets, batch) -> list[dict[str, tuple[int, int]]]:
    """For each config: {linear name: (input width, output width)} of the layers it runs on ``batch``."""
    current: dict[str, tuple[int, int]] = {}

    def hook(name):
        def record(module, args, output):
            current[name] = (args[0].shape[-1], output.shape[-1])

        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in linears.items()]
    seen = []
    try:
        for cfg in subnets:
            current.clear()
            call(model, batch, cfg)
            seen.append(dict(current))
    finally:
        for h in handles:
            h.remove()
    return seen


def _layers_to_refit(linears, seen, weights) -> dict[str, list[tuple[int, int, float]]]:
    """{name: [(input width, output width, weight) per config that runs it]} for the layers some config slices."""
    targets = {}
    for name, m in linears.items():
        uses = [(*s[name], w) for s, w in zip(seen, weights) if name in s]
        if any(k != m.in_features for k, _, _ in uses) and all(k <= m.in_features for k, _, _ in uses):
            targets[name] = uses
    return targets


def _input_grams(model, linears, targets, largest, batches) -> tuple[dict[str, torch.Tensor], int]:
    """Per target layer, the (n+1, n+1) float64 Gram matrix of [input features, 1] over the batches' tokens, in
    the largest subnet (padding rows left out)."""
    grams = {
        name: torch.zeros(linears[name].in_features + 1, linears[name].in_features + 1, dtype=torch.float64)
        for name in targets
    }
    current: list[Any] = [None]  # the batch being run
    rows = [0]

    def hook(name, first):
        def record(module, args):
            x = args[0].detach()
            mask = token_mask(current[0], x.shape) if x.dim() == 3 else None
            if mask is not None:
                x = x[mask.bool()]
            x = x.reshape(-1, x.shape[-1]).float()
            x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
            # A float32 product per batch is accurate enough; the sum over batches is not.
            grams[name].add_((x.T @ x).double().cpu())
            if first:
                rows[0] += x.shape[0]

        return record

    handles = [linears[name].register_forward_pre_hook(hook(name, i == 0)) for i, name in enumerate(targets)]
    try:
        for batch in batches:
            current[0] = batch
            call(model, batch, largest)
    finally:
        for h in handles:
            h.remove()
    return grams, rows[0]


def _solve(linear: nn.Linear, gram: torch.Tensor, uses, ridge: float) -> LayerRefit:
    """Solve the nested least squares for one layer and write its weight (and bias) in place."""
    n = linear.in_features
    W0 = linear.weight.detach().double().cpu()
    b0 = (
        linear.bias.detach().double().cpu()
        if linear.bias is not None
        else torch.zeros(W0.shape[0], dtype=torch.float64)
    )
    A0 = torch.cat([W0, b0[:, None]], dim=1)  # (out, n + 1): the bias is the weight of a constant feature
    widths = sorted({k for k, _, _ in uses})

    def keep(k: int) -> torch.Tensor:  # P_k on [features, 1]: the first k features and the constant
        p = torch.zeros(n + 1, dtype=torch.float64)
        p[:k] = 1
        p[n] = 1
        return p

    def errors(A: torch.Tensor) -> tuple[float, ...]:
        energy = torch.einsum("oi,ij,oj->", A0, gram, A0).clamp_min(1e-30)
        out = []
        for k in widths:
            D = A * keep(k) - A0
            out.append(float(torch.einsum("oi,ij,oj->", D, gram, D) / energy))
        return tuple(out)

    delta = ridge * float(gram.diagonal()[:n].mean()) * sum(w for _, _, w in uses)
    A = A0.clone()
    # Rows the configs output differ when the layer's output is sliced too: each block of rows is fit for the
    # configs that compute it.
    bounds = sorted({o for _, o, _ in uses} | {0})
    for lo, hi in zip(bounds, bounds[1:]):
        active = [(k, w) for k, o, w in uses if o >= hi and w > 0]
        if not active:
            continue
        M = delta * torch.eye(n + 1, dtype=torch.float64)
        R = delta * torch.eye(n + 1, dtype=torch.float64)
        for k, w in active:
            p = keep(k)
            M += w * (p[:, None] * gram * p[None, :])
            R += w * (gram * p[None, :])
        if linear.bias is None:  # no constant feature to fit: pin it at zero
            M[n, :], M[:, n], M[n, n], R[n, :], R[:, n] = 0, 0, 1, 0, 0
        A[lo:hi] = torch.linalg.solve(M, (A0[lo:hi] @ R).T).T
    before = errors(A0)
    after = errors(A)
    with torch.no_grad():
        linear.weight.copy_(A[:, :n].to(linear.weight))
        if linear.bias is not None:
            linear.bias.copy_(A[:, n].to(linear.bias))
    return LayerRefit(tuple(widths), before, after)


__all__ = ["LayerRefit", "RefitResult", "refit_sliced_linears"]
