"""OFAResNets -> subnetact: structure of the conversion, and parity with once-for-all itself (the reference)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import (
    NARROW,
    RESNET50,
    bn_stats,
    make_batches,
    ofa_reference,
    ofa_resnets,
    random_archs,
)

import subnetact
from subnetact import zoo
from subnetact.ofa import OFAResNet

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _no_ofa_modules(model: torch.nn.Module) -> list[str]:
    return [
        f"{name}: {type(m).__module__}" for name, m in model.named_modules() if type(m).__module__.startswith("ofa")
    ]


def test_convert_in_place_plain_modules_shared_parameters():
    ref = ofa_resnets(seed=3, **NARROW)
    params = {id(p) for p in ref.parameters()}
    n_params = sum(p.numel() for p in ref.parameters())
    model = subnetact.convert(ref)
    assert model is ref
    assert isinstance(model, OFAResNet) and isinstance(model, subnetact.SupernetMixin)
    assert _no_ofa_modules(model) == []
    # The very same Parameters, nothing allocated.
    assert {id(p) for p in model.parameters()} == params
    assert sum(p.numel() for p in model.parameters()) == n_params
    space = model.space
    assert space.dims == ("depth", "expand", "width")
    assert [e.choices for e in space.entries("depth")] == [(0, 1), (2, 3, 4), (2, 3, 4), (4, 5, 6), (2, 3, 4)]
    assert len(space.entries("expand")) == 18 and len(space.entries("width")) == 6
    assert space.entries("width")[0].choices == (0.1, 0.15, 0.2)
    assert model.active == space.max()
    with pytest.warns(subnetact.UncalibratedSubnetWarning):
        exported = model.export(space.min())
    assert isinstance(exported, OFAResNet) and _no_ofa_modules(exported) == []


def test_convert_refuses_unsupported_net_and_leaves_it_untouched():
    ref = ofa_resnets(seed=4, **NARROW)
    ref.blocks[5].act_func = "relu6"
    before = type(ref), list(ref.state_dict())
    with pytest.raises(subnetact.UnsupportedModelError, match=r"blocks\.5\.act_func='relu6'"):
        subnetact.convert(ref)
    assert (type(ref), list(ref.state_dict())) == before
    with pytest.raises(subnetact.UnsupportedModelError, match="filter_fn is not supported"):
        subnetact.convert(ref, filter_fn=lambda m, p: True)


def test_paper_subnets_match_ofa(resnet50_pair):
    """The six SuperServe subnets: outputs, per-subnet statistics and the exported weights equal OFA's."""
    ref, model = resnet50_pair
    batches = make_batches(2, 4, 64, seed=10)
    x = make_batches(1, 4, 64, seed=11)[0][0]
    configs = [s.config(model) for s in zoo.SUPERSERVE_OFA_RESNET50]
    assert subnetact.calibrate(model, batches, configs) == configs
    for served, cfg in zip(zoo.SUPERSERVE_OFA_RESNET50, configs):
        sub = ofa_reference(ref, served.ofa_dict(), batches)
        model.actuate(cfg)
        with torch.no_grad():
            y_ref, y_dyn, y = sub(x), ref(x), model(x)
        torch.testing.assert_close(y, y_ref, **TOL)
        torch.testing.assert_close(y_dyn, y_ref, **TOL)  # OFA's dynamic forward after recalibration: same net
        # The statistics are OFA's recalibrated ones, BN by BN; the exported weights are OFA's extracted ones.
        dense = model.export(cfg)
        ours, theirs = bn_stats(dense), bn_stats(sub)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        w_ours = [p for n, p in dense.named_parameters()]
        w_theirs = [p for n, p in sub.named_parameters()]
        assert [tuple(p.shape) for p in w_ours] == [tuple(p.shape) for p in w_theirs]
        assert all(torch.equal(a, b) for a, b in zip(w_ours, w_theirs))


def test_random_subnets_match_ofa(narrow_pair, resnet50_pair):
    """50 random subnets of a narrow OFAResNets (ofa_resnet50's structure at 1/100 of the compute) and 4 of
    ofa_resnet50 itself, half drawn by OFA's sampler, half by ours."""
    for (ref, model), n, size in ((narrow_pair, 50, 64), (resnet50_pair, 4, 64)):
        batches = make_batches(2, 4, size, seed=20)
        x = make_batches(1, 3, size, seed=21)[0][0]
        archs = random_archs(ref, model, n, seed=n)
        configs = [subnetact.ofa.from_ofa(a, model) for a in archs]
        subnetact.calibrate(model, batches, configs)
        for arch, cfg in zip(archs, configs):
            assert subnetact.ofa.to_ofa(cfg, model) == arch  # both samplers give a stem flag of min or max: lossless
            sub = ofa_reference(ref, arch, batches)
            with torch.no_grad():
                y_ref, y = sub(x), model(x, subnet=cfg)
            torch.testing.assert_close(y, y_ref, **TOL, msg=lambda m, a=arch: f"{a}: {m}")
            for a, b in zip(bn_stats(model.export(cfg)), bn_stats(sub), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_why_subnetnorm_matters():
    """OFA without recalibration = shared statistics sliced to the subnet's channels. Give the supernet the
    statistics of its largest subnet (what training leaves behind); then the smallest paper subnet, run on those
    sliced statistics, is far from the calibrated reference, while SubnetNorm's own statistics match it."""
    from ofa.imagenet_classification.elastic_nn.utils import set_running_statistics

    ref = ofa_resnets(seed=5, **RESNET50)
    batches = make_batches(2, 4, 64, seed=30)
    x = make_batches(1, 4, 64, seed=31)[0][0]
    ref.set_max_net()
    set_running_statistics(ref, batches)  # shared statistics = the full network's
    model = subnetact.convert(copy.deepcopy(ref))

    small = zoo.SUPERSERVE_OFA_RESNET50[0]
    cfg = small.config(model)
    ref.set_active_subnet(**small.ofa_dict())
    with torch.no_grad():
        y_shared_ofa = ref(x)  # OFA, no recalibration
    with pytest.warns(subnetact.UncalibratedSubnetWarning):
        model.actuate(cfg)
    with torch.no_grad():
        y_shared = model(x)
    torch.testing.assert_close(y_shared, y_shared_ofa, **TOL)  # our fallback is exactly OFA's prefix slicing

    sub = ofa_reference(ref, small.ofa_dict(), batches)
    with torch.no_grad():
        y_ref = sub(x)
    error_shared = (y_shared - y_ref).abs().max() / y_ref.abs().max()
    print(f"relative error with prefix-sliced shared statistics: {error_shared:.3f}")
    assert error_shared > 0.05, f"prefix-sliced statistics were expected to be off, relative error {error_shared}"

    subnetact.calibrate(model, batches, [cfg])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            y = model(x)
    torch.testing.assert_close(y, y_ref, **TOL)
