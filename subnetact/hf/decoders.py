"""Hugging Face decoder LLMs as elastic supernets (issue 24): Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Phi-3,
GPT-2 and OPT, found by plain :func:`subnetact.convert`.

Space of a converted decoder of ``L`` layers, ``KV`` key-value heads each shared by ``n_rep`` query heads of ``d``
features, and ``I`` FFN neurons per layer:

- ``depth`` (one entry, the decoder-layer list; choices ``min_depth..L``): ``D`` runs layers
  ``[floor(i * L / D) for i in range(D)]`` (always layer 0). A model whose forward picks each layer's attention mask
  by the layer's position in its loop and whose layers differ in mask (Gemma2's alternating sliding/global layers)
  has no depth entry: skipping a layer would hand the next one the wrong mask.
- ``heads`` (one entry per layer): a fraction ``w`` keeps the first ``g = ceil(w * KV)`` whole KV groups with their
  ``g * n_rep`` query heads (q rows, k/v rows, o columns). The ratio ``n_rep`` never changes, so the attention's own
  ``repeat_kv`` pairs the heads as in the original, and a subnet's KV cache is ``(B, g, T, d)`` per layer.
- ``ffn`` (one entry per layer, MatFormer): ``w`` keeps the first ``ceil(w * I)`` neurons: rows of ``gate_proj``
  and ``up_proj`` (Phi-3's fused ``gate_up_proj``: the prefix of each half; GPT-2's ``Conv1D`` ``c_fc``: columns),
  columns of ``down_proj``.
- the link ``width -> (heads, ffn)``.

RMSNorm / LayerNorm, embeddings, rotary embeddings and the LM head are untouched: the residual stream stays whole.

**KV cache.** Each attention checks the cache it is given (:func:`~subnetact.hf.decoder_ops.check_cache_layout`):
a cache holding tokens may only be extended by a subnet of the same depth and KV heads per layer, so FFN widths can
change between decode steps of one sequence, sharing the cache, while a change of heads or depth is refused with
:class:`~subnetact.InvalidSubnetError`. Skipped layers keep no entries (the cache is indexed by the supernet's layer
numbers; an exported subnet numbers its layers 0..D-1).

Convert runs the original and the converted model (largest subnet) on a tiny input and requires bit-identical
logits; the smallest subnet must run and give the same shapes. Anything failing is rolled back.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .._registry import ClassRegistry
from ..errors import ConfigError, UnsupportedModelError
from ..export import register_export_hook
from ..handlers import OperatorEntry
from ..layer_select import EVERY_OTHER
from ..plan import ConversionPlan, ConvertConfig, StagePlan, depth_choices, register_model_adapter
from ..space import Entry
from ..state import ChannelGroup, Plan, active_size, state_of
from .adapter import WIDTH_LINK, check_transformers_version
from .decoder_ops import OVERRIDE_KINDS


@dataclass(frozen=True)
class DecoderFamily:
    """Where the elastic parts of one decoder layer live (paths relative to the layer).

    Args:
        name: family name, for messages.
        layer_class: class name of a decoder layer; the model's ``nn.ModuleList`` of these is the depth stage.
        attention: the self-attention module (holds ``head_dim``).
        q, k, v, o: the separate projections (``nn.Linear``); None where the family fuses q/k/v into ``qkv``.
        qkv: the fused q/k/v projection (Phi-3's ``qkv_proj`` ``nn.Linear``, GPT-2's ``c_attn`` ``Conv1D``).
        gate, up, down: the FFN's projections (``gate`` None for an ungated FFN: OPT's ``fc1``, GPT-2's ``c_fc``).
        gate_up: a fused gate/up projection (Phi-3), its two halves sliced alike.
        overrides: attention attributes the forward reads that depend on the head count, as ``(attribute, kind)``
            with kind one of ``"q_heads"``, ``"q_features"``, ``"kv_heads"``, ``"config"`` (see
            :mod:`subnetact.hf.decoder_ops`).
        config_ffn: config attribute of the FFN width; config_kv_heads: of the KV head count (None: no GQA);
        config_head_dim: of the head size, where the model reads it from the config (None: ``hidden // heads``).
    """

    name: str
    layer_class: str
    attention: str = "self_attn"
    q: str | None = "self_attn.q_proj"
    k: str | None = "self_attn.k_proj"
    v: str | None = "self_attn.v_proj"
    o: str = "self_attn.o_proj"
    qkv: str | None = None
    gate: str | None = "mlp.gate_proj"
    up: str | None = "mlp.up_proj"
    down: str = "mlp.down_proj"
    gate_up: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    config_ffn: str = "intermediate_size"
    config_kv_heads: str | None = "num_key_value_heads"
    config_head_dim: str | None = "head_dim"

    def __post_init__(self) -> None:
        for attr, kind in self.overrides:
            if kind not in OVERRIDE_KINDS:
                raise ConfigError(f"overrides: {attr!r} has kind {kind!r}; allowed are {OVERRIDE_KINDS}")


LLAMA = DecoderFamily("llama", "LlamaDecoderLayer")
MISTRAL = DecoderFamily("mistral", "MistralDecoderLayer")
QWEN2 = DecoderFamily("qwen2", "Qwen2DecoderLayer")
QWEN3 = DecoderFamily("qwen3", "Qwen3DecoderLayer")
GEMMA = DecoderFamily("gemma", "GemmaDecoderLayer")
GEMMA2 = DecoderFamily("gemma2", "Gemma2DecoderLayer")
PHI3 = DecoderFamily(
    "phi3",
    "Phi3DecoderLayer",
    q=None,
    k=None,
    v=None,
    qkv="self_attn.qkv_proj",
    gate=None,
    up=None,
    gate_up="mlp.gate_up_proj",
    overrides=(("num_key_value_heads", "kv_heads"), ("config", "config")),
)
GPT2 = DecoderFamily(
    "gpt2",
    "GPT2Block",
    attention="attn",
    q=None,
    k=None,
    v=None,
    o="attn.c_proj",
    qkv="attn.c_attn",
    gate=None,
    up="mlp.c_fc",
    down="mlp.c_proj",
    overrides=(("split_size", "q_features"), ("num_heads", "q_heads")),
    config_ffn="n_inner",
    config_kv_heads=None,
    config_head_dim=None,
)
OPT = DecoderFamily(
    "opt",
    "OPTDecoderLayer",
    o="self_attn.out_proj",
    gate=None,
    up="fc1",
    down="fc2",
    overrides=(("num_heads", "q_heads"),),
    config_ffn="ffn_dim",
    config_kv_heads=None,
    config_head_dim=None,
)

_MODELS = "transformers.models."
#: (family, module under transformers.models, class-name prefix, model classes besides the base model)
BUILTIN = (
    (LLAMA, "llama.modeling_llama", "Llama", ("ForCausalLM",)),
    (MISTRAL, "mistral.modeling_mistral", "Mistral", ("ForCausalLM",)),
    (QWEN2, "qwen2.modeling_qwen2", "Qwen2", ("ForCausalLM",)),
    (QWEN3, "qwen3.modeling_qwen3", "Qwen3", ("ForCausalLM",)),
    (GEMMA, "gemma.modeling_gemma", "Gemma", ("ForCausalLM",)),
    (GEMMA2, "gemma2.modeling_gemma2", "Gemma2", ("ForCausalLM",)),
    (PHI3, "phi3.modeling_phi3", "Phi3", ("ForCausalLM",)),
    (GPT2, "gpt2.modeling_gpt2", "GPT2", ("LMHeadModel",)),
    (OPT, "opt.modeling_opt", "OPT", ("ForCausalLM",)),
)


@dataclass(frozen=True)
class DecoderLayerParts:
    """One decoder layer's elastic modules and geometry."""

    path: str
    layer: nn.Module
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    ffn: int


def find_decoder_layers(model: nn.Module, family: DecoderFamily) -> tuple[str, nn.ModuleList]:
    """The path and the ``nn.ModuleList`` of ``family.layer_class`` layers (exactly one must exist)."""
    found = [
        (path, module)
        for path, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module) > 0
        and all(type(child).__name__ == family.layer_class for child in module._modules.values())
    ]
    if len(found) != 1:
        raise UnsupportedModelError(
            f"{type(model).__qualname__}: expected exactly one nn.ModuleList of {family.layer_class} (the "
            f"{family.name} decoder layers), found {len(found)} {[p for p, _ in found]}"
        )
    return found[0]


