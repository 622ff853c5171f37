"""subnetact.train: the sandwich rule, in-place distillation from the largest subnet, training and calibration."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from e2e_models import blobs, tiny_digits

from subnetact.train import StepResult, distillation_loss, sandwich_step, train_supernet


def test_distillation_loss_is_soft_cross_entropy_times_t_squared():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 10, generator=g, requires_grad=True), torch.randn(5, 10, generator=g, requires_grad=True)
    for temp in (1.0, 2.5):
        expected = -(F.softmax(t / temp, -1) * F.log_softmax(s / temp, -1)).sum(-1).mean() * temp**2
        torch.testing.assert_close(distillation_loss(s, t, temp), expected)
    distillation_loss(s, t).backward()
    assert s.grad is not None and t.grad is None  # no gradient reaches the teacher
    # at its minimum (student == teacher) the loss is the teacher's entropy
    p = F.softmax(t.detach(), -1)
    torch.testing.assert_close(distillation_loss(t.detach(), t), -(p * p.log()).sum(-1).mean())


def test_sandwich_step_order_and_distillation_target_is_the_largest_subnet():
    model = tiny_digits()
    x, y = blobs(32)
    # lr=0: the step changes no weight, so every loss can be recomputed independently afterwards.
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    result = sandwich_step(model, opt, x, y, num_random=2, rng=random.Random(3))
    assert isinstance(result, StepResult)
    space = model.space
    rng = random.Random(3)
    assert result.subnets == (space.max(), space.min(), space.sample(rng), space.sample(rng))
    model.train()
    with torch.no_grad():
        teacher = model(x, subnet=space.max())
        assert result.losses[0] == pytest.approx(float(F.cross_entropy(teacher, y)), rel=1e-5)
        for cfg, loss in zip(result.subnets[1:], result.losses[1:]):
            student = model(x, subnet=cfg)
            assert loss == pytest.approx(float(distillation_loss(student, teacher)), rel=1e-5)
            # ... and not the label loss: the target really is the teacher
            assert loss != pytest.approx(float(F.cross_entropy(student, y)), rel=1e-3)
    assert result.loss == pytest.approx(sum(result.losses))
    # every subnet's gradient reached the shared weights (stem runs in every subnet)
    assert model.stem[0].weight.grad is not None and model.stem[0].weight.grad.abs().sum() > 0


def test_sandwich_step_mixes_label_loss_when_distill_weight_below_one():
    model = tiny_digits()
    x, y = blobs(16)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    r = sandwich_step(model, opt, x, y, num_random=0, rng=0, distill_weight=0.25, temperature=2.0)
    with torch.no_grad():
        teacher, student = model(x, subnet=model.space.max()), model(x, subnet=model.space.min())
        expected = 0.25 * distillation_loss(student, teacher, 2.0) + 0.75 * F.cross_entropy(student, y)
    assert r.subnets == (model.space.max(), model.space.min())
    assert r.losses[1] == pytest.approx(float(expected), rel=1e-5)


def test_training_decreases_loss_and_calibrates_the_served_set():
    model = tiny_digits(widths=(8, 16, 16))
    x, y = blobs(256)
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 256, 32)]
    served = [model.space.min(), model.space.make(depth=[2, 2, 1], width=0.5), model.space.max()]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    seen = []
    history = train_supernet(
        model, batches, opt, epochs=6, served=served, calibration_batches=[x], on_epoch=lambda e, loss: seen.append(e)
    )
    assert seen == list(range(6)) and len(history) == 6
    assert history[-1] < 0.5 * history[0]
    assert list(model.registered_subnets) == served and not model.training
    xt, yt = blobs(256, seed=1)
    with torch.no_grad():
        for cfg in served:
            acc = (model(xt, subnet=cfg).argmax(1) == yt).float().mean()
            assert acc > 0.9, (cfg, acc)


def test_train_supernet_per_epoch_batches_and_deterministic():
    def run():
        model = tiny_digits(seed=1)
        x, y = blobs(64)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        return train_supernet(model, lambda epoch: [(x[epoch::2], y[epoch::2])], opt, epochs=2, seed=5)

    assert run() == run()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epochs": 0}, r"epochs=0 must be an int >= 1"),
        ({"epochs": 1, "served": []}, r"served= needs calibration_batches="),
        ({"epochs": 1, "num_random": -1}, r"num_random=-1 must be an int >= 0"),
        ({"epochs": 1, "distill_weight": 1.5}, r"distill_weight=1.5 must be in \[0, 1\]"),
        ({"epochs": 1, "temperature": 0}, r"temperature=0 must be > 0"),
    ],
)
def test_train_errors(kwargs, match):
    model = tiny_digits()
    x, y = blobs(8)
    with pytest.raises(ValueError, match=match):
        train_supernet(model, [(x, y)], torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_train_refuses_empty_batches_and_unconverted_models():
    model = tiny_digits()
    with pytest.raises(ValueError, match="batches yielded no batch"):
        train_supernet(model, [], torch.optim.SGD(model.parameters(), lr=0.1), epochs=1)
    plain = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="not a converted supernet"):
        sandwich_step(plain, torch.optim.SGD(plain.parameters(), lr=0.1), torch.randn(1, 2), torch.tensor([0]))
