"""OFAProxylessNASNets -> subnetact: elastic depth (a one-block last stage), expand and kernel size (OFA's 7->5->3
transform matrices), against once-for-all itself: its dynamic forward and the subnet it extracts."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from conftest import bn_stats, make_batches, ofa_reference, randomize_bn

import subnetact
from subnetact.ofa import ElasticKernelDepthwiseConv2d, OFAProxylessNet, from_ofa, to_ofa

TOL = {"rtol": 1e-4, "atol": 1e-4}


def ofa_proxyless(seed: int):
    from ofa.imagenet_classification.elastic_nn.networks import OFAProxylessNASNets

    torch.manual_seed(seed)
    net = OFAProxylessNASNets(
        n_classes=10, width_mult=0.5, ks_list=[3, 5, 7], expand_ratio_list=[3, 4, 6], depth_list=[2, 3, 4]
    )
    randomize_bn(net, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("_matrix"):  # OFA initialises them to the identity; make the transform matter
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
            if name.endswith("point_linear.bn.bn.weight"):
                p.mul_(0.2)  # damp the residual branches (see conftest)
    return net.eval()


@pytest.fixture(scope="module")
def pair():
    ref = ofa_proxyless(seed=0)
    return ref, subnetact.convert(copy.deepcopy(ref))


def test_structure(pair):
    ref, model = pair
    assert isinstance(model, OFAProxylessNet)
    assert [n for n, m in model.named_modules() if type(m).__module__.startswith("ofa")] == []
    assert model.space.dims == ("depth", "expand", "kernel")
    assert [len(model.space.entries(d)) for d in model.space.dims] == [6, 21, 21]
    assert [e.choices for e in model.space.entries("depth")] == [(2, 3, 4)] * 5 + [(1,)]
    ops = [m for m in model.modules() if isinstance(m, ElasticKernelDepthwiseConv2d)]
    assert len(ops) == 21 and all(hasattr(op, "7to5_matrix") and hasattr(op, "5to3_matrix") for op in ops)
    theirs = {id(p) for p in ref.parameters()}
    assert len({id(p) for p in model.parameters()} & theirs) == 0  # a deep copy: its own Parameters
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    x = make_batches(1, 2, 64, seed=3)[0][0]
    ref.set_max_net()
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))  # the max subnet is OFA's max net, bit for bit


def test_parity_with_ofa(pair):
    ref, model = pair
    batches = make_batches(2, 4, 64, seed=40)
    x = make_batches(1, 3, 64, seed=41)[0][0]
    random.seed(0)
    archs = [ref.sample_active_subnet() for _ in range(10)]
    archs += [{"ks": 7, "e": 6, "d": 4}, {"ks": 3, "e": 3, "d": 2}]
    configs = [from_ofa(a, model) for a in archs]
    subnetact.calibrate(model, batches, configs)
    for arch, cfg in zip(archs[:10], configs):
        assert to_ofa(cfg, model) == arch  # the sampler's dicts come back as they were (d[-1] == 1)
    for arch, cfg in zip(archs, configs):
        sub = ofa_reference(ref, arch, batches)
        with torch.no_grad():
            y_ref, y_dyn, y = sub(x), ref(x), model(x, subnet=cfg)
        torch.testing.assert_close(y, y_ref, **TOL)
        torch.testing.assert_close(y_dyn, y_ref, **TOL)
        dense = model.export(cfg)
        for a, b in zip(bn_stats(dense), bn_stats(sub), strict=True):
            # Statistics of up to 576 channels over 2 batches, reduced in another order than OFA's
            # set_running_statistics: fp32 noise of ~2e-6 on the widest layers.
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        for (na, a), (nb, b) in zip(dense.named_parameters(), sub.named_parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"{na} vs {nb}")
        with torch.no_grad():
            torch.testing.assert_close(dense.eval()(x), y, **TOL)


def test_config_translation(pair):
    _, model = pair
    cfg = from_ofa({"ks": 5, "e": 4, "d": 3}, model)  # a scalar d: the one-block stage runs min(1, 3) blocks
    assert list(cfg["depth"]) == [3] * 5 + [1]
    assert to_ofa(cfg, model) == {"ks": [5] * 21, "e": [4] * 21, "d": [3] * 5 + [1]}
    with pytest.raises(
        subnetact.InvalidSubnetError, match=r"d\[5\]=5 is not allowed: allowed values are \(1, 2, 3, 4\)"
    ):
        from_ofa({"ks": 3, "e": 3, "d": [2] * 5 + [5]}, model)
    with pytest.raises(subnetact.InvalidSubnetError, match=r"d\[0\]=1 is not allowed: allowed values are \(2, 3, 4\)"):
        from_ofa({"ks": 3, "e": 3, "d": 1}, model)
    with pytest.raises(subnetact.InvalidSubnetError, match=r"e=\[3, 3\] has 2 values; OFA's .* here needs 21"):
        from_ofa({"ks": 3, "e": [3, 3], "d": 2}, model)


def test_checkpoint_round_trip(tmp_path, pair):
    ref, _ = pair
    path = tmp_path / "proxyless.pth"
    torch.save({"state_dict": ref.state_dict()}, path)
    model = subnetact.convert(ofa_proxyless(seed=1))
    subnetact.ofa.load_checkpoint(model, path)
    net = ofa_proxyless(seed=2)
    net.load_state_dict(subnetact.ofa.ofa_state_dict(model))  # OFA accepts our names back
    for key, value in net.state_dict().items():
        assert torch.equal(value, ref.state_dict()[key]), key


def test_unsupported_structure_is_refused_unchanged():
    net = ofa_proxyless(seed=3)
    net.block_group_info = [list(idx) for idx in net.block_group_info[:-2]] + [
        net.block_group_info[-2] + net.block_group_info[-1]
    ]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(
        subnetact.UnsupportedModelError,
        match=r"once-for-all adapter \(OFAProxylessNASNets\): block_group_info=.*expected stages of \[4, 4, 4, 4, 1\]",
    ):
        subnetact.convert(net)
    assert type(net).__name__ == "OFAProxylessNASNets"
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in state.items())
    with pytest.raises(subnetact.errors.NotConvertedError, match="not a converted once-for-all network"):
        subnetact.ofa.ofa_state_dict(net)
