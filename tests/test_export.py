"""For every subnet, the actuated supernet equals its statically exported dense model."""

from __future__ import annotations

import warnings

import pytest
import torch
import torchvision
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import TINY_MODELS, image_batch
from torch import nn

import subnetact

_CONVERTED: dict[str, nn.Module] = {}


def converted(name: str) -> nn.Module:
    # Converting is cheap, but building the same model for every hypothesis example is not needed.
    if name not in _CONVERTED:
        _CONVERTED[name] = subnetact.convert(TINY_MODELS[name]())
    return _CONVERTED[name]


@given(arch=st.sampled_from(sorted(TINY_MODELS)), seed=st.integers(0, 2**31 - 1), calibrated=st.booleans())
def test_actuated_equals_exported(arch, seed, calibrated):
    model = converted(arch)
    cfg = model.space.sample(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)
        if calibrated:
            subnetact.calibrate(model, [image_batch(4, seed=seed)], subnets=[cfg])
        model.actuate(cfg)
    dense = model.export()
    x = image_batch(2, seed=seed + 1)
    with torch.no_grad():
        torch.testing.assert_close(model(x), dense(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(model(x, subnet=cfg), dense(x), rtol=1e-4, atol=1e-4)


def test_export_is_a_plain_independent_torchvision_resnet_of_the_right_shape():
    model = converted("bottleneck")
    cfg = model.space.make(depth=[1, 2, 1, 1], width=[0.25, 0.5, 0.75, 1.0, 0.25, 0.5])
    with pytest.warns(subnetact.UncalibratedSubnetWarning):
        dense = model.export(cfg)
    assert type(dense) is torchvision.models.ResNet
    assert [len(dense.layer1), len(dense.layer2), len(dense.layer3), len(dense.layer4)] == [1, 2, 1, 1]
    # width entries are blocks in order: layer1.0, layer1.1, layer2.0 (0.75), layer2.1 (1.0), ...
    full = model.layer2[0].conv1.out_channels
    assert dense.layer2[0].conv1.out_channels == -(-full * 3 // 4)  # ceil(0.75 * C)
    assert dense.layer2[0].conv3.in_channels == dense.layer2[0].conv2.out_channels == -(-full * 3 // 4)
    assert dense.layer2[1].conv1.out_channels == full
    assert not any(isinstance(m, subnetact.WeightSlice | subnetact.SubnetNorm) for m in dense.modules())
    shared = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert not any(p.untyped_storage().data_ptr() in shared for p in dense.parameters())
    assert not hasattr(dense, "_subnetact")


def test_export_of_the_largest_subnet_is_a_full_copy():
    model = converted("basic")
    dense = model.export(model.space.max())
    assert [k for k in dense.state_dict()] == [k for k in model.state_dict()]
    for (k, a), b in zip(dense.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), k
