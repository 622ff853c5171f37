"""save / load: bit-exact round trip; truncated, corrupted and mismatched files are refused without side effects."""

from __future__ import annotations

import json
import struct
import warnings

import pytest
import torch
from tiny_models import TINY_MODELS, image_batch

import subnetact
from subnetact import CheckpointError, UncalibratedSubnetWarning


@pytest.fixture
def saved(tmp_path):
    model = subnetact.convert(TINY_MODELS["bottleneck"](seed=1))
    subnets = [model.space.min(), model.space.sample(3), model.space.max()]
    subnetact.calibrate(model, [image_batch(4)], subnets=subnets)
    model.actuate(subnets[1])
    path = tmp_path / "supernet.safetensors"
    subnetact.save(model, path)
    return model, path


def _fresh():
    return subnetact.convert(TINY_MODELS["bottleneck"](seed=2))


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_round_trip_is_bit_exact(saved):
    model, path = saved
    loaded = subnetact.load(path, _fresh())
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    assert loaded.registered_subnets == model.registered_subnets
    for cfg in model.registered_subnets:
        assert torch.equal(loaded._subnetact.stats[cfg], model._subnetact.stats[cfg])
    assert loaded.active == model.active
    x = image_batch()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_load_from_a_factory_converts_with_the_saved_options(tmp_path):
    cfg = subnetact.ConvertConfig(width_choices=(0.5, 1.0))
    model = subnetact.convert(TINY_MODELS["basic"](), cfg)
    path = tmp_path / "m.safetensors"
    subnetact.save(model, path)
    loaded = subnetact.load(path, lambda: TINY_MODELS["basic"](seed=9))
    assert loaded.space == model.space
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def _assert_untouched(model, before):
    assert model.registered_subnets == ()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_truncated_file_is_refused(saved, tmp_path):
    _, path = saved
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(path.read_bytes()[:-100])
    model = _fresh()
    before = _state(model)
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        subnetact.load(bad, model)
    _assert_untouched(model, before)


def test_corrupted_tensor_bytes_fail_the_checksum(saved, tmp_path):
    _, path = saved
    data = bytearray(path.read_bytes())
    data[-50] ^= 0xFF
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(bytes(data))
    model = _fresh()
    before = _state(model)
    with pytest.raises(CheckpointError, match="sha256"):
        subnetact.load(bad, model)
    _assert_untouched(model, before)


def test_corrupted_header_is_refused(saved, tmp_path):
    _, path = saved
    data = bytearray(path.read_bytes())
    data[10] = ord("!")
    bad = tmp_path / "header.safetensors"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        subnetact.load(bad, _fresh())


def test_file_from_another_tool_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(CheckpointError, match="not a readable subnetact checkpoint"):
        subnetact.load(path, _fresh())


def test_mismatched_model_is_refused_and_left_unchanged(saved):
    _, path = saved
    other = subnetact.convert(TINY_MODELS["basic"]())
    before = _state(other)
    with pytest.raises(CheckpointError, match="different space"):
        subnetact.load(path, other)
    _assert_untouched(other, before)


def test_mismatched_shapes_are_refused(saved, tmp_path):
    _, path = saved
    # Same space, different classifier size.
    from torchvision.models.resnet import Bottleneck, ResNet

    other = subnetact.convert(ResNet(Bottleneck, [2, 2, 1, 1], num_classes=7, width_per_group=16))
    before = _state(other)
    with pytest.raises(CheckpointError, match=r"'fc.weight' has shape \(10, 2048\)"):
        subnetact.load(path, other)
    _assert_untouched(other, before)


def test_missing_file_and_unconverted_factory_mismatch(tmp_path, saved):
    _, path = saved
    with pytest.raises(CheckpointError, match="does not exist"):
        subnetact.load(tmp_path / "nope.safetensors", _fresh())
    fresh = TINY_MODELS["basic"]()
    with pytest.raises(CheckpointError):
        subnetact.load(path, fresh)
    assert type(fresh).__name__ == "ResNet"  # handed back unconverted


def test_header_records_space_and_subnets(saved):
    model, path = saved
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(json.loads(raw[8 : 8 + n])["__metadata__"]["subnetact"])
    assert header["subnets"] == [c.to_dict() for c in model.registered_subnets]
    assert header["space"] == model.space.to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncalibratedSubnetWarning)
        subnetact.load(path, _fresh()).actuate(model.registered_subnets[0])
