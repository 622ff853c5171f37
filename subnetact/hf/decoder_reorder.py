"""``reorder_decoder``: sort each decoder layer's FFN neurons and KV groups by importance, most important first
(issue 24), so that prefix subnets keep the important ones.

A neuron moves with its gate and up rows and its down column; a KV group moves with its k and v rows, the rows of
its ``n_rep`` query heads and their columns of the output projection (whole heads, so rotary embeddings and
per-head norms are unaffected). Nothing else reads these indices, so the full model computes the same function
(only the summation order of the down and output projections changes).

Scores (per layer):

- ``"activation"`` (Minitron / Flextron style, needs ``batches`` of sample text): a neuron's score is the mean
  absolute value of its activation (the down projection's input) over the batches' tokens times the L2 norm of its
  down column, i.e. the mean size of its contribution to the residual stream; a KV group's is the same for the
  output projection's input features of its query heads.
- ``"magnitude"`` (data-free, once-for-all's criterion): the L1 norm of the down columns (output-projection
  columns) the neuron (group) feeds.

Supported: families with separate ``nn.Linear`` projections (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, OPT);
Phi-3's fused projections and GPT-2's ``Conv1D`` are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, UnsupportedModelError
from ..state import converted_state
from .decoders import DecoderLayerParts, decoder_family_of, find_decoder_layers, layer_parts

SCORES = ("activation", "magnitude")


@dataclass(frozen=True)
class DecoderReorderResult:
    """What :func:`reorder_decoder` did, per decoder layer.

    Attributes:
        ffn_order: ``ffn_order[l][j]`` is the original index of the neuron now at position ``j``; shape (I,).
        kv_order: the same for KV groups; shape (KV,).
        ffn_importance, kv_importance: the score of each original neuron / KV group; shapes (I,), (KV,).
    """

    ffn_order: list[torch.Tensor]
    kv_order: list[torch.Tensor]
    ffn_importance: list[torch.Tensor]
    kv_importance: list[torch.Tensor]


def reorder_decoder(model: nn.Module, batches: Iterable[Any] | None = None, *, score: str = "activation"):
    """Permute, in place, every decoder layer's FFN neurons and KV groups into decreasing importance.

    Works on a plain model of a built-in decoder family or on one returned by :func:`subnetact.convert` (scored at
    its largest subnet; its plans are recompiled).

    Args:
        model: a decoder LLM (e.g. ``LlamaForCausalLM``), converted or not.
        batches: for ``score="activation"``: model inputs, mappings (``model(**batch)``) or ``input_ids`` tensors
            of shape (B, T). Run in eval mode without gradients.
        score: ``"activation"`` or ``"magnitude"``.

    Returns:
        :class:`DecoderReorderResult`.

    Raises:
        ConfigError: (a ``ValueError``) unknown ``score``, or no batches for ``"activation"``; nothing moves.
        UnsupportedModelError: not a supported decoder (fused projections: Phi-3, GPT-2).
    """
    if score not in SCORES:
        raise ConfigError(f"score={score!r} is not one of {SCORES}")
    family = decoder_family_of(model)
    if family is None:
        raise UnsupportedModelError(f"reorder_decoder does not know {type(model).__qualname__}")
    if family.qkv is not None or family.gate_up is not None or family.q is None:
        raise UnsupportedModelError(
            f"reorder_decoder: the {family.name} family fuses its projections (or uses Conv1D); supported are "
            "families with separate nn.Linear q/k/v/o and FFN projections"
        )
    path, layers = find_decoder_layers(model, family)
    parts = [
        layer_parts(model, family, f"{path}.{name}", layer, plain=False) for name, layer in layers._modules.items()
    ]
    mods = [_modules(p, family) for p in parts]
    if score == "magnitude":
        ffn_scores = [m["down"].weight.detach().abs().sum(dim=0).double() for m in mods]
        kv_scores = [_per_group(m["o"].weight.detach().abs().sum(dim=0).double(), p) for m, p in zip(mods, parts)]
    else:
        if batches is None:
            raise ConfigError("batches=None: score='activation' needs sample text (or use score='magnitude')")
        ffn_scores, kv_scores = _activation_scores(model, parts, mods, batches)

    ffn_order = [torch.argsort(s, descending=True, stable=True) for s in ffn_scores]
    kv_order = [torch.argsort(s, descending=True, stable=True) for s in kv_scores]
    with torch.no_grad():
        for p, m, f_order, g_order in zip(parts, mods, ffn_order, kv_order):
            device = m["down"].weight.device
            f_rows = f_order.to(device)
            for name in ("gate", "up"):
                if name in m:
                    _permute_rows(m[name], f_rows)
            _permute(m["down"].weight, 1, f_rows)
            d, n_rep = p.head_dim, p.heads // p.kv_heads
            kv_rows = (g_order[:, None] * d + torch.arange(d)).flatten().to(device)
            q_heads = (g_order[:, None] * n_rep + torch.arange(n_rep)).flatten()
            q_rows = (q_heads[:, None] * d + torch.arange(d)).flatten().to(device)
            _permute_rows(m["k"], kv_rows)
            _permute_rows(m["v"], kv_rows)
            _permute_rows(m["q"], q_rows)
            _permute(m["o"].weight, 1, q_rows)
    state = converted_state(model)
    if state is not None:
        state.invalidate()
    return DecoderReorderResult(
        ffn_order, kv_order, [s.float().cpu() for s in ffn_scores], [s.float().cpu() for s in kv_scores]
    )


def _modules(p: DecoderLayerParts, family) -> dict[str, nn.Module]:
    names = {"q": family.q, "k": family.k, "v": family.v, "o": family.o, "up": family.up, "down": family.down}
    if family.gate is not None:
        names["gate"] = family.gate
    return {key: p.layer.get_submodule(name) for key, name in names.items()}


def _per_group(per_feature: torch.Tensor, p: DecoderLayerParts) -> torch.Tensor:
    """(H * d,) scores of the output projection's input features -> (KV,) per KV group."""
    return per_feature.view(p.kv_heads, -1).sum(dim=1)


