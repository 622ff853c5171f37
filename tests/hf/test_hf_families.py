"""Families beyond BERT/RoBERTa/ViT (issue 11): ELECTRA, XLM-R, DistilBERT, DeiT and DeBERTa-v2 (whose attention
reshapes by its head count, which the converted attention sets per subnet) are built in with exact parity; ALBERT
(one layer shared by every position), and a DeBERTa-v2 family that forgets the per-subnet head count or the
relative-position projections, are refused by the verification that runs on the real model, before anything
changes; an unregistered Hugging Face class is told to use ``subnetact.hf.register_family``.

The reference for a subnet is the *original* model's own forward with the output projection's input columns of
the dropped heads and ``fc2``'s input columns of the dropped neurons zeroed (which is what dropping whole heads and
neurons means: attention is computed per head), and with its layer list cut to the kept layers. It uses neither
subnetact's operators nor its export.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re

import pytest
import torch
from hf_models import transformers
from torch import nn

import subnetact
from subnetact.hf import TransformerFamily, register_family

HIDDEN, HEADS, LAYERS, FFN = 48, 4, 4, 64
TEXT = dict(
    vocab_size=64,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
    max_position_embeddings=40,
    pad_token_id=1,
)
IMAGE = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
    image_size=16,
    patch_size=4,
    num_labels=3,
)
# family -> (layer list, output projection, fc2, config attribute of the FFN width); written out here, not taken
# from subnetact's families.
PATHS = {
    "electra": ("electra.encoder.layer", "attention.output.dense", "output.dense", "intermediate_size"),
    "xlm-roberta": ("roberta.encoder.layer", "attention.output.dense", "output.dense", "intermediate_size"),
    "distilbert": ("distilbert.transformer.layer", "attention.out_lin", "ffn.lin2", "hidden_dim"),
    "deit": ("deit.layers", "attention.o_proj", "mlp.fc2", "intermediate_size"),
    "deberta-v2": ("deberta.encoder.layer", "attention.output.dense", "output.dense", "intermediate_size"),
}
DEBERTA_VARIANTS = {  # relative attention with c2p/p2c projections (the default here), shared key, absolute
    "relative": dict(relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8),
    "shared-key": dict(
        relative_attention=True,
        share_att_key=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=8,
        norm_rel_ebd="layer_norm",
    ),
    "absolute": dict(relative_attention=False),
}


def build(name: str, attn: str = "sdpa", head: str = "cls", variant: str = "relative") -> nn.Module:
    t = transformers
    torch.manual_seed(0)
    if name == "deberta-v2":  # one attention implementation (its own); attn is ignored
        cls = t.DebertaV2ForSequenceClassification if head == "cls" else t.DebertaV2Model
        model = cls(t.DebertaV2Config(**TEXT, **DEBERTA_VARIANTS[variant]))
    elif name == "electra":
        cls = t.ElectraForSequenceClassification if head == "cls" else t.ElectraModel
        model = cls(t.ElectraConfig(embedding_size=HIDDEN, attn_implementation=attn, **TEXT))
    elif name == "xlm-roberta":
        cls = t.XLMRobertaForSequenceClassification if head == "cls" else t.XLMRobertaModel
        model = cls(t.XLMRobertaConfig(attn_implementation=attn, **TEXT))
    elif name == "distilbert":
        cls = t.DistilBertForSequenceClassification if head == "cls" else t.DistilBertModel
        cfg = t.DistilBertConfig(
            vocab_size=64, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN, max_position_embeddings=40
        )
        cfg._attn_implementation = attn
        model = cls(cfg)
    else:
        cls = {
            "cls": t.DeiTForImageClassification,
            "teacher": t.DeiTForImageClassificationWithTeacher,
            "base": t.DeiTModel,
        }[head]
        model = cls(t.DeiTConfig(attn_implementation=attn, **IMAGE))
    return model.eval()


def inputs(name: str) -> dict:
    g = torch.Generator().manual_seed(1)
    if name == "deit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=g)}
    return {"input_ids": torch.randint(2, 64, (2, 10), generator=g)}


def main(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def n_active(w: float, n: int) -> int:
    return max(1, math.ceil(w * n - 1e-9))


def reference(name: str, original: nn.Module, depth: int, heads: list[float], ffn: list[float]) -> nn.Module:
    layers_path, out_path, fc2_path, _ = PATHS[name]
    layers_path = layers_path if hasattr(original, layers_path.split(".")[0]) else layers_path.split(".", 1)[1]
    ref = copy.deepcopy(original)
    layers = ref.get_submodule(layers_path)
    head_size = HIDDEN // HEADS
    with torch.no_grad():
        for layer, h, f in zip(layers, heads, ffn):
            layer.get_submodule(out_path).weight[:, n_active(h, HEADS) * head_size :] = 0
            layer.get_submodule(fc2_path).weight[:, n_active(f, FFN) :] = 0
    parent, _, leaf = layers_path.rpartition(".")
    kept = [i * LAYERS // depth for i in range(depth)]
    setattr(ref.get_submodule(parent), leaf, nn.ModuleList([layers[i] for i in kept]))
    return ref


@pytest.mark.parametrize("name", list(PATHS))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_builtin_family_parity(name, attn):
    original = build(name, attn)
    model = subnetact.convert(copy.deepcopy(original))
    x = inputs(name)
    subnets = [
        (LAYERS, [1.0] * 4, [1.0] * 4),
        (1, [0.25] * 4, [0.25] * 4),
        (2, [0.5] * 4, [0.5] * 4),
        (3, [0.25, 1.0, 0.5, 0.75], [1.0, 0.25, 0.75, 0.5]),
    ]
    with torch.no_grad():
        torch.testing.assert_close(main(model(**x)), main(original(**x)), atol=1e-6, rtol=0)
        for depth, heads, ffn in subnets:
            cfg = model.space.make(depth=depth, heads=heads, ffn=ffn)
            got = main(model(**x, subnet=cfg))
            want = main(reference(name, original, depth, heads, ffn)(**x))
            exported = model.export(cfg).eval()
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(main(exported(**x)), got, atol=1e-6, rtol=0)
    assert type(exported) is type(original)
    assert not any(isinstance(m, subnetact.operator.Operator) for m in exported.modules())


@pytest.mark.parametrize("name", list(PATHS))
def test_exported_config_describes_the_subnet(name):
    model = subnetact.convert(build(name))
    exported = model.export(model.space.make(depth=2, width=0.5))
    cfg = exported.config
    ffn_attr = PATHS[name][3]
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, getattr(cfg, ffn_attr)) == (2, 2, 32)
    assert cfg.subnetact_subnet["supernet_layers"] == [0, 2]
    if name == "deit":  # DeiT reads head_dim from its config, so the config alone rebuilds the subnet
        rebuilt = type(exported)(cfg).eval()
        rebuilt.load_state_dict(exported.state_dict(), strict=True)
        x = inputs(name)
        with torch.no_grad():
            torch.testing.assert_close(rebuilt(**x).logits, exported.eval()(**x).logits, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("name", "head", "variant"),
    [
        ("deit", "teacher", None),
        ("deit", "base", None),
        ("distilbert", "base", None),
        ("deberta-v2", "base", "relative"),  # last_hidden_state: scale ~1, not a classifier's ~0.01
        ("deberta-v2", "base", "shared-key"),
        ("deberta-v2", "base", "absolute"),
    ],
)
def test_other_builtin_classes(name, head, variant):
    original = build(name, head=head, variant=variant)
    model = subnetact.convert(copy.deepcopy(original))
    x = inputs(name)
    cfg = model.space.make(depth=3, width=0.5)
    with torch.no_grad():
        torch.testing.assert_close(main(model(**x)), main(original(**x)), atol=1e-6, rtol=0)
        want = main(reference(name, original, 3, [0.5] * 4, [0.5] * 4)(**x))
        torch.testing.assert_close(main(model(**x, subnet=cfg)), want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(main(model.export(cfg).eval()(**x)), want, atol=1e-5, rtol=1e-4)


def test_verification_leaves_a_training_model_training():
    model = build("electra").train()
    subnetact.convert(model)
    assert model.training and all(m.training for m in model.modules())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


# -- refused families --------------------------------------------------------------------------------------------
ALBERT = TransformerFamily(
    name="albert",
    layer_class="AlbertLayer",
    attention="attention",
    query="attention.query",
    key="attention.key",
    value="attention.value",
    out="attention.dense",
    fc1="ffn",
    fc2="ffn_output",
)
DEBERTA_V2 = subnetact.hf.DEBERTA_V2


def _albert(**kw):
    cfg = transformers.AlbertConfig(embedding_size=16, **{**TEXT, **kw})
    return transformers.AlbertForSequenceClassification(cfg).eval()


def _deberta(**kw):
    # A class the built-in DeBERTa-v2 family is not registered for: the test registers the wrong family on it.
    return transformers.DebertaV2ForTokenClassification(transformers.DebertaV2Config(**TEXT, **kw)).eval()


REFUSED = {
    "albert-shared-layer": (
        ALBERT,
        lambda: _albert(),
        r"albert_layers\.0 \(AlbertLayer\) runs 4 times in one forward; .*one layer shared by several positions",
    ),
    "albert-one-group-of-4": (
        ALBERT,
        lambda: _albert(num_hidden_layers=1, inner_group_num=4),
        r"config\.num_hidden_layers=1 but 'albert\.encoder\.albert_layer_groups\.0\.albert_layers' holds 4 layers",
    ),
    "deberta-v2-fixed-head-count": (
        dataclasses.replace(DEBERTA_V2, name="deberta-v2-fixed", head_count_per_subnet=False),
        lambda: _deberta(relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8),
        r"runs fewer heads wrongly at deberta\.encoder\.layer\.0\.attention\.self \(DisentangledSelfAttention\): "
        r"with 1 of 4 heads per layer an output differs from the masked full model",
    ),
    "deberta-v2-absolute-fixed-head-count": (
        dataclasses.replace(DEBERTA_V2, name="deberta-v2-fixed", head_count_per_subnet=False),
        lambda: _deberta(relative_attention=False),
        r"fewer heads wrongly .*differs from the masked full model .*needs head_count_per_subnet=True",
    ),
    "deberta-v2-without-position-projections": (
        dataclasses.replace(DEBERTA_V2, name="deberta-v2-nopos", extra_head_projections=()),
        lambda: _deberta(relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8),
        r"deberta-v2-nopos family runs fewer heads wrongly at deberta\.encoder\.layer\.0\.attention\.self .*"
        r"the forward fails .*must be named by the family",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_family_that_does_not_describe_the_model_is_refused_unchanged(case):
    family, make, match = REFUSED[case]
    torch.manual_seed(0)
    model = make()
    register_family(family, [f"{type(model).__module__}.{type(model).__qualname__}"])
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(subnetact.UnsupportedModelError, match=match) as info:
        subnetact.convert(model)
    assert isinstance(info.value, subnetact.SubnetActError)
    assert type(model) is make().__class__ and not isinstance(model, subnetact.SupernetMixin)
    assert all(m.training for m in model.modules())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


# -- unregistered classes ----------------------------------------------------------------------------------------
def _tiny_config(config_class, **extra):
    return config_class(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, **extra)


_AUDIO = dict(
    conv_dim=(8, 8),
    conv_stride=(4, 4),
    conv_kernel=(8, 8),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)
#: Encoders no family was registered for by name before issue 21: each converts with plain ``convert`` (built in, or
#: found by the layout of its layers) with exact parity.
BY_LAYOUT = {
    "CamembertModel": lambda: transformers.CamembertModel(_tiny_config(transformers.CamembertConfig, vocab_size=99)),
    "XLMRobertaForMaskedLM": lambda: transformers.XLMRobertaForMaskedLM(
        _tiny_config(transformers.XLMRobertaConfig, vocab_size=99)
    ),
    "BertForMaskedLM": lambda: transformers.BertForMaskedLM(_tiny_config(transformers.BertConfig, vocab_size=99)),
    "BertForTokenClassification": lambda: transformers.BertForTokenClassification(
        _tiny_config(transformers.BertConfig, vocab_size=99)
    ),
    "CLIPTextModel": lambda: transformers.CLIPTextModel(
        _tiny_config(transformers.CLIPTextConfig, vocab_size=99, bos_token_id=0, eos_token_id=2)
    ),
    "CLIPVisionModel": lambda: transformers.CLIPVisionModel(
        _tiny_config(transformers.CLIPVisionConfig, image_size=32, patch_size=8)
    ),
    "Wav2Vec2Model": lambda: transformers.Wav2Vec2Model(_tiny_config(transformers.Wav2Vec2Config, **_AUDIO)),
    "HubertModel": lambda: transformers.HubertModel(_tiny_config(transformers.HubertConfig, **_AUDIO)),
    "MobileBertModel": lambda: transformers.MobileBertModel(
        _tiny_config(
            transformers.MobileBertConfig,
            vocab_size=99,
            embedding_size=16,
            intra_bottleneck_size=16,
            true_hidden_size=16,
        )
    ),
    "BeitModel": lambda: transformers.BeitModel(_tiny_config(transformers.BeitConfig, image_size=32, patch_size=8)),
    "WhisperEncoder": lambda: _whisper(transformers.models.whisper.modeling_whisper.WhisperEncoder),
    "WhisperForAudioClassification": lambda: _whisper(transformers.WhisperForAudioClassification),
}


def _whisper(cls):
    """A tiny Whisper encoder: 8 mel bins, 8 positions (16 input frames), 4 heads of 8, FFN 37."""
    return cls(
        transformers.WhisperConfig(
            d_model=32,
            encoder_layers=2,
            encoder_attention_heads=4,
            encoder_ffn_dim=37,
            num_mel_bins=8,
            max_source_positions=8,
            decoder_layers=1,
            decoder_attention_heads=4,
            decoder_ffn_dim=16,
        )
    )


@pytest.mark.parametrize("name", list(BY_LAYOUT))
def test_encoders_convert_with_plain_convert_and_exact_parity(name):
    from subnetact.hf.verify import default_example_inputs

    torch.manual_seed(0)
    model = BY_LAYOUT[name]().eval()
    reference = copy.deepcopy(model)
    subnetact.convert(model)
    assert set(model.space.dims) == {"depth", "heads", "ffn"}
    x = default_example_inputs(model)
    with torch.no_grad():
        full = model(**x, subnet=model.space.max())
        torch.testing.assert_close(full, reference(**x), rtol=0, atol=0)
        for cfg in (model.space.min(), model.space.sample(1)):
            dense = subnetact.export(model, cfg).eval()
            assert isinstance(dense, type(reference))
            torch.testing.assert_close(model(**x, subnet=cfg), dense(**x), rtol=0, atol=0)
            assert not torch.equal(dense(**x)[0], full[0])  # really a smaller model


#: Encoders whose heads a per-head relative position bias fixes: built in with depth and FFN width only.
#: name -> (model, FFN second projection in a layer, layer list, path of the bias named in the warning).
FIXED_HEADS = {
    "MPNetModel": (
        lambda: transformers.MPNetModel(_tiny_config(transformers.MPNetConfig, vocab_size=99)),
        "output.dense",
        "encoder.layer",
        "encoder.relative_attention_bias",
    ),
    "MPNetForSequenceClassification": (
        lambda: transformers.MPNetForSequenceClassification(_tiny_config(transformers.MPNetConfig, vocab_size=99)),
        "output.dense",
        "mpnet.encoder.layer",
        "mpnet.encoder.relative_attention_bias",
    ),
    "T5EncoderModel": (
        lambda: transformers.T5EncoderModel(
            transformers.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=3, num_heads=4)
        ),
        "layer.1.DenseReluDense.wo",
        "encoder.block",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias",
    ),
    # T5 v1.1 / Flan-T5's gated FFN (wi_0, wi_1 -> wo): the same class as above, the T5_GATED variant's layout.
    "T5EncoderModel-gated": (
        lambda: transformers.T5EncoderModel(
            transformers.T5Config(
                vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=3, num_heads=4, feed_forward_proj="gated-gelu"
            )
        ),
        "layer.1.DenseReluDense.wo",
        "encoder.block",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias",
    ),
}


def _masked_reference(original: nn.Module, layers_path: str, fc2: str, depth: int, ffn: list[float]) -> nn.Module:
    """The original model with the dropped FFN neurons' fc2 columns zeroed and the skipped layers removed."""
    ref = copy.deepcopy(original)
    layers = ref.get_submodule(layers_path)
    with torch.no_grad():
        for layer, w in zip(layers, ffn):
            proj = layer.get_submodule(fc2)
            proj.weight[:, n_active(w, proj.in_features) :] = 0
    parent, _, leaf = layers_path.rpartition(".")
    kept = [i * len(layers) // depth for i in range(depth)]
    setattr(ref.get_submodule(parent), leaf, nn.ModuleList([layers[i] for i in kept]))
    return ref


@pytest.mark.parametrize("name", list(FIXED_HEADS))
def test_per_head_relative_bias_gives_depth_and_ffn_only_with_exact_parity(name):
    from subnetact.hf.verify import default_example_inputs

    make, fc2, layers_path, bias = FIXED_HEADS[name]
    torch.manual_seed(0)
    model = make().eval()
    original = copy.deepcopy(model)
    with pytest.warns(UserWarning, match=rf"heads are not elastic: {re.escape(bias)} \(Embedding\(32, 4\)\)"):
        subnetact.convert(model)
    assert set(model.space.dims) == {"depth", "ffn"} and model.space.links == {"width": ("ffn",)}
    x = default_example_inputs(model)
    layers = len(original.get_submodule(layers_path))
    subnets = [(layers, [1.0] * layers), (1, [0.25] * layers), (2, [0.5, 1.0, 0.25][:layers])]
    with torch.no_grad():
        torch.testing.assert_close(model(**x)[0], original(**x)[0], rtol=0, atol=0)
        for depth, ffn in subnets:
            cfg = model.space.make(depth=depth, ffn=ffn)
            got = model(**x, subnet=cfg)[0]
            dense = model.export(cfg).eval()
            assert type(dense) is type(original)
            torch.testing.assert_close(dense(**x)[0], got, rtol=0, atol=0)
            want = _masked_reference(original, layers_path, fc2, depth, ffn)(**x)[0]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    model.actuate(width=0.5)  # the link sets the FFN only
    assert list(model.active["ffn"]) == [0.5] * layers
    with pytest.raises(subnetact.InvalidSubnetError, match=r"no dimension 'heads'"):
        model.actuate(heads=0.5)


@pytest.mark.parametrize("name", ["MPNetModel", "T5EncoderModel-gated"])
def test_reorder_leaves_heads_with_a_per_head_bias_in_place(name):
    torch.manual_seed(0)
    original = FIXED_HEADS[name][0]().eval()
    with pytest.warns(UserWarning, match="heads are not elastic"):
        model = subnetact.convert(copy.deepcopy(original))
    result = subnetact.reorder(model, None, score="l1")
    assert all(torch.equal(order, torch.arange(4)) for order in result.head_order)
    assert any(not torch.equal(order, torch.arange(37)) for order in result.ffn_order)  # neurons did move
    x = {"input_ids": torch.randint(2, 99, (2, 8))}
    # The same function: heads (and their bias columns) untouched, neurons moved whole (with the gate's rows).
    with torch.no_grad():
        torch.testing.assert_close(model(**x)[0], original(**x)[0], rtol=1e-5, atol=1e-5)


#: Encoders refused naming what blocks them: shared layers, hierarchical stages, several towers, or a family check
#: that fails.
REFUSED_ENCODERS = {
    "AlbertModel": (
        lambda: transformers.AlbertModel(_tiny_config(transformers.AlbertConfig, vocab_size=99, embedding_size=16)),
        r"AlbertModel shares layers across depth \(cross-layer parameter sharing\): "
        r"encoder\.albert_layer_groups\.0\.albert_layers\.0 \(AlbertLayer\) runs 2 times in one forward",
    ),
    "SwinModel": (
        lambda: transformers.SwinModel(
            transformers.SwinConfig(
                image_size=32, patch_size=4, embed_dim=16, depths=[1, 2], num_heads=[2, 4], window_size=4
            )
        ),
        r"SwinModel is hierarchical: 'encoder\.layers' holds 2 stages, .*\(16 -> 32: patch merging\).* relative "
        r"position bias table \(attention\.relative_position_bias\.relative_position_bias_table \(49, 2\); one "
        r"column per head\)",
    ),
    "WhisperModel": (
        lambda: _whisper(transformers.WhisperModel),
        r"WhisperModel holds 2 separate lists of attention layers \('encoder\.layers' \(WhisperEncoderLayer\), "
        r"'decoder\.layers' \(WhisperDecoderLayer\)\).* Convert the encoder on its own",
    ),
    "BigBirdModel": (
        lambda: transformers.BigBirdModel(
            _tiny_config(
                transformers.BigBirdConfig,
                vocab_size=99,
                attention_type="block_sparse",
                block_size=2,
                num_random_blocks=1,
            )
        ),
        r"bert family runs fewer heads wrongly at encoder.layer.0.attention.self \(BigBirdSelfAttention\)",
    ),
    "BeitModel-relative-bias": (
        lambda: transformers.BeitModel(
            _tiny_config(transformers.BeitConfig, image_size=32, patch_size=8, use_relative_position_bias=True)
        ),
        r"vit family runs fewer heads wrongly at .*\(BeitAttention\)",
    ),
}


@pytest.mark.parametrize("name", list(REFUSED_ENCODERS))
def test_encoders_no_family_describes_are_refused_naming_what_blocks_them(name):
    make, match = REFUSED_ENCODERS[name]
    torch.manual_seed(0)
    model = make().eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(subnetact.UnsupportedModelError, match=match):
        subnetact.convert(model)
    assert not isinstance(model, subnetact.SupernetMixin)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_unregistered_family_is_told_to_describe_it():
    torch.manual_seed(0)
    model = transformers.XLNetModel(
        transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37)
    )
    with pytest.raises(subnetact.UnsupportedModelError, match=r"Describe its encoder layer with a subnetact\.hf") as e:
        subnetact.convert(model)
    assert "'layer' (XLNetLayer) have the layout of no built-in family: bert: " in str(e.value)
    assert "subnetact.hf.register_family(family, ['transformers.models.xlnet.modeling_xlnet.XLNetModel'])" in str(
        e.value
    )


