"""``subnetact.reorder``: importance order of heads and FFN neurons, function of the full model unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_models import HEADS, LAYERS, inputs, main_output, make

import subnetact


def labelled(name: str, n: int = 2) -> list[dict]:
    out = []
    for s in range(n):
        x = inputs(name, batch=3, seq=10, mask="padded" if name != "vit" else "none", seed=10 + s)
        x["labels"] = torch.tensor([0, 1, 0]) if name != "vit" else torch.tensor([0, 1, 2])
        out.append(x)
    return out


@pytest.mark.parametrize("name", ["bert", "roberta", "vit"])
@pytest.mark.parametrize("score", ["taylor", "l1", "activation"])
@pytest.mark.parametrize("convert_first", [False, True])
def test_full_model_function_unchanged(name, score, convert_first):
    model = make(name).double()
    reference = copy.deepcopy(model)
    if convert_first:
        model = subnetact.convert(model)
    result = subnetact.reorder(model, labelled(name), score=score)
    assert not all(torch.equal(o, torch.arange(HEADS)) for o in result.head_order)  # something moved
    x = inputs(name, mask="padded" if name != "vit" else "none", seed=99)
    with torch.no_grad():
        got, want = main_output(model(**x)), main_output(reference(**x))
    keep = x.get("attention_mask")
    if keep is not None and got.dim() == 3:
        got, want = got[keep.bool()], want[keep.bool()]
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)  # float64: only summation order changes
    assert model.training is False and all(not m.training for m in model.modules())


def test_fp32_full_width_identical_to_tolerance_and_order_is_by_score():
    model = make("bert")
    reference = copy.deepcopy(model)
    result = subnetact.reorder(model, labelled("bert"))
    x = inputs("bert", seed=5)
    with torch.no_grad():
        torch.testing.assert_close(model(**x).logits, reference(**x).logits, atol=1e-5, rtol=0)
    for order, scores in zip(result.head_order, result.head_importance):
        assert torch.all(scores[order][:-1] >= scores[order][1:])  # decreasing
    # a second reordering finds the order already sorted (scores of the permuted model follow it)
    again = subnetact.reorder(model, labelled("bert"))
    for scores in again.head_importance:
        torch.testing.assert_close(scores, scores.sort(descending=True).values, atol=1e-6 * scores.max(), rtol=0)


@pytest.mark.parametrize("score", ["taylor", "l1", "activation"])
def test_small_subnets_keep_the_important_heads_and_neurons(score):
    # Make heads 0-1 and FFN neurons 0-31 of every layer useless (their output weights are zero): before
    # reordering, width 0.5 keeps exactly the useless ones; afterwards, the useful ones.
    torch.manual_seed(0)
    model = make("bert")
    for layer in model.bert.encoder.layer:
        with torch.no_grad():
            layer.attention.output.dense.weight[:, : 2 * 12] = 0
            layer.output.dense.weight[:, :32] = 0
    model = subnetact.convert(model)
    x = inputs("bert", seed=3)
    half = model.space.make(depth=LAYERS, width=0.5)
    with torch.no_grad():
        full = model(**x).logits
        before = (model(**x, subnet=half).logits - full).abs().max()
    result = subnetact.reorder(model, labelled("bert"), score=score)
    with torch.no_grad():
        after = (model(**x, subnet=half).logits - full).abs().max()
    assert after < 1e-5 < before
    for order in result.head_order:
        assert sorted(order[:2].tolist()) == [2, 3]
    for order in result.ffn_order:
        assert set(order[:32].tolist()) == set(range(32, 64))


def test_invalid_arguments_leave_the_model_unchanged():
    model = make("bert")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"score='grad' is not one of \('taylor', 'l1', 'activation'\)"):
        subnetact.reorder(model, labelled("bert"), score="grad")
    with pytest.raises(ValueError, match="batches=None: score='taylor' needs data"):
        subnetact.reorder(model)
    with pytest.raises(ValueError, match="batches is empty"):
        subnetact.reorder(model, [])
    unlabelled = [inputs("bert")]
    with pytest.raises(ValueError, match=r"needs a scalar loss per batch, got NoneType: pass labels"):
        subnetact.reorder(model, unlabelled)
    with pytest.raises(ValueError, match="loss_fn=3 must be a callable"):
        subnetact.reorder(model, unlabelled, loss_fn=3)
    with pytest.raises(subnetact.UnsupportedModelError, match="reorder does not know Linear"):
        subnetact.reorder(torch.nn.Linear(2, 2), score="l1")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert all(p.grad is None for p in model.parameters())


def test_custom_loss_and_unlabelled_data():
    model = make("bert", head=False)
    reference = copy.deepcopy(model)
    batches = [inputs("bert", seed=s) for s in range(2)]
    subnetact.reorder(model, batches, loss_fn=lambda out, batch: out.last_hidden_state.pow(2).mean())
    x = inputs("bert", mask="none")
    with torch.no_grad():
        torch.testing.assert_close(model(**x).last_hidden_state, reference(**x).last_hidden_state, atol=1e-5, rtol=0)


def test_activation_score_is_each_units_contribution_norm():
    # Independent reference: capture the inputs of the output projection and of fc2, then compute by hand the L2 norm
    # (over the non-padding tokens) of what each head / neuron adds to the layer's output.
    torch.manual_seed(0)
    model = make("bert").double()
    batches = [inputs("bert", batch=3, seq=10, seed=20 + s) for s in range(2)]
    captured: dict[str, list[torch.Tensor]] = {"out": [], "fc2": []}
    layer = model.bert.encoder.layer[1]
    hooks = [
        layer.attention.output.dense.register_forward_pre_hook(lambda m, a: captured["out"].append(a[0].detach())),
        layer.output.dense.register_forward_pre_hook(lambda m, a: captured["fc2"].append(a[0].detach())),
    ]
    with torch.no_grad():
        for b in batches:
            model(**b)
    for h in hooks:
        h.remove()
    d = 48 // HEADS
    w_out, w2 = layer.attention.output.dense.weight.detach(), layer.output.dense.weight.detach()
    head_ref, ffn_ref = torch.zeros(HEADS, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)
    for b, x, a in zip(batches, captured["out"], captured["fc2"]):
        keep = b["attention_mask"].bool()
        for h in range(HEADS):
            contribution = x[keep][:, h * d : (h + 1) * d] @ w_out[:, h * d : (h + 1) * d].T  # (tokens, hidden)
            head_ref[h] += contribution.square().sum()
        for j in range(64):
            ffn_ref[j] += torch.outer(a[keep][:, j], w2[:, j]).square().sum()
    result = subnetact.reorder(model, batches, score="activation")
    torch.testing.assert_close(result.head_importance[1], head_ref.sqrt(), rtol=1e-9, atol=0)
    torch.testing.assert_close(result.ffn_importance[1], ffn_ref.sqrt(), rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="score='activation' needs data"):
        subnetact.reorder(model, score="activation")
