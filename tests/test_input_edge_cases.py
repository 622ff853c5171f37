"""Smaller reliability findings of issue 14: numpy scalars, dict configs in export, huge ints in config ids, file
modes and atomic writes, oversized profiles, non-finite calibration statistics, Space round trips."""

from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np
import pytest
import torch
from tiny_models import TINY_MODELS, image_batch

import subnetact
from subnetact import SubnetConfig, UncalibratedSubnetWarning
from subnetact.errors import ConfigError


@pytest.fixture
def model():
    return subnetact.convert(TINY_MODELS["basic"]())


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedSubnetWarning)
        yield


def test_numpy_scalars_are_accepted_like_python_numbers(model):
    cfg = model.space.sample(2)
    as_numpy = {
        "depth": [np.int64(d) for d in cfg.depth],
        "width": [np.float32(w) if w in (0.25, 0.5, 0.75, 1.0) else np.float64(w) for w in cfg.width],
    }
    assert model.actuate(as_numpy) == cfg
    assert model.actuate(depth=np.int64(cfg.depth[0]), width=np.float32(0.5)) == model.space.make(
        depth=cfg.depth[0], width=0.5
    )
    assert SubnetConfig(depth=[np.int32(2)]) == SubnetConfig(depth=[2])


def test_export_accepts_the_dict_form_that_actuate_accepts(model):
    cfg = model.space.sample(4)
    x = image_batch(1)
    with torch.no_grad():
        assert torch.equal(model.export(cfg.to_dict()).eval()(x), model.export(cfg).eval()(x))
    with pytest.raises(subnetact.InvalidSubnetError, match="must be a SubnetConfig or a mapping"):
        model.export(42)


def test_config_id_of_a_huge_int_does_not_overflow():
    cfg = SubnetConfig(depth=[10**400])
    assert isinstance(cfg.id, str) and cfg.id != SubnetConfig(depth=[10**400 + 1]).id
    assert SubnetConfig(depth=[2.0]).id == SubnetConfig(depth=[2]).id  # integral floats still canonicalise


def test_save_honours_the_umask(model, tmp_path):
    old = os.umask(0o022)
    try:
        subnetact.save(model, tmp_path / "m.safetensors")
    finally:
        os.umask(old)
    assert (tmp_path / "m.safetensors").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temporary file left behind


def test_profile_save_is_atomic(tmp_path, monkeypatch):
    from scheduling import Profile, datasets

    profile = datasets.superserve_a40_profile()
    path = tmp_path / "profile.json"
    profile.save(path)
    before = path.read_text()
    monkeypatch.setattr(Profile, "to_dict", lambda self: {"not json": object()})
    with pytest.raises(TypeError):
        profile.save(path)
    assert path.read_text() == before  # the previous file is intact, not truncated
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]


def test_profile_batch_sizes_are_bounded():
    from scheduling import InvalidProfileError, LatencyStats, Subnet

    with pytest.raises(InvalidProfileError, match=r"must be ints in \[1, 65536\], got 1000000000"):
        Subnet(1, 70.0, {10**9: LatencyStats(0.01)})
    Subnet(1, 70.0, {65536: LatencyStats(0.01)})


def test_space_round_trip_keeps_links_and_refuses_bad_choices():
    from subnetact.space import Entry, Space

    space = Space(
        {"heads": [Entry("l0.attn", (2, 4))], "ffn": [Entry("l0.ffn", (0.5, 1.0))]}, links={"width": ("heads", "ffn")}
    )
    back = Space.from_dict(json.loads(json.dumps(space.to_dict())))
    assert back == space and back.links == {"width": ("heads", "ffn")}
    assert back.make(heads=4, ffn=1.0) == back.max()
    assert back.expand_links({"width": 1.0}) == {"heads": 1.0, "ffn": 1.0}  # main dropped links: width= refused
    for bad in [math.nan, "0.5", True]:
        with pytest.raises(subnetact.InvalidSubnetError, match=r"l0\.ffn\[1\]="):
            Entry("l0.ffn", (0.25, bad))
    assert Entry("e", (np.float32(0.5), np.int64(1))).choices == (0.5, 1)


def test_calibration_on_nan_batches_is_refused_and_registers_nothing(model):
    cfg = model.space.sample(1)
    bad = image_batch(2)
    bad[0, 0, 0, 0] = math.nan
    with pytest.raises(ConfigError, match=r"non-finite statistics for SubnetNorm .* do the batches contain NaN"):
        subnetact.calibrate(model, [image_batch(2), bad], subnets=[cfg])
    assert model.registered_subnets == ()
