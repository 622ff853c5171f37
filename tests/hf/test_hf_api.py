"""Conversion API of Hugging Face supernets: space, width link, validation errors, state_dict, save/load, unconvert."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from hf_models import LAYERS, bert, inputs, make, transformers, vit

import subnetact
from subnetact.hf import active_heads, active_neurons


@pytest.fixture(scope="module")
def model():
    return subnetact.convert(make("bert"))


def test_space_and_width_link(model):
    space = model.space
    assert space.dims == ("depth", "heads", "ffn")
    assert space.entries("depth")[0].name == "bert.encoder.layer"
    assert space.entries("depth")[0].choices == tuple(range(1, LAYERS + 1))
    assert [e.name for e in space.entries("heads")] == [f"bert.encoder.layer.{i}.attention.self" for i in range(4)]
    assert space.links == {"width": ("heads", "ffn")}
    cfg = space.make(depth=2, width=[0.25, 0.5, 0.75, 1.0])
    assert cfg["heads"] == cfg["ffn"] == (0.25, 0.5, 0.75, 1.0)
    assert model.actuate(depth=2, width=0.5) == space.make(depth=2, heads=0.5, ffn=0.5)
    assert model.actuate(ffn=0.25).to_dict() == {"depth": [2], "ffn": [0.25] * 4, "heads": [0.5] * 4}
    model.actuate(space.max())


def test_rounding_keeps_whole_heads_and_ceil():
    assert [active_heads(w, 12) for w in (0.25, 0.5, 0.75, 1.0)] == [3, 6, 9, 12]
    assert [active_heads(w, 6) for w in (0.25, 0.5, 0.75)] == [2, 3, 5]  # ceil(w * H), not round
    assert active_heads(0.01, 4) == 1 and active_neurons(0.01, 10) == 1
    assert active_neurons(0.3, 10) == 3
    torch.manual_seed(0)
    m = subnetact.convert(bert(num_attention_heads=6))  # head size 8
    sizes = {g.dim: dict(g.sizes) for g in m._subnetact.groups if g.index == 0}
    assert sizes["heads"] == {0.25: 16, 0.5: 24, 0.75: 40, 1.0: 48}
    assert sizes["ffn"] == {0.25: 16, 0.5: 32, 0.75: 48, 1.0: 64}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (
            {"depth": 5},
            r"depth\[0\]=5 is not allowed for module 'bert.encoder.layer': "
            r"allowed values are \(1, 2, 3, 4\)",
        ),
        ({"depth": 0}, r"depth\[0\]=0 is not allowed"),
        ({"width": 0.3}, r"heads\[0\]=0.3 is not allowed .* allowed values are \(0.25, 0.5, 0.75, 1.0\)"),
        ({"width": [0.5] * 3}, r"heads has 3 values but the space has 4 heads entries"),
        ({"width": 0.5, "heads": 0.5}, r"width=0.5 sets \('heads', 'ffn'\), so it cannot be combined with heads="),
        ({"ffn": "half"}, r"ffn='half' must be a number or a list of 4 numbers"),
        ({"heads": [0.5, 0.5, 0.5, True]}, r"heads\[3\]=True has type bool"),
        ({"layers": 2}, r"the space has no dimension 'layers'"),
    ],
)
def test_invalid_subnets_raise_and_keep_the_active_subnet(model, kwargs, match):
    before = model.actuate(depth=3, width=0.75)
    with pytest.raises(subnetact.InvalidSubnetError, match=match):
        model.actuate(**kwargs)
    assert model.active == before
    model.actuate(model.space.max())


def test_decoder_and_unknown_models_are_refused_without_changes():
    torch.manual_seed(0)
    decoder = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            is_decoder=True,
            add_cross_attention=True,
        )
    )
    state = {k: v.clone() for k, v in decoder.state_dict().items()}
    with pytest.raises(subnetact.UnsupportedModelError, match=r"decoder .*is_decoder=True.*encoders only"):
        subnetact.convert(decoder)
    assert type(decoder) is transformers.BertModel
    assert all(torch.equal(v, decoder.state_dict()[k]) for k, v in state.items())
    with pytest.raises(subnetact.UnsupportedModelError, match="filter_fn rejected 'vit.layers'"):
        subnetact.convert(vit(), filter_fn=lambda module, path: False)


def test_state_dict_keys_and_tensors_unchanged():
    original = make("roberta")
    keys = {k: v.data_ptr() for k, v in original.state_dict().items()}
    model = subnetact.convert(original)
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == keys
    assert isinstance(model, transformers.RobertaForSequenceClassification)
    assert isinstance(model.roberta.encoder.layer, subnetact.LayerSelectList)
    assert "rule='every_other'" in repr(model.roberta.encoder.layer)
    assert repr(model).count("RobertaLayer(") == LAYERS  # every layer, whatever the active subnet


def test_save_load_roundtrip(tmp_path, model):
    cfg = model.space.make(depth=2, heads=[0.25, 0.5, 0.75, 1.0], ffn=0.5)
    model.actuate(cfg)
    subnetact.save(model, tmp_path / "bert.safetensors")
    model.actuate(model.space.max())
    torch.manual_seed(123)  # different random weights, then overwritten by load
    loaded = subnetact.load(tmp_path / "bert.safetensors", lambda: bert())
    assert loaded.active == cfg
    x = inputs("bert")
    with torch.no_grad():
        torch.testing.assert_close(loaded(**x).logits, model(**x, subnet=cfg).logits, atol=0, rtol=0)
    assert loaded.space.links == {"width": ("heads", "ffn")}


def test_unconvert_restores_plain_model():
    original = make("vit")
    reference = copy.deepcopy(original)
    model = subnetact.convert(original)
    model.actuate(depth=2, width=0.25)
    plain = subnetact.unconvert(model)
    assert type(plain) is transformers.ViTForImageClassification
    assert type(plain.vit.layers) is torch.nn.ModuleList and len(plain.vit.layers) == LAYERS
    x = inputs("vit")
    with torch.no_grad():
        torch.testing.assert_close(plain(**x).logits, reference(**x).logits, atol=0, rtol=0)


def test_attention_implementation_can_change_after_conversion():
    model = subnetact.convert(make("bert", "eager"))
    x = inputs("bert")
    cfg = model.space.make(depth=3, width=0.5)
    with torch.no_grad():
        eager = model(**x, subnet=cfg).logits
        model.set_attn_implementation("sdpa")
        assert model.config._attn_implementation == "sdpa"
        torch.testing.assert_close(model(**x, subnet=cfg).logits, eager, atol=1e-5, rtol=0)


def test_gradients_reach_the_shared_weights():
    model = subnetact.convert(make("bert")).train()
    x = inputs("bert")
    out = model(**x, labels=torch.tensor([0, 1]), subnet=model.space.make(depth=2, width=0.5))
    out.loss.backward()
    q = model.bert.encoder.layer[0].attention.self.query.weight.grad
    assert q is not None and q[:24].abs().sum() > 0 and q[24:].abs().sum() == 0  # 2 of 4 heads of 12
    assert model.bert.encoder.layer[1].attention.self.query.weight.grad is None  # layer 1 skipped at depth 2


def test_import_does_not_import_transformers():
    code = "import sys, subnetact; assert 'transformers' not in sys.modules; print(subnetact.reorder.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_keyword_actuation_is_memoised_without_changing_validation(model):
    start = model.actuate(model.space.max())
    first = model.actuate(depth=2, width=0.5)
    model.actuate(start)
    assert model.actuate(depth=2, width=0.5) is first  # the memoised config
    model.actuate(start)
    with pytest.raises(subnetact.InvalidSubnetError, match=r"depth=True must be a number or a list of 1 numbers"):
        model.actuate(depth=True)  # True == 1, but it must not hit the entry of depth=1
    model.actuate(depth=1)
    model.actuate(start)
    with pytest.raises(subnetact.InvalidSubnetError, match=r"depth=True must be a number or a list of 1 numbers"):
        model.actuate(depth=True)
    assert model.active == start
    assert model.actuate(depth=[2], heads=[0.5] * 4, ffn=0.5) == first  # lists are keys too


def test_register_family_for_another_head_class():
    subnetact.hf.register_family(
        subnetact.hf.BERT, ["transformers.models.bert.modeling_bert.BertForTokenClassification"]
    )
    torch.manual_seed(0)
    original = transformers.BertForTokenClassification(bert().config).eval()
    model = subnetact.convert(copy.deepcopy(original))
    x = inputs("bert", mask="ones")
    cfg = model.space.make(depth=2, width=0.75)
    with torch.no_grad():
        torch.testing.assert_close(model(**x).logits, original(**x).logits, atol=1e-6, rtol=0)
        torch.testing.assert_close(model(**x, subnet=cfg).logits, model.export(cfg)(**x).logits, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="must be a list of 'module.QualName' strings"):
        subnetact.hf.register_family(subnetact.hf.BERT, "transformers.models.bert.modeling_bert.BertModel")


def test_transformers_4_is_refused_with_an_actionable_error(monkeypatch):
    model = make("bert")
    # transformers swaps its lazy module in sys.modules on first use, so patch the one there now
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.57.1")
    expected = r"transformers 4.57.1 is installed; .*transformers>=5\.9"
    with pytest.raises(subnetact.UnsupportedModelError, match=expected):
        subnetact.convert(model)
    assert not isinstance(model, subnetact.SupernetMixin)


def test_depth_rule_spread_runs_the_first_and_last_layers():
    """``ConvertConfig(depth_rule="spread")``: depth D runs the layers ``kept_layers(L, D, "spread")``, first and last
    included. Reference: the original model with its layer list cut to those layers by hand (no subnetact)."""
    original = make("bert")
    reference = copy.deepcopy(original)
    model = subnetact.convert(original, subnetact.ConvertConfig(depth_rule="spread"))
    assert "rule='spread'" in repr(model.bert.encoder.layer)
    x = inputs("bert")
    for depth, kept in ((1, [0]), (2, [0, 3]), (3, [0, 2, 3]), (4, [0, 1, 2, 3])):
        assert subnetact.kept_layers(LAYERS, depth, "spread") == kept
        cut = copy.deepcopy(reference)
        cut.bert.encoder.layer = torch.nn.ModuleList([cut.bert.encoder.layer[i] for i in kept])
        cut.config.num_hidden_layers = len(kept)
        with torch.no_grad():
            want = cut(**x).logits
            cfg = model.space.make(depth=depth, width=1.0)
            got = model(**x, subnet=cfg).logits
            exported = subnetact.export(model, cfg)(**x).logits
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(exported, want, atol=1e-6, rtol=1e-5)


def test_depth_rule_survives_save_load(tmp_path):
    model = subnetact.convert(make("bert"), subnetact.ConvertConfig(depth_rule="spread"))
    cfg = model.space.make(depth=2, width=0.5)
    subnetact.save(model, tmp_path / "spread.safetensors")
    loaded = subnetact.load(tmp_path / "spread.safetensors", lambda: bert())
    assert "rule='spread'" in repr(loaded.bert.encoder.layer)
    x = inputs("bert")
    with torch.no_grad():
        torch.testing.assert_close(loaded(**x, subnet=cfg).logits, model(**x, subnet=cfg).logits, atol=0, rtol=0)


def test_depth_rule_rejects_unknown_rules():
    with pytest.raises(subnetact.ConfigError, match=r"depth_rule='last' must be None, one of \('prefix'"):
        subnetact.ConvertConfig(depth_rule="last")
