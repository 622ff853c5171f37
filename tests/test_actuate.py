"""actuate: validation, O(1) switching, thread safety, warnings, training, copies and dtype moves."""

from __future__ import annotations

import contextlib
import copy
import threading
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import TINY_MODELS, image_batch

import subnetact
from subnetact import InvalidSubnetError, UncalibratedSubnetWarning
from subnetact.layer_select import RULES
from subnetact.state import ActuationState


@pytest.fixture
def model():
    return subnetact.convert(TINY_MODELS["basic"]())


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedSubnetWarning)
        yield


def test_actuate_returns_and_exposes_the_active_config(model):
    with quiet():
        cfg = model.actuate(depth=[1, 1, 2, 1], width=0.5)
    assert cfg == model.active
    assert cfg.depth == (1, 1, 2, 1) and set(cfg.width) == {0.5}
    with quiet():
        # Keywords not given keep their active values.
        assert model.actuate(depth=2 - 1).width == cfg.width
        assert model.actuate(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"depth": [1, 1, 2]}, r"depth has 3 values but the space has 4 depth entries \(layer1, layer2, layer3, "),
        ({"depth": [1, 1, 4, 1]}, r"depth\[2\]=4 is not allowed for module 'layer3': allowed values are \(1, 2, 3\)"),
        (
            {"width": 0.6},
            r"width\[0\]=0.6 is not allowed for module 'layer1.0': "
            r"allowed values are \(0.25, 0.5, 0.75, 1.0\)",
        ),
        ({"width": float("nan")}, r"width\[0\]=nan is not a finite number"),
        ({"width": "wide"}, r"width='wide' must be a number or a list of 7 numbers"),
        ({"depth": [1, 1, 2.5, 1]}, r"depth\[2\]=2.5 is not allowed"),
        ({}, "needs a config or at least one of depth=, width="),
    ],
)
def test_invalid_actuation_raises_and_keeps_the_previous_subnet(model, kwargs, match):
    with quiet():
        before = model.actuate(depth=[2, 1, 2, 1], width=0.75)
    x = image_batch()
    with torch.no_grad():
        y_before = model(x)
    with pytest.raises(InvalidSubnetError, match=match):
        model.actuate(**kwargs)
    assert model.active == before
    with torch.no_grad():
        assert torch.equal(model(x), y_before)


def test_invalid_config_object_is_refused(model):
    with pytest.raises(InvalidSubnetError, match="pass either a config or keywords"):
        model.actuate(model.space.max(), width=0.5)
    with pytest.raises(InvalidSubnetError, match=r"config=3 must be a SubnetConfig"):
        model.actuate(3)
    with pytest.raises(InvalidSubnetError, match=r"depth\[0\]=9 is not allowed"):
        model.actuate(model.space.max().replace(depth=(9, 1, 1, 1)))


def test_actuating_a_seen_config_does_no_compilation(model, monkeypatch):
    configs = [model.space.sample(i) for i in range(5)]
    with quiet():
        for cfg in configs:
            model.actuate(cfg)

    def fail(*args, **kwargs):
        raise AssertionError("actuating a config seen before must not compile a plan")

    monkeypatch.setattr(ActuationState, "compile", fail)
    monkeypatch.setattr(model.space, "validate", fail)
    for cfg in configs * 3:
        assert model.actuate(cfg) is not None
        assert model._subnetact.default.config == cfg


def test_actuation_never_copies_weights(model):
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    n_params = len(list(model.parameters()))
    with quiet():
        for i in range(10):
            model.actuate(model.space.sample(i))
            model(image_batch())
    assert {p.untyped_storage().data_ptr() for p in model.parameters()} == storages
    assert len(list(model.parameters())) == n_params