def _get(layer: nn.Module, path: str, name: str, kinds: tuple[str, ...], plain: bool = True) -> nn.Module:
    try:
        module = layer.get_submodule(name)
    except AttributeError:
        raise UnsupportedModelError(f"{path} has no submodule {name!r} (the decoder layout expected)") from None
    linear = type(module) is nn.Linear if plain else isinstance(module, nn.Linear)
    if type(module).__name__ not in kinds and not (linear and "Linear" in kinds):
        raise UnsupportedModelError(
            f"{path}.{name} is a {type(module).__qualname__}; subnetact slices plain torch.nn.Linear "
            f"{'and Conv1D ' if 'Conv1D' in kinds else ''}projections (quantised or adapter-wrapped layers are not "
            "supported)"
        )
    return module


def _out_features(module: nn.Module) -> int:
    return module.weight.shape[1] if type(module).__name__ == "Conv1D" else module.weight.shape[0]


def layer_parts(
    model: nn.Module, family: DecoderFamily, path: str, layer: nn.Module, *, plain: bool = True
) -> DecoderLayerParts:
    """Check one decoder layer against ``family`` and read its head and FFN geometry from its weights.

    ``plain``: require exact ``nn.Linear`` projections (before conversion); False also accepts the converted
    ``WeightSliceLinear``."""
    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", None)
    kv_heads = getattr(cfg, family.config_kv_heads, None) if family.config_kv_heads else heads
    kv_heads = heads if kv_heads is None else kv_heads
    try:
        attention = layer.get_submodule(family.attention)
    except AttributeError:
        raise UnsupportedModelError(f"{path} has no submodule {family.attention!r}") from None
    head_dim = getattr(attention, "head_dim", None)
    if not all(isinstance(n, int) and n > 0 for n in (heads, kv_heads, head_dim)) or heads % kv_heads:
        raise UnsupportedModelError(
            f"{path}: num_attention_heads={heads!r}, KV heads={kv_heads!r}, head_dim={head_dim!r}; expected positive "
            "ints with the query heads a multiple of the KV heads"
        )
    q_features, kv_features = heads * head_dim, kv_heads * head_dim
    kinds = ("Linear", "Conv1D")
    if family.qkv is not None:
        fused = _out_features(_get(layer, path, family.qkv, kinds, plain))
        expected = {"q": q_features + 2 * kv_features}
        if fused != expected["q"]:
            raise UnsupportedModelError(
                f"{path}.{family.qkv} gives {fused} features; {heads} query and {kv_heads} KV heads of {head_dim} "
                f"need {expected['q']}"
            )
    else:
        for name, want in ((family.q, q_features), (family.k, kv_features), (family.v, kv_features)):
            got = _out_features(_get(layer, path, name, ("Linear",), plain))
            if got != want:
                raise UnsupportedModelError(f"{path}.{name} gives {got} features, the heads need {want}")
    o = _get(layer, path, family.o, kinds, plain)
    o_in = o.weight.shape[0] if type(o).__name__ == "Conv1D" else o.weight.shape[1]
    if o_in != q_features:
        raise UnsupportedModelError(f"{path}.{family.o} reads {o_in} features, the heads give {q_features}")
    if family.gate_up is not None:
        ffn2 = _out_features(_get(layer, path, family.gate_up, ("Linear",), plain))
        ffn = ffn2 // 2
    else:
        ffn = _out_features(_get(layer, path, family.up, kinds, plain))
        if family.gate is not None and _out_features(_get(layer, path, family.gate, ("Linear",), plain)) != ffn:
            raise UnsupportedModelError(f"{path}.{family.gate} and {family.up} differ in width")
    down = _get(layer, path, family.down, kinds, plain)
    down_in = down.weight.shape[0] if type(down).__name__ == "Conv1D" else down.weight.shape[1]
    if down_in != ffn:
        raise UnsupportedModelError(f"{path}.{family.down} reads {down_in} features, the FFN gives {ffn}")
    return DecoderLayerParts(path, layer, heads, kv_heads, head_dim, ffn)


