"""The weight cache (issue 16): copies of registered subnets' strided conv slices, their budget, eviction and
invalidation, and the unfold + GEMM path; every output checked against the exported dense subnet."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F
from tiny_models import TINY_MODELS, image_batch

import subnetact
from subnetact import weight_slice
from subnetact.weight_cache import WeightCacheInfo, default_budget_bytes


def served_model(name: str = "bottleneck"):
    """A converted tiny model with three registered subnets (each slices conv inputs, so each has copies)."""
    model = subnetact.convert(TINY_MODELS[name]())
    entries = model.space.entries("depth")
    subnets = [
        model.space.make(depth=[e.choices[round(t * (len(e.choices) - 1))] for e in entries], width=w)
        for t, w in ((0.0, 0.25), (0.5, 0.5), (1.0, 0.75))
    ]
    subnetact.calibrate(model, [image_batch(4)], subnets=subnets)
    return model.eval(), subnets


def run(model, cfg, x):
    model.actuate(cfg)
    with torch.inference_mode():
        return model(x)


def reference(model, cfg, x):
    with torch.inference_mode():
        return model.export(cfg).eval()(x)


def copies(model) -> list[torch.Tensor]:
    return [c[0] for op in model._subnetact.ops for c in (op.weight_copies or {}).values()]


@pytest.mark.parametrize(
    "name, budget, unfold_rows, pointwise_min",
    [
        ("basic", None, weight_slice.UNFOLD_MAX_ROWS, weight_slice.POINTWISE_MIN_ELEMENTS),
        ("bottleneck", None, weight_slice.UNFOLD_MAX_ROWS, weight_slice.POINTWISE_MIN_ELEMENTS),
        ("resnext", None, weight_slice.UNFOLD_MAX_ROWS, weight_slice.POINTWISE_MIN_ELEMENTS),
        ("bottleneck", 0, 0, 0),
        ("bottleneck", 0, 10**9, 0),
        ("basic", 1000, 0, 0),
        ("bottleneck", 1000, 10**9, 0),
        ("bottleneck", None, 0, 0),
    ],
)
def test_every_path_matches_the_exported_subnet(name, budget, unfold_rows, pointwise_min, monkeypatch):
    # budget 0: views (or unfold + GEMM); 1000 MB: every slice copied; default: some. unfold_rows=0 never takes
    # the unfold path, 10**9 always (where no copy is held). pointwise_min=0 copies 1x1 slices too (the tiny
    # models' are all below the real threshold), run as convolutions on the copy.
    monkeypatch.setattr(weight_slice, "UNFOLD_MAX_ROWS", unfold_rows)
    monkeypatch.setattr(weight_slice, "POINTWISE_MIN_ELEMENTS", pointwise_min)
    model, subnets = served_model(name)
    model.set_weight_cache(budget)
    x = image_batch(3)
    for cfg in subnets * 2:
        torch.testing.assert_close(run(model, cfg, x), reference(model, cfg, x), rtol=1e-4, atol=1e-5)
    info = model.weight_cache_info()
    assert info.used_bytes <= info.budget_bytes
    if budget == 0:
        assert info.used_bytes == 0 and copies(model) == []
    if name == "bottleneck" and budget == 1000 and pointwise_min == 0:  # every slice copied, 1x1 ones included
        assert any(t.shape[2:] == (1, 1) for t in copies(model))


def test_copies_are_contiguous_slices_of_the_weight_and_fill_only_for_registered_subnets():
    model, subnets = served_model()
    model.set_weight_cache(1000)
    x = image_batch(2)
    unregistered = model.space.make(depth=list(subnets[2].depth), width=0.25)
    run(model, unregistered, x)
    assert model.weight_cache_info() == WeightCacheInfo(10**9, 0, (), 0)
    run(model, subnets[0], x)
    info = model.weight_cache_info()
    assert info.subnets == (subnets[0],) and info.copies > 0
    weights = {p.data_ptr() for p in model.parameters()}
    held = copies(model)
    assert len(held) == info.copies and info.used_bytes == sum(t.numel() * t.element_size() for t in held)
    for op in model._subnetact.ops:
        for (k_out, k_in), (t, *_) in (op.weight_copies or {}).items():
            assert t.is_contiguous() and t.data_ptr() not in weights
            assert torch.equal(t, op.weight[:k_out, :k_in])


def test_actuate_alone_copies_nothing_the_first_forward_does():
    model, subnets = served_model()
    model.set_weight_cache(1000)
    model.actuate(subnets[1])
    assert model.weight_cache_info().used_bytes == 0
    with torch.no_grad():
        model(image_batch(1))
    assert model.weight_cache_info().subnets == (subnets[1],)


def test_budget_evicts_the_least_recently_run_subnet_and_shares_equal_slices():
    model, subnets = served_model()
    x = image_batch(1)
    model.set_weight_cache(1000)
    sizes = {}
    for cfg in subnets:  # each subnet's own bytes, measured alone (on a copy: the model's run counts stay zero)
        alone = copy.deepcopy(model)
        run(alone, cfg, x)
        sizes[cfg] = alone.weight_cache_info().used_bytes
    a, b, c = subnets
    # Room for a and b but not c on top: running c evicts a (least recently run), not b.
    model.set_weight_cache((sizes[a] + sizes[b] + sizes[c] - 1) / 1e6)
    for cfg in (a, b):
        run(model, cfg, x)
    assert model.weight_cache_info().subnets == (a, b)
    run(model, a, x)  # a is now the most recent
    assert model.weight_cache_info().subnets == (b, a)
    before = model.weight_cache_info()
    # c's first run: making room would evict b, which ran since c's previous forward (c never ran); the recency
    # guard refuses and c runs on the views, still exactly.
    torch.testing.assert_close(run(model, c, x), reference(model, c, x), rtol=1e-4, atol=1e-5)
    assert model.weight_cache_info() == before
    # c's second run in a row: nothing ran in between, so c evicts b (the least recently run), not a.
    run(model, c, x)
    info = model.weight_cache_info()
    assert info.subnets == (a, c) and info.used_bytes <= info.budget_bytes
    assert before.copied_bytes < info.copied_bytes <= before.copied_bytes + sizes[c]
    # Shrinking the budget evicts now, least recent first.
    model.set_weight_cache(sizes[c] / 1e6)
    assert model.weight_cache_info().subnets == (c,)
    model.set_weight_cache(0)
    assert model.weight_cache_info().used_bytes == 0 and copies(model) == []


def test_a_round_robin_over_more_subnets_than_the_budget_holds_stops_copying():
    # Issue 16: least-recently-run eviction alone re-copied a subnet on every switch of a round-robin.
    model, subnets = served_model()
    x = image_batch(1)
    model.set_weight_cache(1000)
    for cfg in subnets:
        run(model, cfg, x)
    everything = model.weight_cache_info().used_bytes
    model.set_weight_cache(0)
    model.set_weight_cache(everything * 0.6 / 1e6)
    refs = {cfg: reference(model, cfg, x) for cfg in subnets}
    for cfg in subnets * 2:
        torch.testing.assert_close(run(model, cfg, x), refs[cfg], rtol=1e-4, atol=1e-5)
    settled = model.weight_cache_info()
    assert 0 < settled.used_bytes <= settled.budget_bytes
    for cfg in subnets * 20:
        torch.testing.assert_close(run(model, cfg, x), refs[cfg], rtol=1e-4, atol=1e-5)
    info = model.weight_cache_info()
    assert info.copied_bytes == settled.copied_bytes and set(info.subnets) == set(settled.subnets)


def test_a_subnet_run_twice_in_a_row_takes_over_from_one_that_stopped():
    model, subnets = served_model()
    x = image_batch(1)
    a, b, c = subnets
    model.set_weight_cache(1000)
    run(model, c, x)
    room = model.weight_cache_info().used_bytes
    model.set_weight_cache(0)
    model.set_weight_cache(room / 1e6)  # room for c's copies (the largest subnet), not for every subnet's
    for _ in range(5):
        run(model, c, x)
    assert model.weight_cache_info().subnets == (c,)
    run(model, a, x)  # c ran since a's previous forward (a never ran): refused
    assert model.weight_cache_info().subnets == (c,)
    run(model, c, x)
    run(model, a, x)  # c ran since a's previous forward: refused again (alternating subnets keep what is copied)
    assert model.weight_cache_info().subnets == (c,)
    run(model, a, x)  # the mix moved to a: nothing ran since its previous forward, so it takes c's room
    info = model.weight_cache_info()
    assert a in info.subnets and c not in info.subnets and info.used_bytes <= info.budget_bytes
    torch.testing.assert_close(run(model, a, x), reference(model, a, x), rtol=1e-4, atol=1e-5)


def test_a_budget_smaller_than_a_subnet_copies_part_of_it_and_stays_correct():
    model, subnets = served_model()
    x = image_batch(2)
    model.set_weight_cache(1000)
    run(model, subnets[2], x)
    full = model.weight_cache_info().used_bytes
    model.set_weight_cache(0)
    model.set_weight_cache(full / 2 / 1e6)
    out = run(model, subnets[2], x)
    assert 0 < model.weight_cache_info().used_bytes <= full / 2
    torch.testing.assert_close(out, reference(model, subnets[2], x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mb", [-1, float("nan"), float("inf"), True, "10", [1]])
def test_invalid_budget_is_refused_and_the_budget_kept(mb):
    model, _ = served_model()
    before = model.weight_cache_info().budget_bytes
    with pytest.raises(ValueError, match=r"set_weight_cache: mb=.* must be a finite number >= 0 \(MB\), or None"):
        model.set_weight_cache(mb)
    assert model.weight_cache_info().budget_bytes == before


def test_default_budget_is_a_fraction_of_the_operator_tensors():
    model, _ = served_model()
    tensors = {id(t): t for op in model._subnetact.ops for t in (*op.parameters(), *op.buffers())}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    assert model.weight_cache_info().budget_bytes == default_budget_bytes(model._subnetact.ops) == int(0.08 * total)
    model.set_weight_cache(3)
    model.set_weight_cache(None)
    assert model.weight_cache_info().budget_bytes == int(0.08 * total)


def test_in_place_weight_changes_are_never_served_stale():
    model, subnets = served_model()
    model.set_weight_cache(1000)
    x = image_batch(2)
    run(model, subnets[1], x)
    assert copies(model)
    # An optimiser-style in-place update under no_grad (what optimizer.step does).
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1).add_(0.01)
    torch.testing.assert_close(run(model, subnets[1], x), reference(model, subnets[1], x), rtol=1e-4, atol=1e-5)
    # A real training step, then eval: same.
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model.actuate(subnets[1])
    model(image_batch(4, seed=1)).mean().backward()
    opt.step()
    model.eval()
    torch.testing.assert_close(run(model, subnets[1], x), reference(model, subnets[1], x), rtol=1e-4, atol=1e-5)


def test_load_state_dict_calibrate_and_to_drop_the_cache():
    model, subnets = served_model()
    model.set_weight_cache(1000)
    x = image_batch(2)
    other = subnetact.convert(TINY_MODELS["bottleneck"](seed=1))
    for action in (
        lambda: model.load_state_dict(other.state_dict()),
        lambda: subnetact.calibrate(model, [image_batch(4, seed=2)], subnets=subnets),
        lambda: model.to(torch.float64),
    ):
        run(model, subnets[0], x.to(next(model.parameters()).dtype))
        assert model.weight_cache_info().used_bytes > 0
        action()
        assert model.weight_cache_info().used_bytes == 0 and copies(model) == []
        xx = x.to(next(model.parameters()).dtype)
        torch.testing.assert_close(run(model, subnets[0], xx), reference(model, subnets[0], xx), rtol=1e-4, atol=1e-5)
    assert all(t.dtype == torch.float64 for t in copies(model))


def test_training_and_autograd_use_the_shared_weight_not_copies():
    model, subnets = served_model()
    model.set_weight_cache(1000)
    x = image_batch(2)
    run(model, subnets[2], x)
    held = copies(model)
    assert held
    model.actuate(subnets[2])
    dense = model.export(subnets[2]).eval()
    # Eval mode with autograd on: gradients must reach the shared weight exactly as they reach the dense copy.
    model(x).sum().backward()
    dense(x).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), dense.named_parameters()):
        if q.grad is not None:
            sl = tuple(slice(0, n) for n in q.shape)
            torch.testing.assert_close(p.grad[sl], q.grad, rtol=1e-4, atol=1e-5, msg=name)
    # No forward with autograd on or in training mode adds copies.
    model.set_weight_cache(0)
    model.set_weight_cache(1000)
    model(x)
    model.train()
    with torch.no_grad():
        model(x)
    assert model.weight_cache_info().used_bytes == 0


def test_deepcopy_starts_with_an_empty_cache_of_the_same_budget():
    model, subnets = served_model()
    model.set_weight_cache(7)
    x = image_batch(2)
    run(model, subnets[0], x)
    clone = copy.deepcopy(model)
    assert clone.weight_cache_info() == WeightCacheInfo(7_000_000, 0, (), 0)
    torch.testing.assert_close(run(clone, subnets[0], x), reference(model, subnets[0], x), rtol=1e-4, atol=1e-5)
    assert clone.weight_cache_info().used_bytes > 0
    assert {t.data_ptr() for t in copies(clone)}.isdisjoint({t.data_ptr() for t in copies(model)})


def test_concurrent_forwards_of_different_subnets_under_a_small_budget():
    model, subnets = served_model()
    x = image_batch(2)
    refs = {cfg: reference(model, cfg, x) for cfg in subnets}
    model.set_weight_cache(0.02)  # smaller than the three subnets' copies: admissions evict each other
    errors = []

    def worker(offset: int) -> None:
        try:
            for i in range(12):
                cfg = subnets[(i + offset) % 3]
                with torch.inference_mode():
                    torch.testing.assert_close(model(x, subnet=cfg), refs[cfg], rtol=1e-4, atol=1e-5)
        except Exception as e:  # reported below, in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    info = model.weight_cache_info()
    assert info.used_bytes <= info.budget_bytes
    assert info.used_bytes == sum(t.numel() * t.element_size() for t in copies(model))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kernel_size": 3, "padding": 1},
        {"kernel_size": 3, "stride": 2, "padding": 1, "bias": True},
        {"kernel_size": (3, 1), "padding": (2, 0), "dilation": 2},
        {"kernel_size": 1, "stride": 2},
        {"kernel_size": 3, "padding": "valid"},
    ],
)
def test_unfold_gemm_equals_the_convolution(kwargs):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(12, 10, **kwargs)
    w2d = conv.weight.detach().reshape(10, -1)[:6, : 7 * conv.weight[0, 0].numel()]  # W[:6, :7] flattened
    x = torch.randn(2, 7, 5, 6)
    expected = F.conv2d(x, conv.weight[:6, :7], None if conv.bias is None else conv.bias[:6], conv.stride,
                        conv.padding, conv.dilation)  # fmt: skip
    n, _, h, w = expected.shape
    with torch.no_grad():
        bias = None if conv.bias is None else conv.bias[:6]
        got = weight_slice._unfold_conv(x, w2d, bias, conv, h, w)
    assert got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# -- the budget through convert, save and load ------------------------------------------------------------------


def registered(model):
    entries = model.space.entries("depth")
    subnets = [
        model.space.make(depth=[e.choices[round(t * (len(e.choices) - 1))] for e in entries], width=w)
        for t, w in ((0.0, 0.25), (1.0, 0.75))
    ]
    subnetact.calibrate(model, [image_batch(4)], subnets=subnets)
    return subnets


def test_convert_sets_the_budget_and_the_model_serves_like_the_exported_subnets():
    model = subnetact.convert(TINY_MODELS["bottleneck"](), weight_cache_mb=0.03).eval()
    assert model.weight_cache_info().budget_bytes == 30_000
    x = image_batch(2)
    for cfg in registered(model) * 2:
        torch.testing.assert_close(run(model, cfg, x), reference(model, cfg, x), rtol=1e-4, atol=1e-5)
    info = model.weight_cache_info()
    assert 0 < info.used_bytes <= 30_000
    off = subnetact.convert(TINY_MODELS["bottleneck"](), weight_cache_mb=0).eval()
    for cfg in registered(off):
        torch.testing.assert_close(run(off, cfg, x), reference(off, cfg, x), rtol=1e-4, atol=1e-5)
    assert off.weight_cache_info().used_bytes == 0


@pytest.mark.parametrize("mb", [-1, float("nan"), float("inf"), True, "10"])
def test_convert_refuses_a_bad_budget_and_leaves_the_model_unconverted(mb):
    model = TINY_MODELS["bottleneck"]()
    cls, modules = type(model), list(model.modules())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(subnetact.ConfigError, match=r"convert: weight_cache_mb=.* must be a finite number >= 0"):
        subnetact.convert(model, weight_cache_mb=mb)
    assert type(model) is cls and list(model.modules()) == modules
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_load_restores_the_saved_budget_or_takes_the_one_given(tmp_path):
    model = subnetact.convert(TINY_MODELS["bottleneck"](seed=1)).eval()
    subnets = registered(model)
    model.set_weight_cache(0.0123456)
    path = tmp_path / "m.safetensors"
    subnetact.save(model, path)
    x = image_batch(2)
    loaded = subnetact.load(path, lambda: TINY_MODELS["bottleneck"](seed=2)).eval()
    assert loaded.weight_cache_info().budget_bytes == 12_345
    for cfg in subnets * 2:
        torch.testing.assert_close(run(loaded, cfg, x), reference(model, cfg, x), rtol=1e-4, atol=1e-5)
    assert 0 < loaded.weight_cache_info().used_bytes <= 12_345
    for given, expected in ((0, 0), (2, 2_000_000), (None, default_budget_bytes(model._subnetact.ops))):
        into = subnetact.convert(TINY_MODELS["bottleneck"](seed=3), weight_cache_mb=7)
        assert subnetact.load(path, into, weight_cache_mb=given).weight_cache_info().budget_bytes == expected
    # A model saved with the default budget loads with the loading model's default, not a number fixed in the file.
    model.set_weight_cache(None)
    subnetact.save(model, path)
    into = subnetact.convert(TINY_MODELS["bottleneck"](seed=3), weight_cache_mb=7)
    loaded = subnetact.load(path, into)
    assert loaded.weight_cache_info().budget_bytes == default_budget_bytes(loaded._subnetact.ops)
    assert loaded._subnetact.weight_cache.default_budget


@pytest.mark.parametrize("mb", [-1, float("nan"), True, "default", [1]])
def test_load_refuses_a_bad_budget_before_touching_the_model(tmp_path, mb):
    model = subnetact.convert(TINY_MODELS["bottleneck"](seed=1))
    path = tmp_path / "m.safetensors"
    subnetact.save(model, path)
    into = subnetact.convert(TINY_MODELS["bottleneck"](seed=2), weight_cache_mb=7)
    before = {k: v.clone() for k, v in into.state_dict().items()}
    with pytest.raises(subnetact.ConfigError, match=r'load: weight_cache_mb=.* must be "saved"'):
        subnetact.load(path, into, weight_cache_mb=mb)
    assert all(torch.equal(v, into.state_dict()[k]) for k, v in before.items())
    assert into.weight_cache_info().budget_bytes == 7_000_000
