"""``subnetact.train.refit_sliced_linears`` against an independent least-squares solve (numpy's ``lstsq`` on the
stacked, weighted prefix systems), on a tiny BERT; untouched layers; bad input leaves the model unchanged."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hf_models import NO_DROPOUT, bert, ffn_for, heads_for, inputs

import subnetact
from subnetact.errors import ArgumentTypeError, ConfigError, InvalidSubnetError, NotConvertedError
from subnetact.train import Fixed, Sandwich, distill, refit_sliced_linears

# These tiny samples (about 2 tokens per input feature) draw the small-sample warning; it is tested on SmolLM2.
pytestmark = pytest.mark.filterwarnings("ignore:refit_sliced_linears:UserWarning")

FFN_DOWN = "encoder.layer.1.output.dense"
ATTN_OUT = "encoder.layer.1.attention.output.dense"


def setup():
    torch.manual_seed(0)
    model = subnetact.convert(bert(head=False, **NO_DROPOUT))
    space = model.space
    subnets = [space.max(), space.make(depth=4, heads=1.0, ffn=0.5), space.make(depth=3, heads=0.5, ffn=0.75)]
    batches = [inputs("bert", batch=4, seq=12, seed=40 + i) for i in range(4)]
    return model, subnets, batches


def captured_inputs(model, name, batches, subnet) -> np.ndarray:
    """The layer's inputs over the batches' real tokens (padding dropped), by a hook of this test: (rows, n)."""
    module = model.get_submodule(name)
    rows = []
    handle = module.register_forward_pre_hook(lambda m, a: rows.append(a[0].detach()))
    try:
        with torch.no_grad():
            for batch in batches:
                model(**batch, subnet=subnet)
    finally:
        handle.remove()
    kept = [x[b["attention_mask"].bool()] for x, b in zip(rows, batches)]
    return torch.cat(kept).double().numpy()


def stacked_lstsq(X, W0, b0, widths_weights, ridge):
    """argmin_A sum_j w_j ||[X P_j, 1] A^T - [X, 1] A0^T||^2 + delta ||A - A0||^2, as one stacked lstsq."""
    n = X.shape[1]
    A0 = np.concatenate([W0, b0[:, None]], axis=1)
    Xa = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)
    target = Xa @ A0.T
    delta = ridge * float((X * X).sum(0).mean()) * sum(w for _, w in widths_weights)
    rows, rhs = [], []
    for k, w in widths_weights:
        Xk = Xa.copy()
        Xk[:, k:n] = 0
        rows.append(np.sqrt(w) * Xk)
        rhs.append(np.sqrt(w) * target)
    rows.append(np.sqrt(delta) * np.eye(n + 1))
    rhs.append(np.sqrt(delta) * A0.T)
    A = np.linalg.lstsq(np.concatenate(rows), np.concatenate(rhs), rcond=None)[0].T
    return A[:, :n], A[:, n]


@pytest.mark.parametrize("ridge", [1e-2, 1e-1])
def test_refit_matches_a_stacked_least_squares_solve(ridge):
    model, subnets, batches = setup()
    weights = [3.0, 1.0, 0.5]
    before = {
        name: (m.weight.detach().double().numpy().copy(), m.bias.detach().double().numpy().copy())
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    }
    X = {name: captured_inputs(model, name, batches, subnets[0]) for name in (FFN_DOWN, ATTN_OUT)}

    result = refit_sliced_linears(model, subnets, batches, weights=weights, ridge=ridge)

    per_config = {
        FFN_DOWN: [(64, 3.0), (ffn_for(0.5), 1.0), (ffn_for(0.75), 0.5)],
        ATTN_OUT: [(48, 3.0), (48, 1.0), (heads_for(0.5) * 12, 0.5)],  # 4 heads of 12
    }
    for name, uses in per_config.items():
        W, b = stacked_lstsq(X[name], *before[name], uses, ridge)
        layer = model.get_submodule(name)
        np.testing.assert_allclose(layer.weight.detach().double().numpy(), W, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(layer.bias.detach().double().numpy(), b, rtol=1e-4, atol=1e-5)
        assert result.layers[name].widths == tuple(sorted({k for k, _ in uses}))
    assert result.rows == sum(int(b["attention_mask"].sum()) for b in batches)


def test_the_reported_errors_are_the_prefix_output_errors():
    model, subnets, batches = setup()
    X = captured_inputs(model, FFN_DOWN, batches, subnets[0])
    layer = model.get_submodule(FFN_DOWN)
    W0, b0 = layer.weight.detach().double().numpy().copy(), layer.bias.detach().double().numpy().copy()
    y = X @ W0.T + b0

    def error(W, b, k):  # relative error of the first k features' output, by hand
        yk = X[:, :k] @ W[:, :k].T + b
        return ((yk - y) ** 2).sum() / (y**2).sum()

    result = refit_sliced_linears(model, subnets, batches, weights=[1.0, 1.0, 1.0]).layers[FFN_DOWN]
    W1, b1 = layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy()
    for k, e0, e1 in zip(result.widths, result.error_before, result.error_after):
        assert e0 == pytest.approx(error(W0, b0, k), rel=1e-6, abs=1e-12)
        assert e1 == pytest.approx(error(W1, b1, k), rel=1e-4, abs=1e-9)
    assert result.error_after[0] < 0.8 * result.error_before[0]  # the smallest prefix gains most
    assert sum(result.error_after) < sum(result.error_before)


def test_layers_no_subnet_slices_are_untouched():
    model, subnets, batches = setup()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = refit_sliced_linears(model, subnets[:2], batches)  # heads stay 1.0: attention outputs not sliced
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, state[k])}
    expected = {f"encoder.layer.{i}.output.dense.{p}" for i in range(4) for p in ("weight", "bias")}
    assert changed == expected
    assert set(result.layers) == {f"encoder.layer.{i}.output.dense" for i in range(4)}


def test_the_refit_serves_from_the_new_weights():
    model, subnets, batches = setup()
    small = subnets[1]
    with torch.no_grad():
        old = model(**batches[0], subnet=small).last_hidden_state
    refit_sliced_linears(model, subnets, batches)
    with torch.no_grad():
        new = model(**batches[0], subnet=small).last_hidden_state
        dense = subnetact.export(model, small)(**batches[0]).last_hidden_state  # compiled plans were dropped
    assert not torch.allclose(old, new)
    mask = batches[0]["attention_mask"].bool()
    torch.testing.assert_close(new[mask], dense[mask], rtol=1e-4, atol=1e-4)


def test_bad_input_is_refused_and_the_model_is_unchanged():
    model, subnets, batches = setup()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cases = [
        (ConfigError, "subnets=", dict(subnets=[])),
        (ArgumentTypeError, r"subnets\[1\]", dict(subnets=[subnets[0], "small"])),
        (InvalidSubnetError, "ffn", dict(subnets=[subnets[0], model.space.max().replace(ffn=[0.3] * 4)])),
        (ConfigError, "weights=", dict(weights=[1.0, 1.0])),
        (ConfigError, "weights=", dict(weights=[1.0, -1.0, 1.0])),
        (ConfigError, "weights=", dict(weights=[0, 0, 0])),
        (ConfigError, "ridge=", dict(ridge=-1.0)),
        (ConfigError, "batches is empty", dict(batches=[])),
    ]
    for error, match, kwargs in cases:
        args = {"subnets": subnets, "batches": batches, **kwargs}
        with pytest.raises(error, match=match):
            refit_sliced_linears(model, args.pop("subnets"), args.pop("batches"), **args)
        for k, v in model.state_dict().items():
            assert torch.equal(v, state[k]), (kwargs, k)
    with pytest.raises(NotConvertedError):
        refit_sliced_linears(bert(head=False), subnets, batches)


def test_distill_refit_batches_is_reorder_then_refit_then_training(tmp_path):
    # The reference is the recipe written out: reorder, refit on the first batches, then distill without reordering
    # from the model as it was before both (distill's frozen copy is taken before it reorders and refits).
    model, subnets, batches = setup()
    manual = copy.deepcopy(model)
    teacher = copy.deepcopy(model)
    weights = (4.0, 1.0, 2.0)
    result = distill(
        model, batches, torch.optim.SGD(model.parameters(), lr=0.05), steps=2,
        schedule=Fixed(subnets, weights=weights), reorder_batches=2, refit_batches=3, seed=1,
    )  # fmt: skip
    subnetact.reorder(manual, batches[:2], score="activation")
    reordered_only = copy.deepcopy(manual.state_dict())
    want = refit_sliced_linears(manual, subnets, batches[:3], weights=weights)
    distill(
        manual, batches, torch.optim.SGD(manual.parameters(), lr=0.05), steps=2,
        schedule=Fixed(subnets, weights=weights), reorder=False, teacher=teacher, seed=1,
    )  # fmt: skip
    assert result.refit is not None and result.refit.layers.keys() == want.layers.keys() and want.layers
    assert result.refit.rows == want.rows
    for name, value in manual.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    assert not torch.equal(reordered_only[FFN_DOWN + ".weight"], manual.state_dict()[FFN_DOWN + ".weight"])

    # Resuming does not refit again: the checkpoint holds the refit weights.
    straight, _, _ = setup()
    run = dict(schedule=Fixed(subnets, weights=weights), reorder_batches=2, refit_batches=3, seed=1)
    distill(straight, batches, torch.optim.SGD(straight.parameters(), lr=0.05), steps=3, **run)
    first, _, _ = setup()
    distill(first, batches, torch.optim.SGD(first.parameters(), lr=0.05), steps=2, checkpoint_dir=tmp_path, **run)
    resumed, _, _ = setup()
    opt = torch.optim.SGD(resumed.parameters(), lr=0.05)
    distill(resumed, batches, opt, steps=3, resume=tmp_path, **run)
    for name, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"refit_batches": -1}, "refit_batches=-1 must be an int >= 0"),
        ({"refit_batches": True}, "refit_batches=True must be an int >= 0"),
        ({"refit_batches": 2, "schedule": Sandwich()}, "refit_batches=2 needs a Fixed schedule"),
    ],
)
def test_distill_refuses_bad_refit_batches_before_changing_anything(kwargs, match):
    model, subnets, batches = setup()
    before = copy.deepcopy(model.state_dict())
    kwargs = {"schedule": Fixed(subnets), **kwargs}
    with pytest.raises(ConfigError, match=match):
        distill(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), steps=1, **kwargs)
    for name, value in before.items():
        assert torch.equal(model.state_dict()[name], value)
