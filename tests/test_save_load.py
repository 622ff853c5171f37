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


# -- models converted with example_inputs ----------------------------------------------------------------------------
class TwoInputs(torch.nn.Module):
    """An image and a vector of token ids (integers an embedding must accept): convert cannot build this input."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        nn = torch.nn
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 6, 1), nn.AdaptiveAvgPool2d(1))
        self.embed = nn.Embedding(7, 6)
        self.head = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))

    def forward(self, image, ids, scale=1.0):
        return self.head(self.body(image).flatten(1) * scale + self.embed(ids).sum(1))


def _two_inputs(as_dict: bool):
    image = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[6, 0, 3]])
    return {"image": image, "ids": ids, "scale": 0.5} if as_dict else (image, ids, 0.5)


@pytest.mark.parametrize("as_dict", [False, True])
def test_a_model_converted_with_example_inputs_reloads_from_a_factory(tmp_path, as_dict):
    example = _two_inputs(as_dict)
    model = subnetact.convert(TwoInputs(seed=1), example_inputs=example)
    cfg = model.space.min()
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 7, (4, 3)))
    subnetact.calibrate(model, [batch], subnets=[cfg], forward_fn=lambda m, b: m(*b))
    subnetact.save(model, tmp_path / "m.safetensors")
    with pytest.raises(subnetact.UnsupportedModelError):  # the reason the inputs are recorded: no default works
        subnetact.convert(TwoInputs(seed=2))

    loaded = subnetact.load(tmp_path / "m.safetensors", lambda: TwoInputs(seed=2))

    assert loaded.space == model.space and loaded.registered_subnets == (cfg,)
    image, ids = torch.randn(2, 3, 8, 8), torch.randint(0, 7, (2, 3))
    with torch.no_grad():
        for subnet in (None, cfg):
            torch.testing.assert_close(
                loaded(image, ids, subnet=subnet), model(image, ids, subnet=subnet), rtol=0, atol=0
            )
    # Saved again, the file still records them.
    subnetact.save(loaded, tmp_path / "again.safetensors")
    subnetact.load(tmp_path / "again.safetensors", lambda: TwoInputs(seed=3))


def test_a_file_without_the_needed_example_inputs_asks_for_them(tmp_path):
    model = subnetact.convert(TwoInputs(seed=1), example_inputs=_two_inputs(False))
    model._subnetact.example_call = None  # as written by a subnetact that did not record them
    subnetact.save(model, tmp_path / "m.safetensors")
    fresh = TwoInputs(seed=2)
    before = _state(fresh)

    with pytest.raises(CheckpointError, match=r"records no example inputs .* pass example_inputs= to subnetact.load"):
        subnetact.load(tmp_path / "m.safetensors", fresh)
    assert type(fresh) is TwoInputs and all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())
    with pytest.raises(subnetact.ConfigError, match="example_inputs of type str is not allowed"):
        subnetact.load(tmp_path / "m.safetensors", fresh, example_inputs="image")
    assert type(fresh) is TwoInputs

    loaded = subnetact.load(tmp_path / "m.safetensors", fresh, example_inputs=_two_inputs(False))
    image, ids = torch.randn(2, 3, 8, 8), torch.randint(0, 7, (2, 3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(image, ids), model(image, ids), rtol=0, atol=0)


def test_example_inputs_holding_other_objects_are_not_recorded(tmp_path):
    class Scale:  # not a tensor, number, string or None: JSON cannot describe it
        value = 0.5

    class WithObject(TwoInputs):
        def forward(self, image, ids, scale=None):
            return super().forward(image, ids, 1.0 if scale is None else scale.value)

    image, ids, _ = _two_inputs(False)
    model = subnetact.convert(WithObject(seed=1), example_inputs=(image, ids, Scale()))
    subnetact.save(model, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match="pass example_inputs="):
        subnetact.load(tmp_path / "m.safetensors", lambda: WithObject(seed=2))
    loaded = subnetact.load(tmp_path / "m.safetensors", lambda: WithObject(seed=2), example_inputs=(image, ids))
    with torch.no_grad():
        torch.testing.assert_close(loaded(image, ids), model(image, ids), rtol=0, atol=0)


def test_a_factory_building_another_model_is_told_so_not_asked_for_example_inputs(tmp_path):
    # issue 21: loading with the wrong factory (a model convert refuses) suggested example_inputs=.
    model = subnetact.convert(TwoInputs(seed=1), example_inputs=_two_inputs(False))
    model._subnetact.example_call = None
    subnetact.save(model, tmp_path / "m.safetensors")
    wrong = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.ReLU())  # nothing convert could make elastic
    with pytest.raises(CheckpointError, match=r"saved from a .*TwoInputs but the factory built a .*Sequential") as e:
        subnetact.load(tmp_path / "m.safetensors", wrong)
    assert str(e.value).endswith("pass the factory that builds the saved model")
    assert "to subnetact.load" not in str(e.value)
