"""SubnetConfig and Space: identity, serialisation, validation, sampling."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subnetact import Entry, InvalidSubnetError, Space, SubnetConfig


def small_space() -> Space:
    return Space(
        {
            "depth": [Entry("s0", (1, 2)), Entry("s1", (1, 2, 3))],
            "width": [Entry(f"b{i}", (0.25, 0.5, 1.0)) for i in range(4)],
        }
    )


def test_config_is_hashable_comparable_and_json_round_trips():
    a = SubnetConfig(depth=[1, 2], width=[0.5, 1.0])
    b = SubnetConfig(width=(0.5, 1.0), depth=(1, 2))
    assert a == b and hash(a) == hash(b) and a.id == b.id
    assert len({a, b}) == 1
    assert SubnetConfig.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    c = SubnetConfig(depth=[1, 3], width=[0.5, 1.0])
    assert a < c and c > a and sorted([c, a]) == [a, c]
    assert a.depth == (1, 2) and a.width == (0.5, 1.0)


def test_config_id_is_stable_and_canonical():
    # The id is part of the file format (save/load) and must not change between releases or processes.
    cfg = SubnetConfig(depth=[1, 2], width=[0.5, 1.0])
    assert cfg.to_json() == '{"depth":[1,2],"width":[0.5,1]}'
    # 1 == 1.0, so they are the same config and must have the same id.
    assert SubnetConfig(width=[1]).id == SubnetConfig(width=[1.0]).id


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"depth": [1, "2"]}, r"depth\[1\]='2' has type str"),
        ({"depth": [True]}, r"depth\[0\]=True has type bool"),
        ({"width": [float("nan")]}, r"width\[0\]=nan is not a finite number"),
        ({"width": "0.5"}, r"width='0.5' must be a list or tuple"),
        ({}, "at least one dimension"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(InvalidSubnetError, match=match):
        SubnetConfig(**kwargs)


def test_space_size_min_max_and_enumeration_agree_with_a_hand_count():
    space = small_space()
    assert space.size == 2 * 3 * 3**4
    every = list(space.enumerate())
    assert len(every) == space.size == len(set(every))
    assert space.min() == SubnetConfig(depth=[1, 1], width=[0.25] * 4)
    assert space.max() == SubnetConfig(depth=[2, 3], width=[1.0] * 4)
    assert all(cfg in space for cfg in every[:: len(every) // 20])


def test_sample_is_seeded_and_in_space():
    space = small_space()
    assert space.sample(random.Random(3)) == space.sample(random.Random(3))
    assert space.sample(7) == space.sample(7)
    samples = {space.sample(random.Random(i)) for i in range(50)}
    assert len(samples) > 25 and all(s in space for s in samples)


def test_make_broadcasts_scalars_and_snaps_values():
    space = small_space()
    cfg = space.make(depth=1, width=[0.25, 0.5, 1.0, 0.5000000000001])
    assert cfg == SubnetConfig(depth=[1, 1], width=[0.25, 0.5, 1.0, 0.5])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"depth": [1, 2, 3], "width": 0.5}, r"depth has 3 values but the space has 2 depth entries \(s0, s1\)"),
        (
            {"depth": [1, 4], "width": 0.5},
            r"depth\[1\]=4 is not allowed for module 's1': "
            r"allowed values are \(1, 2, 3\)",
        ),
        (
            {"depth": 1, "width": 0.3},
            r"width\[0\]=0.3 is not allowed for module 'b0': "
            r"allowed values are \(0.25, 0.5, 1.0\)",
        ),
        ({"depth": 1, "width": math.nan}, r"width\[0\]=nan is not a finite number"),
        ({"depth": 1, "width": None}, r"width=None must be a number or a list"),
        ({"depth": 1}, r"config has dimensions \['depth'\] but the space has \['depth', 'width'\]"),
        ({"depth": 1, "width": 0.5, "kernel": 3}, "the space has no dimension 'kernel'"),
    ],
)
def test_space_errors_name_dimension_value_and_allowed(kwargs, match):
    with pytest.raises(InvalidSubnetError, match=match):
        small_space().make(**kwargs)


def test_invalid_subnet_error_is_a_value_error():
    with pytest.raises(ValueError):
        small_space().make(depth=9, width=0.5)


def test_space_dict_round_trip():
    space = small_space()
    assert Space.from_dict(json.loads(json.dumps(space.to_dict()))) == space


@given(st.integers(0, 2**32 - 1))
def test_every_sample_validates_to_itself(seed):
    space = small_space()
    cfg = space.sample(seed)
    assert space.validate(cfg) == cfg
    assert SubnetConfig.from_dict(cfg.to_dict()).id == cfg.id


def test_float_depth_is_refused_not_rounded():
    # actuate(depth=2.0) was accepted silently (issue 21): block counts take ints (numpy ints included).
    import numpy as np

    space = Space({"depth": [Entry("layer1", (1, 2, 3))], "width": [Entry("b", (0.5, 1.0))]})
    with pytest.raises(
        InvalidSubnetError, match=r"depth\[0\]=2.0 is not allowed for module 'layer1': allowed values are ints"
    ):
        space.make(depth=2.0, width=1.0)
    assert space.make(depth=np.int64(2), width=1.0)["depth"] == (2,)
    assert space.make(depth=2, width=1)["width"] == (1.0,)