def _depth_is_elastic(model: nn.Module) -> bool:
    # Gemma2, Qwen2, Qwen3: ``for i, layer in enumerate(self.layers[...])`` reads ``config.layer_types[i]`` by loop
    # position, which is the kept layer's position, not its index: only equal types survive skipping.
    types = getattr(model.config, "layer_types", None)
    return not types or len(set(types)) == 1


def _example_input(model: nn.Module) -> dict[str, torch.Tensor]:
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    return {"input_ids": torch.randint(0, vocab, (2, 8), generator=gen).to(device), "use_cache": False}


def _logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def analyse(
    model: nn.Module, config: ConvertConfig, filter_fn: Callable[[nn.Module, str], bool] | None, family: DecoderFamily
) -> ConversionPlan:
    """Phase 1 of :func:`subnetact.convert` for a decoder: validate and describe; the original model's output on a
    tiny input is computed here for the convert-time check (:func:`_check`)."""
    check_transformers_version()
    path, layers = find_decoder_layers(model, family)
    if filter_fn is not None and not filter_fn(layers, path):
        raise UnsupportedModelError(f"filter_fn rejected {path!r}, the only stage of {type(model).__qualname__}")
    parts = [layer_parts(model, family, f"{path}.{name}", layer) for name, layer in layers._modules.items()]
    n = len(parts)
    if getattr(model.config, "num_hidden_layers", n) != n:
        raise UnsupportedModelError(
            f"{type(model).__qualname__}: config.num_hidden_layers={model.config.num_hidden_layers} but {path!r} "
            f"holds {n} layers"
        )
    depth_elastic = _depth_is_elastic(model)
    groups: list[ChannelGroup] = []
    heads_entries, ffn_entries = [], []
    slices: dict[str, tuple[int | None, int | None]] = {}
    operators: dict[str, OperatorEntry] = {}
    layout_groups = tuple(3 * i + 1 for i in range(n))
    for i, p in enumerate(parts):
        qg, kvg, fg = 3 * i, 3 * i + 1, 3 * i + 2
        n_rep = p.heads // p.kv_heads
        kept = {w: active_size(w, p.kv_heads) for w in config.width_choices}
        q_sizes = tuple((w, g * n_rep * p.head_dim) for w, g in kept.items())
        groups.append(ChannelGroup("heads", i, p.heads * p.head_dim, q_sizes))
        groups.append(
            ChannelGroup("heads", i, p.kv_heads * p.head_dim, tuple((w, g * p.head_dim) for w, g in kept.items()))
        )
        ffn_sizes = tuple((w, active_size(w, p.ffn)) for w in config.width_choices)
        groups.append(ChannelGroup("ffn", i, p.ffn, ffn_sizes))
        heads_entries.append(Entry(f"{p.path}.{family.attention}", config.width_choices))
        ffn_entries.append(Entry(f"{p.path}.{family.down}", config.width_choices))
        # The attention first: its children's entries then replace the children of its copy.
        operators[f"{p.path}.{family.attention}"] = OperatorEntry(
            "decoder_attention",
            (kvg, *layout_groups),
            (p.head_dim, n_rep, family.overrides, 0 if depth_elastic else None),
        )
        q_f, kv_f = p.heads * p.head_dim, p.kv_heads * p.head_dim
        if family.qkv is not None:
            spans = ((0, q_f), (q_f, kv_f), (q_f + kv_f, kv_f))
            operators[f"{p.path}.{family.qkv}"] = OperatorEntry("packed_projection", (None, qg, kvg, kvg), spans)
        else:
            slices.update({f"{p.path}.{family.q}": (qg, None), f"{p.path}.{family.k}": (kvg, None)})
            slices[f"{p.path}.{family.v}"] = (kvg, None)
        if family.gate_up is not None:  # Phi-3: the prefix of each half
            spans = ((0, p.ffn), (p.ffn, p.ffn))
            operators[f"{p.path}.{family.gate_up}"] = OperatorEntry("packed_projection", (None, fg, fg), spans)
        else:
            if family.gate is not None:
                slices[f"{p.path}.{family.gate}"] = (fg, None)
            if _is_conv1d(p.layer.get_submodule(family.up)):
                operators[f"{p.path}.{family.up}"] = OperatorEntry("packed_projection", (None, fg), ((0, p.ffn),))
            else:
                slices[f"{p.path}.{family.up}"] = (fg, None)
        for name, group in ((family.o, qg), (family.down, fg)):  # input columns (Conv1D: rows)
            if _is_conv1d(p.layer.get_submodule(name)):
                operators[f"{p.path}.{name}"] = OperatorEntry("packed_projection", (group,), ())
            else:
                slices[f"{p.path}.{name}"] = (None, group)
    dims: dict[str, list[Entry]] = {}
    stages = []
    if depth_elastic:
        dims["depth"] = [Entry(path, depth_choices(n, config.min_depth))]
        stages = [StagePlan(path, EVERY_OTHER)]
    dims["heads"], dims["ffn"] = heads_entries, ffn_entries
    reference = _reference_output(model)
    return ConversionPlan(
        stages,
        dims,
        groups,
        slices,
        links=dict(WIDTH_LINK),
        operators=operators,
        check=lambda converted: _check(converted, reference),
    )


