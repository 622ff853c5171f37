"""``reorder``: sort each layer's attention heads and FFN neurons by importance, most important first.

Prefix slicing keeps the *first* heads and neurons, so it is only sensible after this reordering (DynaBERT does
it once, before width-adaptive training). The permutation changes no function of the full model: heads and FFN
neurons are summed over by the layer's output projection, and each is moved together with all its weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, UnsupportedModelError
from ..state import converted_state
from .families import LayerParts, TransformerFamily, all_layer_parts, family_of

SCORES = ("taylor", "l1", "activation")


@dataclass(frozen=True)
class ReorderResult:
    """What :func:`reorder` did, per encoder layer (index = layer index in the supernet).

    Attributes:
        head_order: ``head_order[l][j]`` is the original index of the head now at position ``j``; shape (H,).
        ffn_order: the same for FFN neurons; shape (I,).
        head_importance: the score of each original head; shape (H,).
        ffn_importance: the score of each original neuron; shape (I,).
    """

    head_order: list[torch.Tensor]
    ffn_order: list[torch.Tensor]
    head_importance: list[torch.Tensor]
    ffn_importance: list[torch.Tensor]


def reorder(
    model: nn.Module,
    batches: Iterable[Any] | None = None,
    *,
    score: str = "taylor",
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
) -> ReorderResult:
    """Permute, in place, every encoder layer's heads and FFN neurons into decreasing importance.

    Works on a plain Hugging Face model of a supported family or on one returned by :func:`subnetact.convert`
    (scored at full width; its compiled plans stay valid, since the Parameters keep their storage).

    Scores (accumulated over ``batches``, per batch in absolute value, as DynaBERT does):

    - ``"taylor"`` (default; DynaBERT's ``compute_neuron_head_importance``): a head's score is
      ``|dL/dm_h|`` for a multiplicative mask ``m_h = 1`` on the head's attention output (what DynaBERT gets from
      ``head_mask``, which transformers 5 removed; here a hook applies the mask at the output projection's input).
      A neuron's score is ``|sum(W1 * dW1) + b1 * db1| + |sum(W2 * dW2)|`` over its row of ``fc1`` and its column
      of ``fc2``, computed equivalently as ``|dL/dm| + |dL/dm'|`` for masks on ``fc1``'s output and ``fc2``'s input
      (so frozen parameters work too). ``L`` is ``loss_fn(outputs, batch)`` or, by default, ``outputs.loss``
      (batches carrying ``labels``).
    - ``"l1"`` (data-free, ``batches`` not needed; OFA's ``re_organize_middle_weights``): the L1 norm of the
      weights that consume the head or neuron (the output projection's columns of the head, ``fc2``'s column).
    - ``"activation"`` (needs ``batches`` but no loss or labels; Minitron's activation-based importance, measured
      where the unit enters the residual stream): the L2 norm, over the batches' tokens, of what the head adds to
      the output projection's output (``x_h W_o[:, h]^T``) or the neuron adds to ``fc2``'s output
      (``a_j W2[:, j]``). Padding tokens are left out where a batch is a mapping with an ``attention_mask``. This
      is the score to use when distilling from the model itself on unlabelled data, where the Taylor score of a
      distillation loss is zero (the student starts equal to its teacher).

    Args:
        model: a BERT, RoBERTa or ViT model (base or classification), converted or not.
        batches: model inputs: mappings (``model(**batch)``), tuples (``model(*batch)``) or tensors
            (``model(batch)``), e.g. ``{"input_ids": (B, T), "attention_mask": (B, T), "labels": (B,)}``. Run in eval
            mode (no dropout) with gradients enabled.
        score: ``"taylor"``, ``"l1"`` or ``"activation"``.
        loss_fn: ``(outputs, batch) -> scalar loss``; default ``outputs.loss``.

    Returns:
        The permutations and scores, see :class:`ReorderResult`.

    Raises:
        UnsupportedModelError: ``model`` is not of a supported family.
        ConfigError: (a ``ValueError``) bad ``score``, no batches for ``"taylor"``, or no loss. Nothing is
            permuted then.

    Example::

        >>> model = subnetact.convert(BertForSequenceClassification(config))
        >>> subnetact.reorder(model, [{"input_ids": ids, "attention_mask": mask, "labels": y}])
        >>> model.actuate(width=0.25)   # now the most important quarter of the heads and neurons
    """
    if score not in SCORES:
        raise ConfigError(f"score={score!r} is not one of {SCORES}")
    if loss_fn is not None and not callable(loss_fn):
        raise ConfigError(f"loss_fn={loss_fn!r} must be a callable (outputs, batch) -> scalar loss tensor, or None")
    family = family_of(model)
    if family is None:
        raise UnsupportedModelError(
            f"reorder does not know {type(model).__qualname__}; supported are BERT, RoBERTa and ViT models "
            "(register others with subnetact.hf.register_family)"
        )
    _, parts = all_layer_parts(model, family, plain=False)
    if score == "l1":
        head_scores = [_l1_heads(p) for p in parts]
        ffn_scores = [p.fc2.weight.detach().abs().sum(dim=0) for p in parts]
    else:
        if batches is None:
            raise ConfigError(f"batches=None: score={score!r} needs data (or use score='l1', which needs none)")
        if score == "activation":
            head_scores, ffn_scores = _activation(model, parts, batches)
        else:
            head_scores, ffn_scores = _taylor(model, family, parts, batches, loss_fn)

    # Phase 2: permute (everything above only read the model). Orders are computed on the CPU (the scores of a
    # model on a GPU are GPU tensors) and moved to each weight's device where they index it.
    head_scores, ffn_scores = [s.cpu() for s in head_scores], [s.cpu() for s in ffn_scores]
    head_order = [torch.argsort(s, descending=True, stable=True) for s in head_scores]
    if family.per_head_bias is not None:  # the bias columns are the heads too; heads are not elastic, so stay put
        head_order = [torch.arange(len(s)) for s in head_scores]
    ffn_order = [torch.argsort(s, descending=True, stable=True) for s in ffn_scores]
    with torch.no_grad():
        for p, h_order, f_order in zip(parts, head_order, ffn_order):
            rows = (h_order[:, None] * p.head_size + torch.arange(p.head_size)).flatten().to(p.query.weight.device)
            for proj in (p.query, p.key, p.value, *(module for _, module in p.extras)):
                _permute(proj.weight, 0, rows)
                if proj.bias is not None:
                    _permute(proj.bias, 0, rows)
            _permute(p.out.weight, 1, rows)
            f_rows = f_order.to(p.fc1.weight.device)
            for proj in (p.fc1, *(() if p.gate is None else (p.gate,))):
                _permute(proj.weight, 0, f_rows)
                if proj.bias is not None:
                    _permute(proj.bias, 0, f_rows)
            _permute(p.fc2.weight, 1, f_rows)
    state = converted_state(model)
    if state is not None:
        state.invalidate()
    return ReorderResult(head_order, ffn_order, head_scores, ffn_scores)


def _permute(t: torch.Tensor, dim: int, index: torch.Tensor) -> None:
    # In place (same storage): optimisers, tied references and compiled plans keep pointing at these tensors.
    t.copy_(t.index_select(dim, index))


def _l1_heads(p: LayerParts) -> torch.Tensor:
    w = p.out.weight.detach().abs()  # (hidden, H * d)
    return w.view(w.shape[0], p.heads, p.head_size).sum(dim=(0, 2))  # (H,)


def _taylor(
    model: nn.Module,
    family: TransformerFamily,
    parts: list[LayerParts],
    batches: Iterable[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    device = parts[0].query.weight.device
    dtype = parts[0].query.weight.dtype
    head_masks = [torch.ones(p.heads, device=device, dtype=dtype, requires_grad=True) for p in parts]
    pre_masks = [torch.ones(p.ffn, device=device, dtype=dtype, requires_grad=True) for p in parts]
    post_masks = [torch.ones(p.ffn, device=device, dtype=dtype, requires_grad=True) for p in parts]
    head_scores = [torch.zeros(p.heads, device=device, dtype=torch.float64) for p in parts]
    ffn_scores = [torch.zeros(p.ffn, device=device, dtype=torch.float64) for p in parts]

    def head_hook(p: LayerParts, mask: torch.Tensor):
        def hook(module, args):
            x = args[0]  # (B, T, H * d): the heads' outputs, concatenated
            shape = x.shape
            return (x.view(*shape[:-1], p.heads, p.head_size) * mask[:, None]).view(shape), *args[1:]

        return hook

    def pre_act_hook(mask: torch.Tensor):
        return lambda module, args, out: out * mask  # (B, T, I): fc1's output, before the activation

    def post_act_hook(mask: torch.Tensor):
        return lambda module, args: (args[0] * mask, *args[1:])  # (B, T, I): fc2's input, after the activation

    converted = converted_state(model)
    extra = {} if converted is None else {"subnet": converted.max_config}
    training = {m: m.training for m in model.modules()}
    handles = []
    count = 0
    try:
        model.eval()
        for p, hm, m1, m2 in zip(parts, head_masks, pre_masks, post_masks):
            handles.append(p.out.register_forward_pre_hook(head_hook(p, hm)))
            handles.append(p.fc1.register_forward_hook(pre_act_hook(m1)))
            handles.append(p.fc2.register_forward_pre_hook(post_act_hook(m2)))
        for batch in batches:
            with torch.enable_grad():
                if isinstance(batch, Mapping):
                    outputs = model(**batch, **extra)
                elif isinstance(batch, (tuple, list)):
                    outputs = model(*batch, **extra)
                else:
                    outputs = model(batch, **extra)
                loss = loss_fn(outputs, batch) if loss_fn is not None else getattr(outputs, "loss", None)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise ConfigError(
                        f"score='taylor' needs a scalar loss per batch, got {type(loss).__name__}: pass labels in "
                        "each batch (outputs.loss) or loss_fn=(outputs, batch) -> loss"
                    )
                grads = torch.autograd.grad(loss, [*head_masks, *pre_masks, *post_masks], allow_unused=True)
            n = len(parts)
            for i in range(n):
                g_head, g_pre, g_post = grads[i], grads[n + i], grads[2 * n + i]
                if g_head is not None:
                    head_scores[i] += g_head.detach().abs().double()
                if g_pre is not None:
                    ffn_scores[i] += g_pre.detach().abs().double()
                if g_post is not None:
                    ffn_scores[i] += g_post.detach().abs().double()
            count += 1
    finally:
        for h in handles:
            h.remove()
        for m, flag in training.items():
            m.training = flag
    if count == 0:
        raise ConfigError("batches is empty: score='taylor' needs at least one batch")
    return head_scores, ffn_scores


def _run(model: nn.Module, batch: Any, extra: dict[str, Any]) -> Any:
    if isinstance(batch, Mapping):
        return model(**batch, **extra)
    if isinstance(batch, (tuple, list)):
        return model(*batch, **extra)
    return model(batch, **extra)


@torch.no_grad()
def _activation(
    model: nn.Module, parts: list[LayerParts], batches: Iterable[Any]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    device = parts[0].query.weight.device
    head_sq = [torch.zeros(p.heads, device=device, dtype=torch.float64) for p in parts]
    ffn_sq = [torch.zeros(p.ffn, device=device, dtype=torch.float64) for p in parts]
    token_mask: list[torch.Tensor | None] = [None]  # (B, T) of the batch running now, or None

    def masked(x: torch.Tensor) -> torch.Tensor:  # (B, T, F) -> (tokens, F), padding dropped
        mask = token_mask[0]
        if mask is not None and mask.shape == x.shape[:2]:
            return x[mask.to(x.device).bool()]
        return x.reshape(-1, x.shape[-1])

    def head_hook(i: int, p: LayerParts):
        def hook(module, args):
            x = masked(args[0]).double()  # (tokens, H * d): the heads' outputs, concatenated
            w = module.weight.detach().double().view(-1, p.heads, p.head_size)  # (hidden, H, d)
            # ||x_h W_h^T||^2 summed over tokens = sum over (d, d') of (x_h^T x_h) * (W_h^T W_h): no (tokens, hidden)
            # tensor per head is built.
            xh = x.view(-1, p.heads, p.head_size)
            gram_x = torch.einsum("thd,the->hde", xh, xh)
            gram_w = torch.einsum("ohd,ohe->hde", w, w)
            head_sq[i] += (gram_x * gram_w).sum(dim=(1, 2))

        return hook

    def ffn_hook(i: int):
        def hook(module, args):
            a = masked(args[0]).double()  # (tokens, I): the neurons' activations
            ffn_sq[i] += a.square().sum(0) * module.weight.detach().double().square().sum(0)

        return hook

    converted = getattr(model, "_subnetact", None)
    extra = {} if converted is None else {"subnet": converted.max_config}
    training = {m: m.training for m in model.modules()}
    handles = []
    count = 0
    try:
        model.eval()
        for i, p in enumerate(parts):
            handles.append(p.out.register_forward_pre_hook(head_hook(i, p)))
            handles.append(p.fc2.register_forward_pre_hook(ffn_hook(i)))
        for batch in batches:
            token_mask[0] = batch.get("attention_mask") if isinstance(batch, Mapping) else None
            _run(model, batch, extra)
            count += 1
    finally:
        for h in handles:
            h.remove()
        for m, flag in training.items():
            m.training = flag
    if count == 0:
        raise ConfigError("batches is empty: score='activation' needs at least one batch")
    return [s.sqrt() for s in head_sq], [s.sqrt() for s in ffn_sq]
