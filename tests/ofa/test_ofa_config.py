"""subnetact.ofa.from_ofa / to_ofa: OFA's quirks, by hand, and clear errors for invalid dicts."""

from __future__ import annotations

import copy
import random

import pytest
from conftest import NARROW, ofa_resnets

import subnetact
from subnetact import zoo
from subnetact.ofa import from_ofa, to_ofa


@pytest.fixture(scope="module")
def space():
    return subnetact.convert(ofa_resnets(seed=7, **NARROW)).space


E18 = [0.2, 0.25, 0.35] * 6


def test_resnet_quirks_by_hand(space):
    cfg = from_ofa({"d": [2, 0, 1, 2, 0], "e": E18, "w": [0, 2, 1, 1, 0, 2]}, space)
    # d[0] == max(depth_list) keeps the stem block; d[1:] are blocks beyond (2, 2, 4, 2).
    assert cfg.depth == (1, 2, 3, 6, 2)
    # e keeps a value for every block, including the ones depth skips (stage 1 runs 2 of its 4 blocks).
    assert cfg["expand"] == tuple(E18)
    # w holds indices into width_mult_list [0.1, 0.15, 0.2].
    assert cfg.width == (0.1, 0.2, 0.15, 0.15, 0.1, 0.2)
    assert to_ofa(cfg, space) == {"d": [2, 0, 1, 2, 0], "e": E18, "w": [0, 2, 1, 1, 0, 2]}
    # Any stem value other than max skips the block, as in OFA; it comes back as min(depth_list).
    one = from_ofa({"d": [1, 0, 1, 2, 0], "e": E18, "w": [0, 2, 1, 1, 0, 2]}, space)
    assert one.depth[0] == 0 and to_ofa(one, space)["d"][0] == 0
    # Scalars broadcast like OFA's val2list; the model can stand in for its space.
    assert from_ofa({"d": 2, "e": 0.35, "w": 2}, space) == space.max()
    assert from_ofa({"d": 0, "e": 0.2, "w": 0}, space) == space.min()


def test_round_trips(space):
    rng = random.Random(0)
    for _ in range(200):
        cfg = space.sample(rng)
        assert from_ofa(to_ofa(cfg, space), space) == cfg
    net = ofa_resnets(seed=8, **NARROW)
    random.seed(1)
    for _ in range(50):
        arch = net.sample_active_subnet()
        assert to_ofa(from_ofa(copy.deepcopy(arch), space), space) == arch


def test_paper_subnets_translate(space):
    r50 = subnetact.convert(ofa_resnets(seed=9, **zoo.OFA_RESNET50_KWARGS)).space
    cfgs = [s.config(r50) for s in zoo.SUPERSERVE_OFA_RESNET50]
    assert cfgs[0] == r50.min() and cfgs[-1] == r50.max()
    assert cfgs[3].depth == (0, 2, 3, 5, 4) and cfgs[3].width == (0.65, 1.0, 0.65, 0.65, 0.8, 0.8)
    assert [to_ofa(c, r50) for c in cfgs] == [s.ofa_dict() for s in zoo.SUPERSERVE_OFA_RESNET50]


@pytest.mark.parametrize(
    ("arch", "match"),
    [
        ({"d": [2] * 5, "e": E18}, r"has no 'w'"),
        ({"d": [2] * 4, "e": E18, "w": [0] * 6}, r"d=\[2, 2, 2, 2\] has 4 values; OFA's OFAResNets here needs 5"),
        ({"d": [2, 3, 2, 2, 2], "e": E18, "w": [0] * 6}, r"d\[1\]=3 is not allowed: allowed values are \(0, 1, 2\)"),
        ({"d": [2] * 5, "e": [0.3] * 18, "w": [0] * 6}, r"e\[0\]=0.3 is not allowed"),
        ({"d": [2] * 5, "e": E18, "w": [0.15] * 6}, r"w\[0\]=0.15 must be an index into width_mult_list"),
        ({"d": [2] * 5, "e": E18, "w": [3] * 6}, r"w\[0\]=3 must be an index"),
        ({"d": [2] * 5, "e": E18, "w": [0] * 6, "ks": [3] * 20}, r"'ks' belongs to OFAMobileNetV3 configs"),
        ({"d": [True] * 5, "e": E18, "w": [0] * 6}, r"d\[0\]=True must be a number"),
        ({"d": "22222", "e": E18, "w": [0] * 6}, r"d='22222' must be a number or a list of 5 numbers"),
        ([2, 2, 2], r"must be a dict"),
    ],
)
def test_invalid_dicts(space, arch, match):
    with pytest.raises(subnetact.InvalidSubnetError, match=match):
        from_ofa(arch, space)


def test_space_must_be_ofa(space):
    other = subnetact.Space({"depth": [subnetact.Entry("layer1", (1, 2))]})
    with pytest.raises(subnetact.InvalidSubnetError, match="not the space of a converted once-for-all"):
        from_ofa({"d": 2, "e": 0.2, "w": 0}, other)
    with pytest.raises(TypeError, match="must be a subnetact.Space or a converted model"):
        from_ofa({"d": 2, "e": 0.2, "w": 0}, "resnet")
    with pytest.raises(subnetact.InvalidSubnetError, match=r"expand\[0\]=0.5 is not allowed"):
        to_ofa(space.max().replace(expand=[0.5] * 18), space)


def test_zoo_served_set():
    served = zoo.SUPERSERVE_OFA_RESNET50
    assert [round(s.accuracy, 2) for s in served] == [73.82, 76.69, 77.64, 78.25, 79.44, 80.16]
    assert [s.id for s in served] == list(range(6))
    for s in served:
        assert sorted(s.latency) == [1, 2, 4, 8, 16, 32]
        for lat in s.latency.values():
            # end to end = decode + copies + forward + postprocess, so it exceeds the forward stage alone
            assert 0 < lat.forward_mean_s < lat.mean_s < lat.p99_s < 1.0
    assert served[0].latency[1].forward_mean_s == pytest.approx(3.826070631e-3)
    d = served[1].ofa_dict()
    d["w"][0] = 99  # a copy: the served set cannot be changed through it
    assert served[1].ofa["w"][0] == 0