def _is_conv1d(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D"


def _reference_output(model: nn.Module) -> tuple[dict, torch.Tensor]:
    inputs = _example_input(model)
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            return inputs, _logits(model(**inputs)).clone()
    except Exception as exc:
        raise UnsupportedModelError(
            f"{type(model).__qualname__}: the tiny forward that checks the conversion failed ({type(exc).__name__}: "
            f"{exc})"
        ) from exc
    finally:
        for m, flag in modes.items():
            m.training = flag


def _check(model: nn.Module, reference: tuple[dict, torch.Tensor]) -> None:
    """The convert-time check: the largest subnet's logits equal the original's bit for bit; the smallest runs."""
    inputs, want = reference
    modes = {m: m.training for m in model.modules()}
    state = state_of(model)
    try:
        model.eval()
        with torch.no_grad():
            got = _logits(model(**inputs, subnet=state.max_config))
            if got.shape != want.shape or not torch.equal(got, want):
                diff = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)}"
                raise UnsupportedModelError(
                    f"{type(model).__qualname__}: the converted largest subnet does not reproduce the original "
                    f"logits bit for bit (max difference {diff}); refused"
                )
            try:
                small = _logits(model(**inputs, subnet=state.space.min()))
            except Exception as exc:
                raise UnsupportedModelError(
                    f"{type(model).__qualname__}: the smallest subnet fails to run ({type(exc).__name__}: {exc}); "
                    "the family's attention must reshape q/k/v by head size or name the head-count attributes it "
                    "reads in DecoderFamily.overrides. Refused"
                ) from exc
            if small.shape != want.shape:
                raise UnsupportedModelError(
                    f"{type(model).__qualname__}: the smallest subnet gives logits of shape {tuple(small.shape)}, "
                    f"not {tuple(want.shape)}"
                )
    finally:
        for m, flag in modes.items():
            m.training = flag