def test_unregistered_subnet_warns_once_and_the_largest_does_not(model):
    cfg = model.space.min()
    with pytest.warns(UncalibratedSubnetWarning, match="has no calibrated SubnetNorm statistics"):
        model.actuate(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.actuate(cfg)
        model.actuate(model.space.max())
        subnetact.calibrate(model, [image_batch(4)], subnets=[cfg])
        model.actuate(cfg)


def test_per_call_subnets_are_thread_safe_and_leave_the_default_alone(model):
    configs = [model.space.sample(i) for i in range(4)]
    x = image_batch(2)
    with quiet(), torch.no_grad():
        expected = {cfg: model(x, subnet=cfg) for cfg in configs}
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(cfg):
        try:
            with torch.no_grad():
                for _ in range(15):
                    assert torch.equal(model(x, subnet=cfg), expected[cfg])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def actuator():
        i = 0
        while not stop.is_set():
            model.actuate(configs[i % len(configs)])
            i += 1

    threads = [threading.Thread(target=worker, args=(cfg,)) for cfg in configs]
    flipper = threading.Thread(target=actuator)
    flipper.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    flipper.join()
    assert not errors, errors[0]


def test_one_model_per_thread_with_actuate_is_also_safe():
    # The other documented pattern: each worker thread owns a converted model and actuates it.
    with quiet():
        models = [subnetact.convert(TINY_MODELS["basic"]()) for _ in range(2)]
        cfgs = [models[0].space.min(), models[0].space.sample(1)]
        x = image_batch()
        with torch.no_grad():
            expected = [models[0](x, subnet=c) for c in cfgs]
        errors = []

        def run(m):
            try:
                with torch.no_grad():
                    for i in range(10):
                        m.actuate(cfgs[i % 2])
                        assert torch.equal(m(x), expected[i % 2])
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(m,)) for m in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]


def test_training_a_subnet_updates_only_its_slice_of_the_shared_weights(model):
    model.train()
    with quiet():
        model.actuate(depth=[1, 1, 1, 1], width=0.25)
    model(image_batch(4)).sum().backward()
    conv = model.layer1[0].conv1
    k = model.export().layer1[0].conv1.out_channels
    assert conv.weight.grad[:k].abs().sum() > 0
    assert conv.weight.grad[k:].abs().sum() == 0
    assert model.layer1[1].conv1.weight.grad is None  # skipped block
    running = model.layer1[0].bn1.running_mean
    assert not torch.equal(running[:k], TINY_MODELS["basic"]().layer1[0].bn1.running_mean[:k])


def test_deepcopy_and_dtype_moves_keep_plans_valid(model):
    with quiet():
        cfg = model.actuate(model.space.sample(2))
    subnetact.calibrate(model, [image_batch(4)], subnets=[cfg])
    x = image_batch()
    with torch.no_grad():
        y = model(x)
        twin = copy.deepcopy(model)
        assert twin.active == cfg and torch.equal(twin(x), y)
        with torch.no_grad():
            next(twin.parameters()).add_(1.0)
        assert torch.equal(model(x), y)  # independent
        model.double()
        torch.testing.assert_close(model(x.double()), model.export(cfg)(x.double()))
        torch.testing.assert_close(model(x.double()).float(), y, rtol=1e-4, atol=1e-4)


@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_kept_layers_rules_keep_depth_distinct_blocks(n_depth):
    n, depth = n_depth
    for rule in RULES:
        kept = subnetact.kept_layers(n, depth, rule)
        assert len(kept) == depth and kept == sorted(set(kept)) and all(0 <= i < n for i in kept)
        assert depth == 0 or kept[0] == 0  # the first block (it may change the shape) always runs
    spread = subnetact.kept_layers(n, depth, "spread")
    if depth >= 2:
        assert spread[-1] == n - 1
        # evenly spread: each index is i * (n - 1) / (depth - 1) rounded, so within half a block of it
        assert all(abs(k - i * (n - 1) / (depth - 1)) <= 0.5 for i, k in enumerate(spread))


def test_kept_layers_by_hand():
    assert subnetact.kept_layers(12, 6, "every_other") == [0, 2, 4, 6, 8, 10]  # DynaBERT at depth 0.5
    assert subnetact.kept_layers(12, 6, "spread") == [0, 2, 4, 7, 9, 11]
    assert subnetact.kept_layers(6, 3, "spread") == [0, 3, 5]
    assert subnetact.kept_layers(6, 4, "prefix") == [0, 1, 2, 3]
