"""Elastic attention heads of packed projections (``nn.MultiheadAttention``, timm's fused ``qkv``): a subnet with
fewer heads equals the original attention whose dropped heads are zeroed (an independent reference: the upstream
implementation), exports to plain modules with fewer heads, and the largest subnet is the original bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from test_convert import _assert_unchanged, _snapshot
from torch import nn
from zoo_models import HAS_TIMM, build, inputs

import subnetact
from subnetact.attention import PackedSliceLinear
from subnetact.mha import NarrowMultiheadAttention, SubnetMultiheadAttention


def _heads_only(model, choose):
    """The largest config with ``choose(entry_name)`` (or max) as the width of every attention entry."""
    cfg = model.space.max().to_dict()
    names = [e.name for e in model.space.entries("width")]
    cfg["width"] = [choose(n) if n.endswith(("attention", "attn")) else w for n, w in zip(names, cfg["width"])]
    return cfg


@torch.no_grad()
def _zero_heads(mha: nn.Module, keep: int, head_dim: int, qkv: tuple[torch.Tensor, ...], bias, out_w) -> None:
    """Zero the q/k/v rows and output columns of every head from ``keep`` on (such a head adds exactly 0)."""
    for w in qkv:
        w[keep * head_dim :] = 0
    for b in bias:
        if b is not None:
            b[keep * head_dim :] = 0
    out_w[:, keep * head_dim :] = 0


class AttentionNet(nn.Module):
    """A projection, one attention over it (self or cross) and a residual add."""

    def __init__(self, batch_first: bool, kdim: int | None = None, **call: object) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 16)
        self.memory = nn.Linear(16, kdim or 16)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=batch_first, kdim=kdim, vdim=kdim)
        self.call = call

    def forward(self, x, key_padding_mask=None, attn_mask=None):
        h = self.embed(x)
        m = self.memory(x)
        out, weights = self.attn(h, m, m, key_padding_mask=key_padding_mask, attn_mask=attn_mask, **self.call)
        if weights is not None and weights.dim() == 4:  # per head: their number changes with the subnet
            weights = weights[:, 0]
        return (out + x, weights) if weights is not None else out + x


def _outs(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


CASES = {
    "batch_first": dict(batch_first=True, need_weights=False),
    "seq_first_weights": dict(batch_first=False, need_weights=True),
    "per_head_weights": dict(batch_first=True, need_weights=True, average_attn_weights=False),
    "kdim_vdim": dict(batch_first=True, kdim=12, need_weights=False),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("masks", ["none", "bool", "float"])
def test_multihead_attention_with_fewer_heads_equals_the_original_with_those_heads_zeroed(case, masks):
    kwargs = dict(CASES[case])
    batch_first = kwargs.pop("batch_first")
    kdim = kwargs.pop("kdim", None)
    torch.manual_seed(0)
    model = AttentionNet(batch_first, kdim, **kwargs).eval()
    reference = copy.deepcopy(model)
    x = torch.randn(3, 5, 16) if batch_first else torch.randn(5, 3, 16)
    call = {}
    if masks != "none":
        padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
        call["key_padding_mask"] = padding
        call["attn_mask"] = torch.ones(5, 5, dtype=torch.bool).triu(1)  # causal (True: may not attend)
        if masks == "float":
            call["key_padding_mask"] = torch.zeros(padding.shape).masked_fill(padding, float("-inf"))
            call["attn_mask"] = torch.randn(5, 5)
    subnetact.convert(model, example_inputs=(x, call.get("key_padding_mask"), call.get("attn_mask")))
    assert isinstance(model.attn, SubnetMultiheadAttention)
    assert [e.name for e in model.space.entries("width")] == ["attn"]

    with torch.no_grad():
        # the largest subnet is the original, bit for bit
        torch.testing.assert_close(_outs(model(x, **call)), _outs(reference(x, **call)), rtol=0, atol=0)
        for width, keep in ((0.25, 1), (0.75, 3)):
            cfg = {"width": [width]}
            padded = copy.deepcopy(reference)
            mha = padded.attn
            qkv = (
                mha.in_proj_weight.view(3, 16, 16).unbind(0)
                if kdim is None
                else (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
            )
            _zero_heads(mha, keep, 4, qkv, mha.in_proj_bias.view(3, 16).unbind(0), mha.out_proj.weight)
            if case == "seq_first_weights":  # averaged over the kept heads only: compare per head, then average
                mha_call = dict(call)
                expected_out, per_head = padded.attn(
                    padded.embed(x), padded.memory(x), padded.memory(x), average_attn_weights=False, **mha_call
                )
                out, weights = model(x, subnet=cfg, **call)
                torch.testing.assert_close(out, expected_out + x, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(weights, per_head[:, :keep].mean(1), rtol=1e-5, atol=1e-6)
            elif case == "per_head_weights":
                out, weights = model(x, subnet=cfg, **call)
                expected_out, expected_weights = padded(x, **call)
                torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(weights, expected_weights, rtol=1e-5, atol=1e-6)
            else:
                torch.testing.assert_close(model(x, subnet=cfg, **call), padded(x, **call), rtol=1e-5, atol=1e-5)
            dense = subnetact.export(model, cfg).eval()
            assert type(dense.attn) is NarrowMultiheadAttention and dense.attn.num_heads == keep
            assert isinstance(dense.attn, nn.MultiheadAttention)
            assert dense.attn.out_proj.in_features == 4 * keep
            assert list(dense.state_dict()) == list(reference.state_dict())
            torch.testing.assert_close(
                _outs(model(x, subnet=cfg, **call)), _outs(dense(x, **call)), rtol=1e-5, atol=1e-6
            )
    full = subnetact.export(model, model.space.max())
    assert type(full.attn) is nn.MultiheadAttention


def test_unbatched_input_and_training_mode_run_with_fewer_heads():
    torch.manual_seed(0)
    model = AttentionNet(batch_first=True, need_weights=False).eval()
    subnetact.convert(model, example_inputs=torch.randn(1, 4, 16))
    model.actuate(width=0.5)
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x[None])[0], rtol=1e-5, atol=1e-6)
    model.train()
    model(x[None]).sum().backward()
    grad = model.attn.in_proj_weight.grad.view(3, 16, 16)
    assert grad[:, :8].abs().sum() > 0 and grad[:, 8:].abs().sum() == 0  # only the kept heads' rows learn


def test_a_per_head_attention_mask_is_refused_with_fewer_heads():
    torch.manual_seed(0)
    model = AttentionNet(batch_first=True, need_weights=False).eval()
    subnetact.convert(model, example_inputs=torch.randn(1, 4, 16))
    model.actuate(width=0.5)
    with pytest.raises(subnetact.ConfigError, match="2-D"), torch.no_grad():
        model(torch.randn(2, 4, 16), attn_mask=torch.zeros(2 * 4, 4, 4))


def test_multihead_attention_with_bias_kv_keeps_its_heads_whole():
    class Net(AttentionNet):
        def __init__(self):
            super().__init__(batch_first=True, need_weights=False)
            self.attn = nn.MultiheadAttention(16, 4, batch_first=True, add_bias_kv=True)

    torch.manual_seed(0)
    model = Net().eval()
    snap = _snapshot(model)
    with pytest.raises(subnetact.UnsupportedModelError, match="add_bias_kv"):
        subnetact.convert(model, example_inputs=torch.randn(1, 4, 16))
    _assert_unchanged(model, snap)


def test_torchvision_vit_heads_slice_whole_heads_and_export_narrow_attention():
    model = build("vit")
    reference = copy.deepcopy(model)
    x = inputs("vit")
    subnetact.convert(model)
    heads = [e.name for e in model.space.entries("width") if e.name.endswith("self_attention")]
    assert len(heads) == 3
    cfg = _heads_only(model, lambda name: 0.25)  # 1 of 4 heads everywhere, MLPs and depth at their largest
    padded = copy.deepcopy(reference)
    for layer in padded.encoder.layers:
        mha = layer.self_attention
        _zero_heads(
            mha,
            1,
            8,
            mha.in_proj_weight.view(3, 32, 32).unbind(0),
            mha.in_proj_bias.view(3, 32).unbind(0),
            mha.out_proj.weight,
        )
    with torch.no_grad():
        torch.testing.assert_close(model(x, subnet=cfg), padded(x), rtol=1e-5, atol=1e-5)
        dense = subnetact.export(model, cfg).eval()
        assert all(type(layer.self_attention) is NarrowMultiheadAttention for layer in dense.encoder.layers)
        assert all(layer.self_attention.in_proj_weight.shape == (24, 32) for layer in dense.encoder.layers)
        torch.testing.assert_close(dense(x), model(x, subnet=cfg), rtol=1e-5, atol=1e-6)
    restored = subnetact.unconvert(model)
    assert all(type(layer.self_attention) is nn.MultiheadAttention for layer in restored.encoder.layers)
    with torch.no_grad():
        torch.testing.assert_close(restored(x), reference(x), rtol=0, atol=0)


@pytest.mark.skipif(not HAS_TIMM, reason="timm not installed")
def test_timm_vit_fused_qkv_slices_whole_heads_and_exports_timm_attention():
    from timm.layers.attention import Attention

    model = build("timm_vit")
    reference = copy.deepcopy(model)
    x = inputs("timm_vit")
    subnetact.convert(model)
    attn = model.blocks[0].attn
    assert isinstance(attn, Attention) and isinstance(attn.qkv, PackedSliceLinear)
    n_heads, head_dim, dim = reference.blocks[0].attn.num_heads, reference.blocks[0].attn.head_dim, 192
    cfg = _heads_only(model, lambda name: 0.25)  # 1 of 3 heads
    padded = copy.deepcopy(reference)
    for block in padded.blocks:
        w = block.attn.qkv.weight.view(3, dim, dim).unbind(0)
        b = block.attn.qkv.bias.view(3, dim).unbind(0)
        _zero_heads(block.attn, 1, head_dim, w, b, block.attn.proj.weight)
    with torch.no_grad():
        torch.testing.assert_close(model(x, subnet=cfg), padded(x), rtol=1e-5, atol=1e-5)
        dense = subnetact.export(model, cfg).eval()
        for block in dense.blocks:
            assert type(block.attn) is Attention and block.attn.num_heads == 1 and block.attn.attn_dim == head_dim
            assert block.attn.qkv.out_features == 3 * head_dim and block.attn.proj.in_features == head_dim
        torch.testing.assert_close(dense(x), model(x, subnet=cfg), rtol=1e-6, atol=1e-6)
        assert model.blocks[0].attn.num_heads == n_heads  # the default (largest) subnet outside a forward
    restored = subnetact.unconvert(model)
    assert type(restored.blocks[0].attn) is Attention and type(restored.blocks[0].attn.qkv) is nn.Linear
    with torch.no_grad():
        torch.testing.assert_close(restored(x), reference(x), rtol=0, atol=0)


@pytest.mark.skipif(not HAS_TIMM, reason="timm not installed")
def test_timm_attention_with_a_norm_over_its_output_normalises_over_the_kept_heads():
    from timm.layers.attention import Attention

    from subnetact.slimmable_norm import SubnetLayerNorm

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), Attention(32, num_heads=4, scale_norm=True, norm_layer=nn.LayerNorm)).eval()
    x = torch.randn(2, 5, 8)
    subnetact.convert(net, example_inputs=x)
    attn = net[1]
    assert isinstance(attn.norm, SubnetLayerNorm)
    cfg = net.space.make(width=0.5)  # 2 of 4 heads of 8 channels
    k = 16
    with torch.no_grad():  # by hand: q, k, v of the kept heads, attention, LayerNorm over their 16 channels
        h = F.linear(x, net[0].weight, net[0].bias)
        w = attn.qkv.weight.view(3, 32, 32)[:, :k]
        q, kk, v = (F.linear(h, w[i]).view(2, 5, 2, 8).transpose(1, 2) for i in range(3))
        o = F.scaled_dot_product_attention(q, kk, v).transpose(1, 2).reshape(2, 5, k)
        o = F.layer_norm(o, (k,), attn.norm.weight[:k], attn.norm.bias[:k], attn.norm.eps)
        expected = F.linear(o, attn.proj.weight[:, :k], attn.proj.bias)
        torch.testing.assert_close(net(x, subnet=cfg), expected, rtol=1e-5, atol=1e-5)
        dense = subnetact.export(net, cfg).eval()
        assert type(dense[1].norm) is nn.LayerNorm and dense[1].norm.normalized_shape == (k,)
        torch.testing.assert_close(dense(x), net(x, subnet=cfg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name", ["vit", pytest.param("timm_vit", marks=pytest.mark.skipif(not HAS_TIMM, reason="timm"))]
)
def test_reorder_channels_keeps_attention_heads_in_place(name):
    from subnetact.importance import reorder_channels

    model = subnetact.convert(build(name))
    reference = copy.deepcopy(model)
    reorder_channels(model)
    x = inputs(name)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
        heads = [n for n, m in model.named_modules() if n.endswith(("attention", "attn"))]
        for n in heads:
            for p, q in zip(model.get_submodule(n).parameters(), reference.get_submodule(n).parameters()):
                assert torch.equal(p, q)


@pytest.mark.skipif(not HAS_TIMM, reason="timm not installed")
def test_flops_count_the_three_parts_of_a_fused_qkv():
    from subnetact.search import FlopsModel

    model = subnetact.convert(build("timm_vit"))
    flops = FlopsModel(model, inputs("timm_vit", batch=1))
    tokens, dim, head_dim, blocks = (32 // 8) ** 2 + 1, 192, 64, 3
    # 1 of 3 heads: qkv makes 3 * 64 instead of 3 * 192 outputs, proj reads 64 instead of 192 channels
    saved = blocks * tokens * dim * ((3 * dim - 3 * head_dim) + (dim - head_dim))
    assert (
        flops(model.space.max()) - flops(subnetact.SubnetConfig.from_dict(_heads_only(model, lambda n: 0.25))) == saved
    )


def test_transformer_encoder_layers_fused_fast_path_is_refused_not_sliced_silently():
    """In eval under no_grad nn.TransformerEncoderLayer runs one fused kernel on its layers' full weights (never
    inside the trace), so slicing its heads or MLP would be ignored at serving time."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 32)
            layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(32, 3)

        def forward(self, x):
            return self.head(self.enc(self.embed(x)).mean(1))

    torch.manual_seed(0)
    model = Net().eval()
    snap = _snapshot(model)
    with pytest.raises(
        subnetact.UnsupportedModelError, match=r"TransformerEncoderLayer at 'enc.layers.0' .*fast path"
    ):
        subnetact.convert(model, example_inputs=torch.randn(2, 5, 8))
    _assert_unchanged(model, snap)