def export_hook(model: nn.Module, plan: Plan, dense: nn.Module, family: DecoderFamily) -> nn.Module:
    """Give the generic rebuild of a converted decoder a config describing the subnet, renumber the kept layers'
    cache slots, and give attentions that read their head count from the config (Phi-3) a config of their own."""
    state = state_of(model)
    cfg = plan.config
    sizes = state.group_sizes(cfg)
    _, layers = find_decoder_layers(model, family)
    n = len(layers)
    kept = layers.kept_positions(cfg) if hasattr(layers, "kept_positions") else list(range(n))
    head_dim = [layers[i].get_submodule(family.attention).head_dim for i in kept]
    kv_heads = [sizes[3 * i + 1] // d for i, d in zip(kept, head_dim)]
    q_heads = [sizes[3 * i] // d for i, d in zip(kept, head_dim)]
    ffn = [sizes[3 * i + 2] for i in kept]

    old = model.config
    new = copy.deepcopy(old)
    new.num_hidden_layers = len(kept)
    types = getattr(old, "layer_types", None)
    if types:
        new.layer_types = [types[i] for i in kept]
    uniform = len(set(q_heads)) == 1 and len(set(kv_heads)) == 1 and len(set(ffn)) == 1 and len(set(head_dim)) == 1
    if uniform:
        new.num_attention_heads = q_heads[0]
        if family.config_kv_heads is not None:
            setattr(new, family.config_kv_heads, kv_heads[0])
        setattr(new, family.config_ffn, ffn[0])
        if family.config_head_dim is not None:
            setattr(new, family.config_head_dim, head_dim[0])
    new.subnetact_subnet = {
        "config": cfg.to_dict(),
        "supernet_layers": list(kept),
        "num_attention_heads": q_heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": ffn,
        "head_dim": head_dim,
    }
    for module in dense.modules():
        if getattr(module, "config", None) is old:
            module.config = new
    _, dense_layers = find_decoder_layers(dense, family)
    config_override = any(kind == "config" for _, kind in family.overrides)
    for j, (layer, h, kv) in enumerate(zip(dense_layers, q_heads, kv_heads)):
        for m in layer.modules():
            if getattr(m, "layer_idx", None) is not None:
                m.layer_idx = j  # the layer's cache slot, numbered in the dense model
        if config_override and (h, kv) != (new.num_attention_heads, getattr(new, family.config_kv_heads or "", kv)):
            own = copy.copy(new)
            own.num_attention_heads = h
            if family.config_kv_heads is not None:
                setattr(own, family.config_kv_heads, kv)
            layer.get_submodule(family.attention).config = own
    return dense


#: "module.QualName" of each registered decoder class -> its family.
_DECODERS: ClassRegistry[DecoderFamily] = ClassRegistry()


def decoder_family_of(model: nn.Module) -> DecoderFamily | None:
    """The registered decoder family of ``model``'s class (or of its original class, for a converted model)."""
    return _DECODERS.lookup(getattr(type(model), "_subnetact_base", type(model)))


def install(qualname: str, family: DecoderFamily) -> None:
    """Register the adapter and the export hook of ``family`` for the class named ``qualname``."""
    register_model_adapter(qualname)(lambda model, config, filter_fn: analyse(model, config, filter_fn, family))
    register_export_hook(qualname)(lambda model, plan, dense: export_hook(model, plan, dense, family))


def register_decoder(family: DecoderFamily, classes: Sequence[str]) -> None:
    """Make :func:`subnetact.convert` and ``export`` handle the decoder classes ``classes`` (``"module.QualName"``)
    as ``family`` describes (e.g. ``LlamaForSequenceClassification`` with :data:`LLAMA`).

    Raises:
        ConfigError: (a ``ValueError``) ``family`` is not a :class:`DecoderFamily` or ``classes`` not a list of
            ``"module.QualName"`` strings; nothing is registered.
    """
    if not isinstance(family, DecoderFamily):
        raise ConfigError(f"family={family!r} must be a subnetact.hf.DecoderFamily")
    if isinstance(classes, str) or not all(isinstance(c, str) and "." in c for c in classes):
        raise ConfigError(f"classes={classes!r} must be a list of 'module.QualName' strings")
    for qualname in classes:
        _DECODERS[qualname] = family
        install(qualname, family)


for _family, _module, _prefix, _classes in BUILTIN:
    register_decoder(_family, [f"{_MODELS}{_module}.{_prefix}{suffix}" for suffix in ("Model", *_classes)])
