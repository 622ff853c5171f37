"""The default (traced) analysis of convert on a table of tiny real architectures, and its refusals.

For every model of ``zoo_models.ZOO``: the largest subnet is the original model exactly; after ``calibrate`` the
actuated model equals its ``export()`` for the smallest and a random subnet; the smallest subnet really is smaller.
Refusals name the module and leave the model unchanged.
"""

from __future__ import annotations

import copy
import random
import warnings

import pytest
import torch
from test_convert import _assert_unchanged, _snapshot
from torch import nn
from zoo_models import HAS_TIMM, ZOO, build, inputs

import subnetact
from subnetact import LayerSelect, SubnetNorm, UnsupportedModelError, WeightSlice


def _params(name):
    marks = [pytest.mark.skipif(not HAS_TIMM, reason="timm not installed")] if ZOO[name].needs_timm else []
    return pytest.param(name, marks=marks)


@pytest.mark.parametrize("name", [_params(n) for n in ZOO])
def test_zoo_model_converts_with_exact_max_and_export_parity(name):
    original = build(name)
    reference = copy.deepcopy(original)
    params = dict(original.named_parameters())
    keys = list(original.state_dict())
    x = inputs(name)

    model = subnetact.convert(original)

    assert model is original and isinstance(model, type(reference))
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    assert any(isinstance(m, WeightSlice) for m in model.modules())
    assert ("depth" in model.space.dims) == ZOO[name].depth
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)

    cfgs = [model.space.min(), model.space.sample(random.Random(0))]
    subnetact.calibrate(model, [inputs(name, seed=s, batch=4) for s in (2, 3)], subnets=cfgs)
    with torch.no_grad():
        for cfg in cfgs:
            dense = subnetact.export(model, cfg).eval()
            assert type(dense) is type(reference)
            assert not any(isinstance(m, (WeightSlice, SubnetNorm, LayerSelect)) for m in dense.modules())
            actuated, exported = model(x, subnet=cfg), dense(x)
            assert (actuated - exported).abs().max() <= 1e-4 * exported.abs().max()  # relative max error
        smallest = model(x, subnet=cfgs[0])
        assert (smallest - reference(x)).abs().max() > 1e-3  # the smallest subnet is not the original


def test_depth_runs_inside_a_flat_sequential_keep_names_and_skip_blocks():
    model = subnetact.convert(build("mobilenet_v2"))
    features = model.features
    assert isinstance(features, LayerSelect) and len(features.segments) > 1
    names = [e.name for e in model.space.entries("depth")]
    assert all(n.startswith("features[") for n in names)
    # Positions outside every segment always run; a segment at depth 1 runs only its first (shape-changing) block.
    cfg = model.space.min()
    kept = features.kept_positions(cfg)
    skipped = [p for seg in features.segments for p in range(seg[1] + 1, seg[2])]
    assert not set(kept) & set(skipped) and len(kept) + len(skipped) == len(features)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)
        dense = subnetact.export(model, cfg)
    assert len(dense.features) == len(kept)


@pytest.mark.skipif(not HAS_TIMM, reason="timm not installed")
def test_timm_batchnorm_act_keeps_its_activation():
    from timm.layers.norm_act import BatchNormAct2d

    model = build("timm_efficientnet")
    acts = {n: type(m.act) for n, m in model.named_modules() if isinstance(m, BatchNormAct2d)}
    model = subnetact.convert(model)
    norms = {n: m for n, m in model.named_modules() if n in acts}
    assert all(isinstance(m, SubnetNorm) and type(m.act) is acts[n] for n, m in norms.items())
    dense = subnetact.export(model)
    assert all(type(dense.get_submodule(n)) is BatchNormAct2d for n in acts)
    restored = subnetact.unconvert(model)
    assert all(type(restored.get_submodule(n)) is BatchNormAct2d for n in acts)


class Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn, self.conv2 = nn.Conv2d(c, 2 * c, 1), nn.BatchNorm2d(2 * c), nn.Conv2d(2 * c, c, 1)

    def forward(self, x):
        return x + self.conv2(torch.relu(self.bn(self.conv1(x))))


def _net(*body: nn.Module, stem_bn: nn.Module | None = None) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        stem_bn or nn.BatchNorm2d(8),
        nn.Sequential(*body),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    ).eval()


def test_a_block_object_used_twice_is_not_collapsed():
    torch.manual_seed(0)
    block = Residual(8)
    model = _net(block, Residual(8), block)
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8)
    subnetact.convert(model)
    assert len(model[2]) == 3
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


