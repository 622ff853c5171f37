"""OFAMobileNetV3 -> subnetact: elastic depth, expand (with squeeze-excite slicing) and kernel size (OFA's 7->5->3
transform matrices), against once-for-all itself."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from conftest import bn_stats, make_batches, ofa_reference, randomize_bn

import subnetact
from subnetact.ofa import ElasticKernelDepthwiseConv2d, OFAMobileNet

TOL = {"rtol": 1e-4, "atol": 1e-4}


def ofa_mbv3(seed: int):
    from ofa.imagenet_classification.elastic_nn.networks import OFAMobileNetV3

    torch.manual_seed(seed)
    net = OFAMobileNetV3(
        n_classes=10, dropout_rate=0.1, ks_list=[3, 5, 7], expand_ratio_list=[3, 4, 6], depth_list=[2, 3, 4]
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
    ref = ofa_mbv3(seed=0)
    return ref, subnetact.convert(copy.deepcopy(ref))


def test_structure(pair):
    ref, model = pair
    assert isinstance(model, OFAMobileNet)
    assert [n for n, m in model.named_modules() if type(m).__module__.startswith("ofa")] == []
    assert model.space.dims == ("depth", "expand", "kernel")
    assert [len(model.space.entries(d)) for d in model.space.dims] == [5, 20, 20]
    ops = [m for m in model.modules() if isinstance(m, ElasticKernelDepthwiseConv2d)]
    assert len(ops) == 20 and all(hasattr(op, "7to5_matrix") and hasattr(op, "5to3_matrix") for op in ops)
    theirs = {id(p) for p in ref.parameters()}
    assert len({id(p) for p in model.parameters()} & theirs) == 0  # a deep copy: its own Parameters
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())


def test_kernel_transform_by_hand(pair):
    """The 3x3 filter is crop(7->5) @ M75, then crop(5->3) @ M53, computed here independently of both codes."""
    _, model = pair
    op = next(m for m in model.modules() if isinstance(m, ElasticKernelDepthwiseConv2d))
    w = op.weight.detach()
    c = 8
    f5 = (w[:c, 0, 1:6, 1:6].reshape(c, 25) @ op.get_parameter("7to5_matrix").detach().T).reshape(c, 5, 5)
    f3 = (f5[:, 1:4, 1:4].reshape(c, 9) @ op.get_parameter("5to3_matrix").detach().T).reshape(c, 1, 3, 3)
    torch.testing.assert_close(op.filter(c, 3), f3)
    assert torch.equal(op.filter(c, 7), w[:c])


def test_parity_with_ofa(pair):
    ref, model = pair
    batches = make_batches(2, 4, 64, seed=40)
    x = make_batches(1, 3, 64, seed=41)[0][0]
    random.seed(0)
    archs = [ref.sample_active_subnet() for _ in range(12)]
    archs += [{"ks": 7, "e": 6, "d": 4}, {"ks": 3, "e": 3, "d": 2}]
    configs = [subnetact.ofa.from_ofa(a, model) for a in archs]
    subnetact.calibrate(model, batches, configs)
    for arch, cfg in zip(archs, configs):
        assert subnetact.ofa.to_ofa(cfg, model) == {
            k: (v if isinstance(v, list) else [v] * (5 if k == "d" else 20)) for k, v in arch.items()
        }
        sub = ofa_reference(ref, arch, batches)
        with torch.no_grad():
            y_ref, y_dyn, y = sub(x), ref(x), model(x, subnet=cfg)
        torch.testing.assert_close(y, y_ref, **TOL)
        torch.testing.assert_close(y_dyn, y_ref, **TOL)
        dense = model.export(cfg)
        for a, b in zip(bn_stats(dense), bn_stats(sub), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        for (na, a), (nb, b) in zip(dense.named_parameters(), sub.named_parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"{na} vs {nb}")


def test_config_errors(pair):
    _, model = pair
    with pytest.raises(
        subnetact.InvalidSubnetError, match=r"ks\[0\]=9 is not allowed: allowed values are \(3, 5, 7\)"
    ):
        subnetact.ofa.from_ofa({"ks": 9, "e": 3, "d": 2}, model)
    with pytest.raises(subnetact.InvalidSubnetError, match=r"'w' belongs to OFAResNets configs"):
        subnetact.ofa.from_ofa({"ks": 3, "e": 3, "d": 2, "w": 1}, model)
    with pytest.raises(subnetact.InvalidSubnetError, match=r"d\[0\]=1 is not allowed"):
        subnetact.ofa.from_ofa({"ks": 3, "e": 3, "d": 1}, model)  # absolute depth: 1 is not in {2,3,4}


def test_checkpoint_nested_keys_load(tmp_path, pair):
    ref, _ = pair
    path = tmp_path / "mbv3.pth"
    torch.save({"state_dict": ref.state_dict()}, path)
    model = subnetact.convert(ofa_mbv3(seed=1))
    subnetact.ofa.load_checkpoint(model, path)
    ours = subnetact.ofa.ofa_state_dict(model)
    net = ofa_mbv3(seed=2)
    net.load_state_dict(ours)  # OFA accepts our names back
    for key, value in net.state_dict().items():
        assert torch.equal(value, ref.state_dict()[key]), key
