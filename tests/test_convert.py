"""convert (Algorithm 1): operator insertion, weight sharing, rules, validation before mutation, unconvert."""

from __future__ import annotations

import copy

import pytest
import torch
import torchvision
from tiny_models import TINY_MODELS, image_batch, randomize_norms
from torch import nn

import subnetact
from subnetact import LayerSelect, SubnetNorm, UnsupportedModelError, WeightSlice
from subnetact.rules import unregister_block_rule


def _snapshot(model: nn.Module) -> dict:
    return {
        "types": [(name, type(m)) for name, m in model.named_modules()],
        "tensors": {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()},
        "class": type(model),
    }


def _assert_unchanged(model: nn.Module, snap: dict) -> None:
    assert type(model) is snap["class"]
    assert [(name, type(m)) for name, m in model.named_modules()] == snap["types"]
    for k, v in model.state_dict().items():
        ptr, value = snap["tensors"][k]
        assert v.data_ptr() == ptr and torch.equal(v, value), k


@pytest.mark.parametrize(
    "arch", ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "wide_resnet50_2"]
)
def test_every_torchvision_resnet_converts_and_its_largest_subnet_is_the_original(arch):
    torch.manual_seed(0)
    original = randomize_norms(getattr(torchvision.models, arch)(num_classes=10)).eval()
    reference = copy.deepcopy(original)
    params_before = {name: p for name, p in original.named_parameters()}
    keys_before = list(original.state_dict())

    model = subnetact.convert(original)

    assert model is original and isinstance(model, torchvision.models.ResNet)
    # Same Parameter objects (same storage): no copies of the shared weights.
    assert {name: p for name, p in model.named_parameters()}.keys() == params_before.keys()
    assert all(p is params_before[name] for name, p in model.named_parameters())
    assert list(model.state_dict()) == keys_before
    assert all(isinstance(getattr(model, f"layer{i}"), LayerSelect) for i in range(1, 5))
    assert not any(type(m) is nn.BatchNorm2d for m in model.modules())
    stage_sizes = [len(getattr(reference, f"layer{i}")) for i in range(1, 5)]
    assert [e.choices for e in model.space.entries("depth")] == [tuple(range(1, n + 1)) for n in stage_sizes]
    assert len(model.space.entries("width")) == sum(stage_sizes)

    x = image_batch(2)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


def test_grouped_convolutions_keep_whole_groups():
    model = subnetact.convert(TINY_MODELS["resnext"]())
    block = model.layer1[0]
    group_width = block.conv2.out_channels // block.conv2.groups  # 2 channels per group, 4 groups
    for w in model.space.entries("width")[0].choices:
        with pytest.warns(subnetact.UncalibratedSubnetWarning) if w != 1.0 else _nullcontext():
            model.actuate(width=w)
        dense = model.export().layer1[0]
        assert dense.conv2.out_channels % group_width == 0
        assert dense.conv2.groups == dense.conv2.out_channels // group_width
        assert dense.conv2.groups == max(1, -(-int(w * 4 * 1000) // 1000))  # ceil(w * groups)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class MysteryBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return x + self.bn(self.conv(x))


def _mixed_model() -> nn.Module:
    model = TINY_MODELS["basic"]()
    model.layer2.add_module("9", MysteryBlock(model.layer2[0].conv2.out_channels))
    return model


def test_unknown_block_raises_naming_path_type_and_fix_and_leaves_model_unchanged():
    model = _mixed_model()
    snap = _snapshot(model)
    with pytest.raises(UnsupportedModelError, match=r"module 'layer2.9' of type .*MysteryBlock.*register_block_rule"):
        subnetact.convert(model)
    _assert_unchanged(model, snap)


def test_model_without_stages_is_refused_clearly():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    snap = _snapshot(model)
    with pytest.raises(UnsupportedModelError, match=r"nothing in Sequential can be made elastic.*'0': they reach"):
        subnetact.convert(model)
    _assert_unchanged(model, snap)


def test_registered_rule_makes_a_custom_block_elastic():
    @subnetact.register_block_rule(MysteryBlock)
    def mystery_rule(block):
        # conv output is the residual stream here, so the block is depth-elastic only.
        return subnetact.BlockSpec(width=None, skippable=True)

    try:
        model = subnetact.convert(_mixed_model())
        assert len(model.layer2) == 2 and model.space.entries("depth")[1].choices == (1, 2)
    finally:
        unregister_block_rule(MysteryBlock)


def test_bad_rule_output_is_refused_before_mutation():
    @subnetact.register_block_rule(MysteryBlock)
    def wrong_rule(block):
        spec = subnetact.ChannelSpec(size=block.conv.out_channels + 1, producers=("conv",), norms=(), consumers=())
        return subnetact.BlockSpec(width=spec, skippable=True)

    model = _mixed_model()
    snap = _snapshot(model)
    try:
        with pytest.raises(UnsupportedModelError, match=r"layer2.9.conv has \d+ output channels, rule says"):
            subnetact.convert(model)
        _assert_unchanged(model, snap)
    finally:
        unregister_block_rule(MysteryBlock)


def test_filter_fn_limits_elastic_stages():
    model = subnetact.convert(TINY_MODELS["basic"](), filter_fn=lambda module, fqn: fqn in {"layer1", "layer3"})
    assert [e.name for e in model.space.entries("depth")] == ["layer1", "layer3"]
    assert isinstance(model.layer1, LayerSelect) and not isinstance(model.layer2, LayerSelect)
    assert isinstance(model.layer2[0].bn1, SubnetNorm)  # norms everywhere still get per-subnet statistics


def test_convert_config_controls_the_space_and_validates():
    model = subnetact.convert(TINY_MODELS["basic"](), subnetact.ConvertConfig(width_choices=(0.5, 1.0), min_depth=2))
    assert model.space.entries("width")[0].choices == (0.5, 1.0)
    assert [e.choices for e in model.space.entries("depth")] == [(2,), (1,), (2, 3), (1,)]
    with pytest.raises(ValueError, match=r"width_choices=\(1.0, 0.5\) must be strictly increasing"):
        subnetact.ConvertConfig(width_choices=(1.0, 0.5))
    with pytest.raises(ValueError, match=r"every value must be a number in \(0, 1\], got 1.5"):
        subnetact.ConvertConfig(width_choices=(0.5, 1.5))
    with pytest.raises(ValueError, match="min_depth=0 must be an int >= 1"):
        subnetact.ConvertConfig(min_depth=0)


def test_converting_twice_is_refused_and_unconvert_restores_the_original():
    original = TINY_MODELS["bottleneck"]()
    reference = copy.deepcopy(original)
    params = list(original.parameters())
    model = subnetact.convert(original)
    with pytest.raises(UnsupportedModelError, match="already converted"):
        subnetact.convert(model)
    restored = subnetact.unconvert(model)
    assert type(restored) is torchvision.models.ResNet
    assert not any(isinstance(m, (LayerSelect, WeightSlice, SubnetNorm)) for m in restored.modules())
    assert all(a is b for a, b in zip(restored.parameters(), params))
    x = image_batch()
    with torch.no_grad():
        torch.testing.assert_close(restored(x), reference(x), rtol=0, atol=0)
