"""Where the elastic parts of a Hugging Face encoder live: one :class:`TransformerFamily` per model family.

Nothing here imports ``transformers``: models are recognised by class name and their modules reached by path, so
``import subnetact`` stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from torch import nn

from .._registry import ClassRegistry
from ..errors import UnsupportedModelError


@dataclass(frozen=True)
class TransformerFamily:
    """The module paths of one encoder layer of a Hugging Face model family (paths relative to the layer).

    Args:
        name: family name, for messages (``"bert"``).
        layer_class: class name of one encoder layer (``"BertLayer"``); the model's ``nn.ModuleList`` of these is
            the depth stage.
        attention: the self-attention module, which holds the head count and the head size as attributes.
        query, key, value: the q/k/v projections (their output rows are sliced by whole heads).
        out: the attention output projection (its input columns are sliced by whole heads).
        fc1, fc2: the FFN's first projection (output rows sliced) and second projection (input columns sliced).
        heads_attr, head_size_attr: attribute names of the head count and head size on ``attention``.
        all_head_size_attr: attribute holding ``heads * head_size`` on ``attention``, if the family has one.
        config_head_dim: config attribute the family reads the head size from (ViT: ``"head_dim"``), so an exported
            model with fewer heads gets a config that rebuilds the same shapes; None where the head size is always
            ``hidden_size // num_attention_heads`` (BERT, RoBERTa).
        config_ffn: config attribute of the FFN width (DistilBERT: ``"hidden_dim"``).
        extra_head_projections: further projections whose output rows are the heads, sliced with q/k/v where a layer
            has them (DeBERTa-v2's relative-position ``pos_key_proj`` / ``pos_query_proj``).
        head_count_per_subnet: the attention reshapes q/k/v by its ``heads_attr`` (DeBERTa-v2) rather than by head
            size; the converted attention then reads that attribute from the active subnet
            (:mod:`subnetact.head_count`).
        gate: a gated FFN's second input projection, multiplied elementwise with the activated ``fc1`` (T5 v1.1 and
            Flan-T5: ``fc1`` is ``wi_0``, the gate ``wi_1``); its output rows are the neurons too, sliced with fc1.
        per_head_bias: name of the module holding a relative position bias with one column per head that is computed
            once and added to the attention scores of every layer (MPNet's ``relative_attention_bias``, T5's): a
            layer with fewer heads cannot add it, so heads are not elastic and the space has depth and FFN width
            only (``convert`` warns, naming the module). None: heads are elastic.
    """

    name: str
    layer_class: str
    attention: str
    query: str
    key: str
    value: str
    out: str
    fc1: str
    fc2: str
    heads_attr: str = "num_attention_heads"
    head_size_attr: str = "attention_head_size"
    all_head_size_attr: str | None = "all_head_size"
    config_head_dim: str | None = None
    config_ffn: str = "intermediate_size"
    extra_head_projections: tuple[str, ...] = ()
    head_count_per_subnet: bool = False
    gate: str | None = None
    per_head_bias: str | None = None


BERT = TransformerFamily(
    name="bert",
    layer_class="BertLayer",
    attention="attention.self",
    query="attention.self.query",
    key="attention.self.key",
    value="attention.self.value",
    out="attention.output.dense",
    fc1="intermediate.dense",
    fc2="output.dense",
)
ROBERTA = TransformerFamily(
    name="roberta",
    layer_class="RobertaLayer",
    attention="attention.self",
    query="attention.self.query",
    key="attention.self.key",
    value="attention.self.value",
    out="attention.output.dense",
    fc1="intermediate.dense",
    fc2="output.dense",
)
VIT = TransformerFamily(
    name="vit",
    layer_class="ViTLayer",
    attention="attention",
    query="attention.q_proj",
    key="attention.k_proj",
    value="attention.v_proj",
    out="attention.o_proj",
    fc1="mlp.fc1",
    fc2="mlp.fc2",
    head_size_attr="head_dim",
    all_head_size_attr=None,
    config_head_dim="head_dim",
)

ELECTRA = replace(BERT, name="electra", layer_class="ElectraLayer")
XLM_ROBERTA = replace(BERT, name="xlm-roberta", layer_class="XLMRobertaLayer")
DISTILBERT = TransformerFamily(
    name="distilbert",
    layer_class="TransformerBlock",
    attention="attention",
    query="attention.q_lin",
    key="attention.k_lin",
    value="attention.v_lin",
    out="attention.out_lin",
    fc1="ffn.lin1",
    fc2="ffn.lin2",
    heads_attr="n_heads",
    all_head_size_attr=None,
    config_ffn="hidden_dim",
)
DEIT = replace(VIT, name="deit", layer_class="DeiTLayer")
DEBERTA_V2 = TransformerFamily(
    name="deberta-v2",
    layer_class="DebertaV2Layer",
    attention="attention.self",
    query="attention.self.query_proj",
    key="attention.self.key_proj",
    value="attention.self.value_proj",
    out="attention.output.dense",
    fc1="intermediate.dense",
    fc2="output.dense",
    config_head_dim="attention_head_size",
    extra_head_projections=("attention.self.pos_key_proj", "attention.self.pos_query_proj"),
    head_count_per_subnet=True,
)

CLIP = TransformerFamily(
    name="clip",
    layer_class="CLIPEncoderLayer",
    attention="self_attn",
    query="self_attn.q_proj",
    key="self_attn.k_proj",
    value="self_attn.v_proj",
    out="self_attn.out_proj",
    fc1="mlp.fc1",
    fc2="mlp.fc2",
    heads_attr="num_heads",
    head_size_attr="head_dim",
    all_head_size_attr=None,
)
WAV2VEC2 = TransformerFamily(
    name="wav2vec2",
    layer_class="Wav2Vec2EncoderLayer",
    attention="attention",
    query="attention.q_proj",
    key="attention.k_proj",
    value="attention.v_proj",
    out="attention.out_proj",
    fc1="feed_forward.intermediate_dense",
    fc2="feed_forward.output_dense",
    heads_attr="num_heads",
    head_size_attr="head_dim",
    all_head_size_attr=None,
)

# MPNet: BERT's layer with its own names; the encoder adds one relative position bias, (B, H, T, T) from an
# Embedding(buckets, H), to every layer's scores (heads fixed).
MPNET = TransformerFamily(
    name="mpnet",
    layer_class="MPNetLayer",
    attention="attention.attn",
    query="attention.attn.q",
    key="attention.attn.k",
    value="attention.attn.v",
    out="attention.attn.o",
    fc1="intermediate.dense",
    fc2="output.dense",
    per_head_bias="relative_attention_bias",
)
# T5's encoder (ReLU FFN ``wi``/``wo``; the gated v1.1 FFN ``wi_0``/``wi_1`` has no single fc1): the first block
# computes the relative position bias of all heads and every block adds it (heads fixed).
T5 = TransformerFamily(
    name="t5",
    layer_class="T5Block",
    attention="layer.0.SelfAttention",
    query="layer.0.SelfAttention.q",
    key="layer.0.SelfAttention.k",
    value="layer.0.SelfAttention.v",
    out="layer.0.SelfAttention.o",
    fc1="layer.1.DenseReluDense.wi",
    fc2="layer.1.DenseReluDense.wo",
    heads_attr="n_heads",
    head_size_attr="key_value_proj_dim",
    all_head_size_attr="inner_dim",
    config_ffn="d_ff",
    per_head_bias="relative_attention_bias",
)
# T5 v1.1 / Flan-T5: the gated FFN, act(wi_0(x)) * wi_1(x) -> wo. A variant of T5 (same layer class): a model is
# converted with whichever of the two its layers have (:func:`variant_for`).
T5_GATED = replace(T5, name="t5-gated", fc1="layer.1.DenseReluDense.wi_0", gate="layer.1.DenseReluDense.wi_1")
# Whisper's encoder layers (after its convolutional front end): CLIP's attention names with fc1/fc2 on the layer;
# its attention reshapes k/v by the fixed ``num_heads``, so that attribute follows the subnet.
WHISPER = TransformerFamily(
    name="whisper",
    layer_class="WhisperEncoderLayer",
    attention="self_attn",
    query="self_attn.q_proj",
    key="self_attn.k_proj",
    value="self_attn.v_proj",
    out="self_attn.out_proj",
    fc1="fc1",
    fc2="fc2",
    heads_attr="num_heads",
    head_size_attr="head_dim",
    all_head_size_attr=None,
    config_ffn="encoder_ffn_dim",
    head_count_per_subnet=True,
)

#: Every built-in family, in the order a model of no registered class is matched against them by layout (see
#: :func:`family_by_layout`); families with the same module paths (BERT, RoBERTa, ELECTRA, ...) match alike.
BUILTIN_FAMILIES = (
    BERT,
    ROBERTA,
    ELECTRA,
    XLM_ROBERTA,
    DISTILBERT,
    DEBERTA_V2,
    VIT,
    DEIT,
    CLIP,
    WAV2VEC2,
    MPNET,
    T5,
    T5_GATED,
    WHISPER,
)

# "module.QualName" of each supported model class -> its family.
_FAMILIES: ClassRegistry[TransformerFamily] = ClassRegistry()
# Layer class name -> the family last registered with it, to name the family in an unregistered model's error.
_BY_LAYER_CLASS: dict[str, TransformerFamily] = {}


def record_family(family: TransformerFamily, classes: Sequence[str]) -> None:
    """Remember ``family`` for the model classes named ``classes`` and for its layer class (no adapter installed:
    :func:`subnetact.hf.register_family` does both)."""
    _BY_LAYER_CLASS[family.layer_class] = family
    for qualname in classes:
        _FAMILIES[qualname] = family


def family_of_layer_class(name: str) -> TransformerFamily | None:
    """The family last registered whose layer class is called ``name`` (None: no such family)."""
    return _BY_LAYER_CLASS.get(name)


def family_of(model: nn.Module) -> TransformerFamily | None:
    """The registered family of ``model``'s class (or of its original class, for a converted model), or its variant
    that fits the model's layers (:func:`variant_for`)."""
    family = _FAMILIES.lookup(getattr(type(model), "_subnetact_base", type(model)))
    return None if family is None else variant_for(model, family)