def test_batchnorm_without_running_statistics_matches_its_export():
    torch.manual_seed(0)
    model = _net(Residual(8), Residual(8), stem_bn=nn.BatchNorm2d(8, track_running_stats=False))
    x = torch.randn(4, 3, 8, 8)
    subnetact.convert(model)
    cfg = model.space.min()
    subnetact.calibrate(model, [torch.randn(4, 3, 8, 8)], subnets=[cfg])
    with torch.no_grad():
        torch.testing.assert_close(model(x, subnet=cfg), subnetact.export(model, cfg)(x), rtol=1e-4, atol=1e-5)


class FixedView(nn.Module):
    """Reads its input with a hard-coded channel count: slicing the channels in front of it breaks it."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c = c
        self.conv = nn.Conv2d(c, c, 1)

    def forward(self, x):
        n = x.shape[0]
        return self.conv(x.reshape(n, self.c, -1).reshape(n, self.c, *x.shape[2:]))


def test_a_module_that_breaks_at_the_smallest_subnet_is_named_and_the_model_is_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), FixedView(8), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))
    snap = _snapshot(model)
    with pytest.raises(UnsupportedModelError, match=r"smallest subnet .* fails in module '2'"):
        subnetact.convert(model, example_inputs=torch.randn(1, 3, 8, 8))
    _assert_unchanged(model, snap)


def test_refusal_names_the_blocking_operation_and_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))
    snap = _snapshot(model)
    with pytest.raises(UnsupportedModelError, match=r"8 channels of '0': flatten at '1' reshapes them"):
        subnetact.convert(model, example_inputs=torch.randn(1, 3, 8, 8))
    _assert_unchanged(model, snap)


def test_example_inputs_are_validated():
    with pytest.raises(subnetact.ConfigError, match="example_inputs of type str is not allowed"):
        subnetact.convert(_net(Residual(8)), example_inputs="image")


def test_a_custom_stage_next_to_ruled_ones_is_converted_not_skipped():
    from tiny_models import TINY_MODELS

    model = TINY_MODELS["basic"]()
    c = model.layer3[-1].conv2.out_channels
    model.layer4 = nn.Sequential(Residual(c), Residual(c))
    model.fc = nn.Linear(c, 10)
    reference = copy.deepcopy(model)
    subnetact.convert(model)
    assert [e.name for e in model.space.entries("depth")][-1] == "layer4"
    assert isinstance(model.layer4[0].conv1, WeightSlice)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


def test_a_traced_model_saves_and_loads(tmp_path):
    model = subnetact.convert(build("mobilenet_v3_small"))
    cfg = model.space.sample(random.Random(1))
    subnetact.calibrate(model, [inputs("mobilenet_v3_small", seed=2, batch=4)], subnets=[cfg])
    subnetact.save(model, tmp_path / "m.safetensors")
    loaded = subnetact.load(tmp_path / "m.safetensors", build("mobilenet_v3_small", seed=5))
    x = inputs("mobilenet_v3_small")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, subnet=cfg), model(x, subnet=cfg), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mobilenet_v2", "regnet_x_400mf", "convnext"])
def test_reorder_channels_keeps_the_full_model_and_puts_important_channels_first(name):
    from subnetact.importance import reorder_channels

    model = subnetact.convert(build(name))
    reference = copy.deepcopy(model)
    x = inputs(name)
    params = dict(model.named_parameters())
    perms = reorder_channels(model)
    assert all(p is params[n] for n, p in model.named_parameters())
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perms)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
    # Every group's consumers now read their largest-L1 input columns first.
    for m in model.modules():
        if isinstance(m, WeightSlice) and m.in_group is not None and getattr(m, "groups", 1) == 1:
            cols = m.weight.abs().sum(dim=[d for d in range(m.weight.dim()) if d != 1])
            half = len(cols) // 2
            assert cols[:half].mean() >= cols[half:].mean() or len(model.space.entries("width")) == 0


def test_reorder_channels_refuses_after_calibration():
    from subnetact.importance import reorder_channels

    model = subnetact.convert(build("mobilenet_v2"))
    subnetact.calibrate(model, [inputs("mobilenet_v2", batch=4)], subnets=[model.space.max()])
    with pytest.raises(subnetact.ConfigError, match="1 registered subnets"):
        reorder_channels(model)


def test_unconvert_restores_a_traced_model():
    model = build("mobilenet_v3_small")
    reference = copy.deepcopy(model)
    types = [(n, type(m)) for n, m in model.named_modules()]
    subnetact.unconvert(subnetact.convert(model))
    assert [(n, type(m)) for n, m in model.named_modules()] == types
    x = inputs("mobilenet_v3_small")
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
