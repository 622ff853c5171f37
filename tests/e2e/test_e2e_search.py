"""subnetact.search: FLOPs model vs counted MACs, Pareto front vs brute force, evolution, predictor, errors."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from e2e_models import tiny_digits
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import subnetact
from subnetact.search import (
    AccuracyPredictor,
    Candidate,
    FlopsModel,
    calibrated_evaluator,
    evolution,
    pareto_front,
    search,
)

pytestmark = pytest.mark.filterwarnings("ignore::subnetact.UncalibratedSubnetWarning")


def counted_macs(module: nn.Module, x: torch.Tensor) -> int:
    """Multiply-accumulates of conv/linear layers in one forward of a plain module, by forward hooks."""
    total = [0]

    def hook(m, args, out):
        if isinstance(m, nn.Conv2d):
            total[0] += out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        else:
            total[0] += out.numel() * m.in_features

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        module(x)
    for h in handles:
        h.remove()
    return total[0] // x.shape[0]


def _models():
    models = {"digits": (lambda: tiny_digits(widths=(8, 12, 16)), torch.randn(1, 1, 8, 8))}
    try:
        from tiny_models import tiny_bottleneck, tiny_resnext

        x = torch.randn(1, 3, 32, 32)
        models["bottleneck"] = (lambda: subnetact.convert(tiny_bottleneck()), x)
        models["resnext"] = (lambda: subnetact.convert(tiny_resnext()), x)  # grouped convolutions
    except ImportError:  # torchvision missing
        pass
    return models


@pytest.mark.parametrize("name", sorted(_models()))
def test_flops_model_matches_macs_of_the_exported_subnet(name):
    build, x = _models()[name]
    model = build()
    flops = FlopsModel(model, x)
    rng = random.Random(0)
    configs = [model.space.min(), model.space.max(), *(model.space.sample(rng) for _ in range(8))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cfg in configs:
            assert flops(cfg) == counted_macs(model.export(cfg).eval(), x), cfg
    assert flops(model.space.min()) < flops(model.space.max())


def test_flops_model_is_per_sample():
    model = tiny_digits()
    assert FlopsModel(model, torch.randn(4, 1, 8, 8))(model.space.max()) == FlopsModel(model, torch.randn(1, 1, 8, 8))(
        model.space.max()
    )


def _brute_front(points):
    return sorted(
        {(c, a) for c, a in points if not any((c2 <= c and a2 > a) or (c2 < c and a2 >= a) for c2, a2 in points)}
    )


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=40))
def test_pareto_front_matches_the_definition(points):
    cfg = subnetact.SubnetConfig(depth=[1])
    front = pareto_front([Candidate(float(c), float(a), cfg) for c, a in points])
    assert [(f.cost, f.accuracy) for f in front] == [(float(c), float(a)) for c, a in _brute_front(points)]


def _small_space_model():
    # depth choices (1, 2) per stage, width (0.5, 1.0) on 6 blocks: 8 * 64 = 512 subnets
    return tiny_digits(blocks=(2, 2, 2), widths=(4, 8, 8), width_choices=(0.5, 1.0))


def _synthetic_accuracy(model):
    """A deterministic accuracy: diminishing returns in FLOPs plus a random effect per (block, width) choice, so
    that the front is irregular and equal-FLOPs subnets differ (like real accuracy, it is additive-ish and smooth)."""
    flops = FlopsModel(model, torch.randn(1, 1, 8, 8))
    top = flops(model.space.max())
    rng = random.Random(7)
    effect = {(i, w): rng.uniform(-0.6, 0.6) for i, e in enumerate(model.space.entries("width")) for w in e.choices}
    blocks = model.blocks

    def acc(cfg):
        bonus, start = 0.0, 0
        for n, d in zip(blocks, cfg.depth):  # only the blocks the depth keeps count
            bonus += sum(effect[(i, cfg.width[i])] for i in range(start, start + d))
            start += n
        return round(90 + 8 * (flops(cfg) / top) ** 0.5 + bonus, 4)

    return acc


@pytest.mark.parametrize("seed", [0, 1])
def test_search_finds_the_brute_force_pareto_front(seed):
    model = _small_space_model()
    assert model.space.size == 512
    acc = _synthetic_accuracy(model)
    flops = FlopsModel(model, torch.randn(1, 1, 8, 8))
    brute = _brute_front([(flops(c), acc(c)) for c in model.space.enumerate()])
    result = search(
        model,
        evaluate=acc,
        example_input=torch.randn(1, 1, 8, 8),
        population=16,
        generations=15,
        num_constraints=8,
        seed=seed,
    )
    assert [(c.cost, c.accuracy) for c in result.pareto] == brute
    assert result.configs == [c.config for c in result.pareto]
    assert all(c in model.space for c in result.configs)
    assert result.accuracy_calls == len(result.evaluated) < model.space.size  # it did not just enumerate
    assert result.constraints[-1] == flops(model.space.max())


def test_search_with_predictor_is_deterministic_and_non_dominated():
    model = tiny_digits(widths=(8, 12, 16))  # 4 * 4**5... a space too big to enumerate quickly
    acc = _synthetic_accuracy(model)
    kwargs = dict(evaluate=acc, num_samples=60, example_input=torch.randn(1, 1, 8, 8), population=20, generations=10)
    a, b = search(model, seed=1, **kwargs), search(model, seed=1, **kwargs)
    assert [c.config for c in a.pareto] == [c.config for c in b.pareto]
    assert len(a.pareto) >= 3
    costs, accs = [c.cost for c in a.pareto], [c.accuracy for c in a.pareto]
    assert costs == sorted(costs) and accs == sorted(accs) and len(set(accs)) == len(accs)
    for c in a.pareto:  # final accuracies are the evaluator's, not the predictor's
        assert c.accuracy == acc(c.config) and not c.predicted
    evaluated = {(c.cost, c.accuracy) for c in a.evaluated}
    for c in a.pareto:
        assert not any(e[0] <= c.cost and e[1] > c.accuracy for e in evaluated)


def test_accuracy_predictor_learns_a_simple_function():
    model = tiny_digits()
    space = model.space
    rng = random.Random(0)
    configs = list(dict.fromkeys(space.sample(rng) for _ in range(200)))

    def truth(cfg):
        return 80 + 5 * sum(cfg.width) / len(cfg.width) + 2 * sum(cfg.depth)

    pred = AccuracyPredictor(space, epochs=400).fit(configs[:150], [truth(c) for c in configs[:150]])
    errors = [abs(p - truth(c)) for p, c in zip(pred.predict(configs[150:]), configs[150:])]
    assert sum(errors) / len(errors) < 0.5
    with pytest.raises(RuntimeError, match="before fit"):
        AccuracyPredictor(space).predict(configs)


def test_evolution_respects_the_constraint():
    model = tiny_digits()
    flops = FlopsModel(model, torch.randn(1, 1, 8, 8))
    limit = 0.5 * (flops(model.space.min()) + flops(model.space.max()))
    final = evolution(
        model.space,
        lambda cs: [flops(c) for c in cs],  # "accuracy" = FLOPs: the best feasible subnet hugs the limit
        flops,
        limit,
        population=20,
        generations=15,
        rng=random.Random(0),
    )
    assert all(flops(c) <= limit for c, _ in final)
    assert final[0][1] > 0.9 * limit
    with pytest.raises(ValueError, match="no subnet with cost <= constraint"):
        evolution(
            model.space,
            lambda cs: [0.0] * len(cs),
            flops,
            -1.0,
            population=2,
            generations=0,
            rng=random.Random(0),
            max_tries=5,
        )


def test_calibrated_evaluator_calibrates_a_copy():
    model = tiny_digits()
    seen = []

    def evaluate(m, cfg):
        assert m is not model and m.registered_subnets == (cfg,)
        seen.append(cfg)
        return 1.0

    ev = calibrated_evaluator(model, [torch.randn(8, 1, 8, 8)], evaluate)
    assert ev(model.space.min()) == 1.0 and ev(model.space.min()) == 1.0  # cached
    assert seen == [model.space.min()] and model.registered_subnets == ()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, r"search needs evaluate="),
        ({"evaluate": len, "cost": "flops"}, r'cost="flops" needs example_input='),
        ({"evaluate": len, "cost": "latency"}, r"cost='latency' must be \"flops\" or a callable"),
        ({"evaluate": len, "population": 1}, r"population=1 must be an int >= 2"),
        ({"evaluate": len, "num_constraints": 0}, r"num_constraints=0 must be an int >= 1"),
        ({"evaluate": len, "parent_ratio": 0.0}, r"parent_ratio=0.0 must be in \(0, 1\)"),
        ({"evaluate": len, "parent_ratio": 0.6, "mutation_ratio": 0.6}, r"parent_ratio \+ mutation_ratio"),
        ({"evaluate": len, "mutate_prob": 2}, r"mutate_prob=2 must be in \[0, 1\]"),
    ],
)
def test_search_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        search(tiny_digits(), **kwargs)


def test_measured_latency_cost_is_positive_and_cached(monkeypatch):
    from subnetact import profiler

    model = tiny_digits()
    calls = []
    real = profiler.profile

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(profiler, "profile", counting)
    cost = subnetact.search.measured_latency(model, torch.randn(1, 1, 8, 8), batch_size=4, warmup=1, repeats=3)
    a = cost(model.space.min())
    assert a > 0 and cost(model.space.min()) == a and len(calls) == 1
    assert cost(model.space.max()) > 0 and len(calls) == 2