@dataclass(frozen=True)
class LayerParts:
    """The elastic modules of one encoder layer, and its head geometry."""

    path: str  # e.g. "bert.encoder.layer.3"
    layer: nn.Module
    attention: nn.Module
    query: nn.Module
    key: nn.Module
    value: nn.Module
    out: nn.Module
    fc1: nn.Module
    fc2: nn.Module
    heads: int
    head_size: int
    extras: tuple[tuple[str, nn.Module], ...] = ()  # (path in the layer, module) of the extra head projections
    gate: nn.Module | None = None  # a gated FFN's second input projection (rows: the neurons)

    @property
    def ffn(self) -> int:
        return self.fc1.out_features


def find_layers(model: nn.Module, family: TransformerFamily) -> tuple[str, nn.ModuleList]:
    """The path and the ``nn.ModuleList`` of ``family.layer_class`` layers of ``model`` (exactly one must exist)."""
    found = [
        (path, module)
        for path, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module) > 0
        and all(type(child).__name__ == family.layer_class for child in module.children())
    ]
    if len(found) != 1:
        where = [path for path, _ in found]
        raise UnsupportedModelError(
            f"{type(model).__qualname__}: expected exactly one nn.ModuleList of {family.layer_class} "
            f"(the {family.name} encoder layers), found {len(found)} {where}"
        )
    return found[0]