def test_unregistered_non_transformer_goes_through_the_default_analysis():
    torch.manual_seed(0)
    model = transformers.ResNetForImageClassification(
        transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)
    ).eval()
    reference = copy.deepcopy(model)
    subnetact.convert(model)  # the traced analysis (issue 11): a convolutional HF model needs no family
    assert any(isinstance(m, subnetact.WeightSlice) for m in model.modules())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, reference(x).logits, rtol=0, atol=0)


def test_register_family_example_inputs_feed_the_verification():
    seen = []

    def example(model):
        seen.append(type(model).__name__)
        return {"input_ids": torch.randint(2, 64, (1, 2, 5))}  # (batch, choices, tokens)

    qualname = "transformers.models.bert.modeling_bert.BertForMultipleChoice"
    with pytest.raises(subnetact.errors.ConfigError, match=r"example_inputs=3 must be a callable model -> dict"):
        register_family(subnetact.hf.BERT, [qualname], example_inputs=3)
    torch.manual_seed(0)
    model = transformers.BertForMultipleChoice(transformers.BertConfig(**TEXT)).eval()
    assert subnetact.hf.families.family_of(model) is None  # the failed registration registered nothing
    register_family(subnetact.hf.BERT, [qualname], example_inputs=example)
    subnetact.convert(model)
    assert seen == ["BertForMultipleChoice"]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: register_family("bert", ["a.B"]), r"family='bert' must be a subnetact\.hf\.TransformerFamily"),
        (lambda: register_family(subnetact.hf.BERT, "a.B"), r"classes='a\.B' must be a list of 'module\.QualName'"),
        (lambda: subnetact.hf.reorder(subnetact.convert(build("electra")), None, score="x"), r"score='x' is not one"),
    ],
)
def test_argument_errors_are_package_errors(call, match):
    with pytest.raises(subnetact.errors.ConfigError, match=match) as info:
        call()
    assert isinstance(info.value, subnetact.SubnetActError) and isinstance(info.value, ValueError)


