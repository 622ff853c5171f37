"""Conversion and export of Hugging Face encoders as DynaBERT-style supernets (issues 5 and 11), and
:func:`register_family`, which installs them for model classes.

Space of a converted model with ``L`` layers:

- ``depth``: one entry (the layer list), choices ``min_depth..L``; ``D`` runs layers ``[floor(i * L / D) for i in
  range(D)]`` (DynaBERT's rule, :func:`subnetact.kept_layers` with ``"every_other"``).
- ``heads``: one entry per layer; a fraction ``w`` keeps the first ``ceil(w * H)`` whole heads (q/k/v output rows,
  the output projection's input columns).
- ``ffn``: one entry per layer; ``w`` keeps the first ``ceil(w * I)`` FFN neurons (``fc1`` rows, ``fc2`` columns).
- the link ``width -> (heads, ffn)``: ``model.actuate(width=w)`` sets both, as DynaBERT's single width multiplier
  does; ``model.actuate(heads=..., ffn=...)`` sets them separately.

Hidden size, embeddings and LayerNorms are not sliced. No custom attention operator is needed where a family
reshapes q/k/v as ``view(B, T, -1, head_size)`` (all but DeBERTa-v2): narrower projections simply give fewer heads,
with any attention implementation (eager, sdpa, ...). A family with ``head_count_per_subnet`` (DeBERTa-v2) gets
:class:`~subnetact.head_count.HeadCount` on its attention. Every family is verified on the model before anything
changes (:mod:`subnetact.hf.verify`).
"""

from __future__ import annotations

import copy
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence

from torch import nn

from ..errors import ConfigError, UnsupportedModelError
from ..export import register_export_hook
from ..head_count import head_count_factory
from ..layer_select import EVERY_OTHER
from ..plan import ConversionPlan, ConvertConfig, StagePlan, register_model_adapter
from ..space import Entry
from ..state import ChannelGroup, Plan, active_size, state_of
from .families import TransformerFamily, all_layer_parts, find_layers, record_family, variant_for
from .verify import ExampleInputs, verify_family

WIDTH_LINK = {"width": ("heads", "ffn")}


def active_heads(width: float, heads: int) -> int:
    """Whole heads kept at ``width``: ``ceil(width * heads)``, at least 1 (:func:`subnetact.state.active_size`)."""
    return active_size(width, heads)


def active_neurons(width: float, size: int) -> int:
    """FFN neurons kept at ``width``: ``ceil(width * size)``, at least 1 (:func:`subnetact.state.active_size`)."""
    return active_size(width, size)


#: The oldest transformers release the Hugging Face support is tested with (CI's .ci/oldest.txt).
MIN_TRANSFORMERS = (5, 9)


def check_transformers_version() -> None:
    """Raise :class:`~subnetact.UnsupportedModelError` if the installed transformers is older than
    :data:`MIN_TRANSFORMERS` (encoders and decoders alike)."""
    # transformers 4.x BERT reshapes q/k/v with its fixed ``num_attention_heads`` (narrower projections would fail
    # in view()); before 5.9 ViT keeps ``encoder.layer`` and ``attention_head_size`` instead of ``layers`` and
    # ``head_dim``. The model's own module is already imported, so this imports nothing.
    version = getattr(sys.modules.get("transformers"), "__version__", None)
    if version is None:
        return
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]]
    if tuple(parts + [0] * (2 - len(parts))) < MIN_TRANSFORMERS:
        wanted = ".".join(map(str, MIN_TRANSFORMERS))
        raise UnsupportedModelError(
            f"transformers {version} is installed; subnetact's Hugging Face support needs transformers>={wanted} "
            f"(pip install -U 'transformers>={wanted}')"
        )