def layer_parts(path: str, layer: nn.Module, family: TransformerFamily, *, plain: bool = True) -> LayerParts:
    """Reach and check the elastic modules of one layer.

    Args:
        plain: require exact ``nn.Linear`` projections (before conversion); False also accepts subclasses (the
            converted ``WeightSliceLinear``).

    Raises:
        UnsupportedModelError: a module is missing, is not a linear layer, or the shapes do not match the heads.
    """

    def get(name: str) -> nn.Module:
        try:
            module = layer.get_submodule(name)
        except AttributeError:
            raise UnsupportedModelError(
                f"{path} ({type(layer).__qualname__}) has no submodule {name!r} ({family.name} layout expected)"
            ) from None
        ok = type(module) is nn.Linear if plain else isinstance(module, nn.Linear)
        if not ok:
            raise UnsupportedModelError(
                f"{path}.{name} is a {type(module).__qualname__}; subnetact slices plain torch.nn.Linear projections "
                "(quantised or adapter-wrapped layers are not supported)"
            )
        return module

    try:
        attention = layer.get_submodule(family.attention)
    except AttributeError:
        raise UnsupportedModelError(
            f"{path} ({type(layer).__qualname__}) has no submodule {family.attention!r} "
            f"({family.name} layout expected)"
        ) from None
    from ..head_count import HeadCount

    # A converted HeadCount attention answers its heads_attr with the active subnet's count; the supernet's is in
    # its __dict__.
    own = vars(attention) if isinstance(attention, HeadCount) else {}
    heads = own.get(family.heads_attr, getattr(attention, family.heads_attr, None))
    head_size = getattr(attention, family.head_size_attr, None)
    if not isinstance(heads, int) or not isinstance(head_size, int):
        raise UnsupportedModelError(
            f"{path}.{family.attention} has {family.heads_attr}={heads!r} and {family.head_size_attr}={head_size!r}; "
            "expected two ints"
        )
    extras = []
    for name in family.extra_head_projections:
        try:
            layer.get_submodule(name)
        except AttributeError:
            continue  # not built for this configuration (DeBERTa-v2: per pos_att_type and share_att_key)
        extras.append((name, get(name)))
    parts = LayerParts(
        path,
        layer,
        attention,
        *(get(n) for n in (family.query, family.key, family.value, family.out, family.fc1, family.fc2)),
        heads=heads,
        head_size=head_size,
        extras=tuple(extras),
        gate=None if family.gate is None else get(family.gate),
    )
    width = heads * head_size
    for name, size in (
        (family.query, parts.query.out_features),
        (family.key, parts.key.out_features),
        (family.value, parts.value.out_features),
        (family.out, parts.out.in_features),
        *((name, module.out_features) for name, module in extras),
    ):
        if size != width:
            raise UnsupportedModelError(
                f"{path}.{name} has {size} head features but the layer has {heads} heads of {head_size}"
            )
    if parts.gate is not None and parts.gate.out_features != parts.fc1.out_features:
        raise UnsupportedModelError(
            f"{path}.{family.gate} gives {parts.gate.out_features} features but {family.fc1} gives "
            f"{parts.fc1.out_features}; a gate must have one row per FFN neuron"
        )
    if parts.fc2.in_features != parts.fc1.out_features:
        raise UnsupportedModelError(
            f"{path}.{family.fc2} takes {parts.fc2.in_features} features but {family.fc1} gives "
            f"{parts.fc1.out_features}"
        )
    return parts