def test_family_with_a_wrong_path_is_refused():
    wrong = dataclasses.replace(subnetact.hf.BERT, name="bert-typo", attention="attention.selff")
    register_family(wrong, ["transformers.models.bert.modeling_bert.BertForPreTraining"])
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**TEXT))
    with pytest.raises(subnetact.UnsupportedModelError, match=r"has no submodule 'attention\.selff' \(bert-typo"):
        subnetact.convert(model)
    assert not isinstance(model, subnetact.SupernetMixin)


@pytest.mark.parametrize("variant", ["relative", "shared-key"])
def test_deberta_reorder_moves_the_position_projections_with_their_heads(variant):
    original = build("deberta-v2", head="base", variant=variant)
    model = subnetact.convert(copy.deepcopy(original))
    x = inputs("deberta-v2")
    result = subnetact.reorder(model, None, score="l1")
    assert any(not torch.equal(o, torch.arange(HEADS)) for o in result.head_order)  # heads did move
    cfg = model.space.make(depth=3, width=0.5)
    with torch.no_grad():
        # Every head's q/k/v rows, position-projection rows and output columns moved together: same function.
        torch.testing.assert_close(main(model(**x)), main(original(**x)), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            main(model(**x, subnet=cfg)), main(model.export(cfg).eval()(**x)), atol=1e-6, rtol=0
        )


@pytest.mark.parametrize("name", ["electra", "deberta-v2"])
def test_low_precision_models_pass_the_verification(name):
    original = build(name).to(torch.bfloat16)
    model = subnetact.convert(copy.deepcopy(original))  # the verification compares at bf16's tolerance
    x = inputs(name)
    with torch.no_grad():
        torch.testing.assert_close(main(model(**x)), main(original(**x)), atol=0, rtol=0)