def analyse(
    model: nn.Module,
    config: ConvertConfig,
    filter_fn: Callable[[nn.Module, str], bool] | None,
    family: TransformerFamily,
    example_inputs: ExampleInputs | None = None,
) -> ConversionPlan:
    """Phase 1 of :func:`subnetact.convert` for a Hugging Face encoder: validate and describe, change nothing.

    Besides the structure, the family is verified on the model itself (:func:`~subnetact.hf.verify.verify_family`:
    a tiny forward with hooks), so a family whose layers are shared or whose attention cannot run fewer heads is
    refused here instead of converting into a silently wrong supernet.
    """
    check_transformers_version()
    hf_config = getattr(model, "config", None)
    if getattr(hf_config, "is_decoder", False) or getattr(hf_config, "add_cross_attention", False):
        raise UnsupportedModelError(
            f"{type(model).__qualname__} is configured as a decoder (is_decoder={hf_config.is_decoder}, "
            f"add_cross_attention={hf_config.add_cross_attention}); subnetact converts encoders only"
        )
    path, layers = find_layers(model, family)
    if filter_fn is not None and not filter_fn(layers, path):
        raise UnsupportedModelError(
            f"filter_fn rejected {path!r}, the only stage of {type(model).__qualname__} (its encoder layers); "
            "nothing would be converted"
        )
    _, parts = all_layer_parts(model, family)
    verify_family(model, family, path, parts, config.width_choices, example_inputs)
    n = len(parts)
    elastic_heads = family.per_head_bias is None
    if not elastic_heads:
        _warn_fixed_heads(model, family, parts)
    heads_entries, ffn_entries, groups = [], [], []
    slices: dict[str, tuple[int | None, int | None]] = {}
    custom: dict[str, Callable[[nn.Module], nn.Module]] = {}
    for i, p in enumerate(parts):
        hg, fg = group_indices(family, i)
        if hg is not None:
            head_sizes = tuple((w, p.head_size * active_heads(w, p.heads)) for w in config.width_choices)
            groups.append(ChannelGroup("heads", i, p.heads * p.head_size, head_sizes))
            heads_entries.append(Entry(f"{p.path}.{family.attention}", config.width_choices))
            for name in (family.query, family.key, family.value, *(name for name, _ in p.extras)):
                slices[f"{p.path}.{name}"] = (hg, None)
            if family.head_count_per_subnet:
                custom[f"{p.path}.{family.attention}"] = head_count_factory(
                    hg, p.head_size, family.heads_attr, family.all_head_size_attr
                )
            slices[f"{p.path}.{family.out}"] = (None, hg)
        ffn_sizes = tuple((w, active_neurons(w, p.ffn)) for w in config.width_choices)
        groups.append(ChannelGroup("ffn", i, p.ffn, ffn_sizes))
        ffn_entries.append(Entry(f"{p.path}.{family.fc1}", config.width_choices))
        slices[f"{p.path}.{family.fc1}"] = (fg, None)
        if family.gate is not None:
            slices[f"{p.path}.{family.gate}"] = (fg, None)
        slices[f"{p.path}.{family.fc2}"] = (None, fg)
    dims = {"depth": [Entry(path, tuple(range(min(config.min_depth, n), n + 1)))]}
    if elastic_heads:
        dims["heads"] = heads_entries
    dims["ffn"] = ffn_entries
    links = dict(WIDTH_LINK) if elastic_heads else {"width": ("ffn",)}
    return ConversionPlan([StagePlan(path, EVERY_OTHER)], dims, groups, slices, custom=custom, links=links)


def group_indices(family: TransformerFamily, layer: int) -> tuple[int | None, int]:
    """The channel groups of layer ``layer``: (heads group or None where heads are fixed, FFN group)."""
    if family.per_head_bias is None:
        return 2 * layer, 2 * layer + 1
    return None, layer