def all_layer_parts(
    model: nn.Module, family: TransformerFamily, *, plain: bool = True
) -> tuple[str, list[LayerParts]]:
    """The layer list's path and every layer's parts, in order."""
    path, layers = find_layers(model, family)
    return path, [layer_parts(f"{path}.{name}", layer, family, plain=plain) for name, layer in layers.named_children()]


def variant_for(model: nn.Module, family: TransformerFamily) -> TransformerFamily:
    """``family``, or the built-in variant with its layer class whose layout ``model``'s layers have (T5's plain or
    gated FFN: one model class, two layouts). ``family`` itself if it fits, if no variant does (its error then
    says why), or if it is not built in (a family the user wrote is never swapped for another)."""
    if family not in BUILTIN_FAMILIES:
        return family
    try:
        all_layer_parts(model, family, plain=False)
        return family
    except UnsupportedModelError:
        pass
    for variant in BUILTIN_FAMILIES:
        if variant.layer_class == family.layer_class and variant != family:
            try:
                all_layer_parts(model, variant, plain=False)
            except UnsupportedModelError:
                continue
            return variant
    return family


def family_by_layout(model: nn.Module, path: str, layers: nn.ModuleList) -> TransformerFamily | None:
    """A family describing ``layers`` (a model's list of encoder layers at ``path``) by its module paths and shapes,
    whatever the classes are called: CamemBERT's ``CamembertLayer`` has RoBERTa's layout, HuBERT's
    ``HubertEncoderLayer`` Wav2Vec2's. A family registered for the layers' class is tried first, then every
    registered and built-in one; the match is renamed to the layers' class. None: no family fits (the caller
    refuses). What matches is still verified on the model before anything changes (:func:`subnetact.hf.verify`).
    """
    layer_class = type(layers[0]).__name__
    if any(type(layer).__name__ != layer_class for layer in layers):
        return None
    candidates = [_BY_LAYER_CLASS.get(layer_class), *_BY_LAYER_CLASS.values(), *BUILTIN_FAMILIES]
    seen: set[TransformerFamily] = set()
    for family in candidates:
        if family is None or family in seen:
            continue
        seen.add(family)
        renamed = replace(family, layer_class=layer_class)
        try:
            for name, layer in layers.named_children():
                layer_parts(f"{path}.{name}", layer, renamed)
        except UnsupportedModelError:
            continue
        return renamed
    return None


def layout_mismatches(path: str, layers: nn.ModuleList) -> list[tuple[str, str]]:
    """``(family name, why its layout does not fit)`` for each distinct built-in layout, on the first layer: what a
    refusal of an unknown encoder names."""
    found, seen_layouts = [], set()
    for family in BUILTIN_FAMILIES:
        layout = (family.attention, family.query, family.out, family.fc1, family.fc2)
        if layout in seen_layouts:
            continue
        seen_layouts.add(layout)
        try:
            layer_parts(f"{path}.0", layers[0], replace(family, layer_class=type(layers[0]).__name__))
        except UnsupportedModelError as exc:
            found.append((family.name, str(exc)))
    return found
