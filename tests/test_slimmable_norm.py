"""LayerNorm / GroupNorm over an elastic channel group (slimmable semantics): a subnet normalises over its active
channels (GroupNorm: whole groups), checked against a hand computation with ``F.layer_norm`` / ``F.group_norm`` on
the sliced tensor and against ``export()``; norms of residual streams stay plain modules."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import subnetact
from subnetact.slimmable_norm import SubnetGroupNorm, SubnetLayerNorm


class NormedMlp(nn.Module):
    """``x + fc2(LayerNorm(gelu(fc1(x))))``: the LayerNorm reads the hidden units (elastic)."""

    def __init__(self, dim: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(dim)  # over the residual stream: stays full width
        self.fc1, self.norm, self.fc2 = nn.Linear(dim, hidden), nn.LayerNorm(hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(self.norm(F.gelu(self.fc1(self.norm_in(x)))))


class GroupNormBlock(nn.Module):
    """``x + conv2(relu(GroupNorm(conv1(x))))``: the GroupNorm (4 groups of 4) reads the middle channels."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1, self.norm, self.conv2 = nn.Conv2d(c, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.Conv2d(16, c, 1)

    def forward(self, x):
        return x + self.conv2(torch.relu(self.norm(self.conv1(x))))


def _randomize_affine(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
                m.weight.normal_(1.0, 0.5)
                m.bias.normal_(0.0, 0.5)
    return model


def test_layer_norm_over_hidden_units_normalises_over_the_active_units():
    torch.manual_seed(0)
    model = _randomize_affine(nn.Sequential(NormedMlp(), NormedMlp())).eval()
    reference = copy.deepcopy(model)
    x = torch.randn(3, 5, 8)
    subnetact.convert(model, example_inputs=x)
    block = model[0]
    assert isinstance(block.norm, SubnetLayerNorm) and type(block.norm_in) is nn.LayerNorm
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
        cfg = model.space.make(width=0.25)  # 4 of 16 hidden units in both blocks
        h = x
        for b in reference:
            u = F.gelu(F.linear(b.norm_in(h), b.fc1.weight[:4], b.fc1.bias[:4]))
            u = F.layer_norm(u, (4,), b.norm.weight[:4], b.norm.bias[:4], b.norm.eps)
            h = h + F.linear(u, b.fc2.weight[:, :4], b.fc2.bias)
        torch.testing.assert_close(model(x, subnet=cfg), h, rtol=1e-5, atol=1e-6)
        dense = subnetact.export(model, cfg).eval()
        assert type(dense[0].norm) is nn.LayerNorm and dense[0].norm.normalized_shape == (4,)
        assert dense[0].norm.weight.shape == (4,) and dense[0].norm_in.normalized_shape == (8,)
        torch.testing.assert_close(dense(x), model(x, subnet=cfg), rtol=1e-5, atol=1e-6)
    restored = subnetact.unconvert(model)
    assert type(restored[0].norm) is nn.LayerNorm
    with torch.no_grad():
        torch.testing.assert_close(restored(x), reference(x), rtol=0, atol=0)


def test_group_norm_over_middle_channels_keeps_whole_groups():
    torch.manual_seed(0)
    model = _randomize_affine(nn.Sequential(nn.Conv2d(3, 8, 3), GroupNormBlock(), GroupNormBlock())).eval()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 10, 10)
    subnetact.convert(model, example_inputs=x, config=subnetact.ConvertConfig(width_choices=(0.3, 0.5, 1.0)))
    assert isinstance(model[1].norm, SubnetGroupNorm)
    groups = {g.full: [k for _, k in g.sizes] for g in model._subnetact.groups}
    assert groups[16] == [8, 8, 16]  # 0.3 of 4 groups rounds up to 2 whole groups of 4
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
        cfg = model.space.make(width=0.5)  # 2 of 4 groups
        h = reference[0](x)
        for b in reference[1:]:
            u = F.conv2d(h, b.conv1.weight[:8], b.conv1.bias[:8], padding=1)
            u = torch.relu(F.group_norm(u, 2, b.norm.weight[:8], b.norm.bias[:8], b.norm.eps))
            h = h + F.conv2d(u, b.conv2.weight[:, :8], b.conv2.bias)
        torch.testing.assert_close(model(x, subnet=cfg), h, rtol=1e-5, atol=1e-5)
        dense = subnetact.export(model, cfg).eval()
        assert type(dense[1].norm) is nn.GroupNorm
        assert (dense[1].norm.num_groups, dense[1].norm.num_channels) == (2, 8)
        torch.testing.assert_close(dense(x), model(x, subnet=cfg), rtol=1e-5, atol=1e-5)


def test_reorder_channels_moves_layer_norm_affines_and_whole_group_norm_groups():
    from subnetact.importance import reorder_channels

    torch.manual_seed(0)
    model = _randomize_affine(
        nn.Sequential(nn.Conv2d(3, 8, 3), GroupNormBlock(), nn.Flatten(2), nn.Linear(64, 8), NormedMlp(8, 12))
    ).eval()
    x = torch.randn(2, 3, 10, 10)
    subnetact.convert(model, example_inputs=x)
    reference = copy.deepcopy(model)
    perms = reorder_channels(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)  # the full model is unchanged
    by_size = {len(p): p for p in perms}
    gn, ln = by_size[16], by_size[12]
    assert torch.equal(gn.view(4, 4) - gn.view(4, 4)[:, :1], torch.arange(4).expand(4, 4))  # whole groups of 4
    assert not torch.equal(ln, torch.arange(12))
    torch.testing.assert_close(model[1].norm.weight, reference[1].norm.weight[gn], rtol=0, atol=0)
    torch.testing.assert_close(model[4].norm.weight, reference[4].norm.weight[ln], rtol=0, atol=0)