def _warn_fixed_heads(model: nn.Module, family: TransformerFamily, parts: list) -> None:
    """Say once per convert that heads are not elastic and which module blocks them."""
    tables = [
        f"{name} ({module})"
        for name, module in model.named_modules()
        if name.rpartition(".")[2] == family.per_head_bias
    ]
    warnings.warn(
        f"{type(model).__qualname__}: attention heads are not elastic: "
        f"{', '.join(tables) or family.per_head_bias} holds a relative position bias with one column per head, "
        f"computed once for all {parts[0].heads} heads and added to the attention scores of every layer, so a layer "
        "with fewer heads cannot add it. Converted with depth and FFN width only (width= sets ffn)",
        UserWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """``warnings.warn``'s stacklevel of the first frame outside subnetact (the user's ``convert`` call), whichever
    adapter path led here."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def export_hook(model: nn.Module, plan: Plan, dense: nn.Module, family: TransformerFamily) -> nn.Module:
    """Turn the generic rebuild of a converted encoder into a self-consistent Hugging Face model.

    ``dense`` already has the kept layers with narrower ``nn.Linear`` layers. This gives it (and every submodule
    that held the supernet's config) a new config with ``num_hidden_layers=D`` and, when every kept layer has the
    same widths, ``num_attention_heads`` and ``intermediate_size`` of the subnet; and it sets each attention
    module's head count (and ``all_head_size``) to its kept heads, keeping the supernet's head size.
    """
    state = state_of(model)
    cfg = plan.config
    sizes = state.group_sizes(cfg)
    _, layers = find_layers(model, family)
    _, parts = all_layer_parts(model, family, plain=False)
    kept = layers.kept_positions(cfg)
    groups = [group_indices(family, i) for i in kept]
    heads = [parts[i].heads if hg is None else sizes[hg] // parts[i].head_size for i, (hg, _) in zip(kept, groups)]
    ffn = [sizes[fg] for _, fg in groups]
    head_size = parts[0].head_size

    old_config = model.config
    new_config = copy.deepcopy(old_config)
    new_config.num_hidden_layers = len(kept)
    uniform = len(set(heads)) == 1 and len(set(ffn)) == 1 and len({p.head_size for p in parts}) == 1
    if uniform:
        new_config.num_attention_heads = heads[0]
        setattr(new_config, family.config_ffn, ffn[0])
        if family.config_head_dim is not None:
            setattr(new_config, family.config_head_dim, head_size)
    # Provenance, and the per-layer shapes a config cannot express otherwise (JSON-serialisable, so it survives
    # save_pretrained).
    new_config.subnetact_subnet = {
        "config": cfg.to_dict(),
        "supernet_layers": list(kept),
        "num_attention_heads": heads,
        "intermediate_size": ffn,
        "attention_head_size": [parts[i].head_size for i in kept],
    }
    for module in dense.modules():
        if getattr(module, "config", None) is old_config:
            module.config = new_config
    _, dense_layers = find_layers(dense, family)
    for j, (layer, h, i) in enumerate(zip(dense_layers, heads, kept)):
        attention = layer.get_submodule(family.attention)
        setattr(attention, family.heads_attr, h)
        if family.all_head_size_attr is not None:
            setattr(attention, family.all_head_size_attr, h * parts[i].head_size)
        for m in layer.modules():
            if getattr(m, "layer_idx", None) is not None:
                m.layer_idx = j  # cache slot of the layer, numbered in the dense model
    return dense


def install(qualname: str, family: TransformerFamily, example_inputs: ExampleInputs | None = None) -> None:
    """Register the adapter and the export hook of ``family`` for the class named ``qualname``."""
    # variant_for: one class may have two layouts (T5's plain and gated FFN); each model gets the one it has.
    register_model_adapter(qualname)(
        lambda model, config, filter_fn: analyse(model, config, filter_fn, variant_for(model, family), example_inputs)
    )
    register_export_hook(qualname)(
        lambda model, plan, dense: export_hook(model, plan, dense, variant_for(model, family))
    )


def register_family(
    family: TransformerFamily, classes: Sequence[str], *, example_inputs: ExampleInputs | None = None
) -> None:
    """Make :func:`subnetact.convert`, ``export`` and :func:`subnetact.reorder` handle ``classes``.

    Nothing is checked against a model here (``transformers`` is not imported): every ``convert`` of one of
    ``classes`` first verifies the family on the model (each layer runs once, in order; fewer heads and FFN
    neurons run as fewer heads and neurons) and refuses the model with :class:`~subnetact.UnsupportedModelError`
    if the family does not describe how it computes (ALBERT's shared layer, DeBERTa-v2's relative attention).

    Args:
        family: where the family's elastic modules live.
        classes: ``"module.QualName"`` of each model class, e.g.
            ``"transformers.models.bert.modeling_bert.BertForTokenClassification"`` (a name, so ``transformers`` is
            not imported).
        example_inputs: ``model -> dict`` of keyword inputs for the tiny verification forward, for models whose
            ``main_input_name`` is neither ``input_ids`` nor ``pixel_values`` (default: built from the config).

    Raises:
        ConfigError: (a ``ValueError``) ``family`` is not a :class:`TransformerFamily`, ``classes`` is not a list of
            ``"module.QualName"`` strings, or ``example_inputs`` is not callable; nothing is registered.

    Example::

        >>> subnetact.hf.register_family(subnetact.hf.BERT, ["transformers.models.bert.modeling_bert.BertForMaskedLM"])
    """
    if not isinstance(family, TransformerFamily):
        raise ConfigError(f"family={family!r} must be a subnetact.hf.TransformerFamily")
    if isinstance(classes, str) or not all(isinstance(c, str) and "." in c for c in classes):
        raise ConfigError(f"classes={classes!r} must be a list of 'module.QualName' strings")
    if example_inputs is not None and not callable(example_inputs):
        raise ConfigError(f"example_inputs={example_inputs!r} must be a callable model -> dict of inputs, or None")
    record_family(family, classes)
    for qualname in classes:
        install(qualname, family, example_inputs)