def _permute(t: torch.Tensor, dim: int, index: torch.Tensor) -> None:
    t.copy_(t.index_select(dim, index))  # in place: optimisers, tied references and plans keep these tensors


def _permute_rows(linear: nn.Module, rows: torch.Tensor) -> None:
    _permute(linear.weight, 0, rows)
    if linear.bias is not None:
        _permute(linear.bias, 0, rows)


def _activation_scores(model, parts, mods, batches) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    ffn_sum = [torch.zeros(p.ffn, dtype=torch.float64) for p in parts]
    head_sum = [torch.zeros(p.heads * p.head_dim, dtype=torch.float64) for p in parts]
    tokens = [0]

    def record(store: torch.Tensor, count: bool):
        def hook(module, args):
            x = args[0].detach()
            store.add_(x.abs().reshape(-1, x.shape[-1]).sum(dim=0).double().cpu())
            if count:
                tokens[0] += x.reshape(-1, x.shape[-1]).shape[0]

        return hook

    state = converted_state(model)
    extra = {} if state is None else {"subnet": state.max_config}
    training = {m: m.training for m in model.modules()}
    handles = []
    batches_seen = 0
    try:
        model.eval()
        for i, m in enumerate(mods):
            handles.append(m["down"].register_forward_pre_hook(record(ffn_sum[i], i == 0)))
            handles.append(m["o"].register_forward_pre_hook(record(head_sum[i], False)))
        with torch.no_grad():
            for batch in batches:
                if isinstance(batch, Mapping):
                    model(**batch, **extra)
                else:
                    model(input_ids=batch, **extra)
                batches_seen += 1
    finally:
        for h in handles:
            h.remove()
        for module, flag in training.items():
            module.training = flag
    if batches_seen == 0:
        raise ConfigError("batches is empty: score='activation' needs at least one batch of sample text")
    n = max(tokens[0], 1)
    ffn_scores = [s / n * m["down"].weight.detach().double().norm(dim=0).cpu() for s, m in zip(ffn_sum, mods)]
    kv_scores = [
        _per_group(s / n * m["o"].weight.detach().double().norm(dim=0).cpu(), p)
        for s, m, p in zip(head_sum, mods, parts)
    ]
    return ffn_scores, kv_scores
