"""``subnetact.train.distill`` on a CNN: schedules, bad input, checkpoint and resume, and torchrun data parallelism."""

from __future__ import annotations

import copy
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from e2e_models import blobs, tiny_digits

import subnetact
from subnetact.train import (
    Fixed,
    ProgressiveShrinking,
    Sandwich,
    WidthThenDepth,
    distill,
    evaluate,
    load_checkpoint,
    save_checkpoint,
)

HERE = Path(__file__).resolve().parent


def images(n_batches: int = 4, batch: int = 16) -> list[torch.Tensor]:
    x, _ = blobs(n_batches * batch, seed=7)
    return list(x.split(batch))


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_schedules_pick_the_documented_subnets():
    space = tiny_digits().space
    rng = random.Random(0)
    assert Sandwich(1).subnets(space, 0, 10, rng)[:2] == [space.max(), space.min()]
    # DynaBERT: full depth at every width, then every (depth, width)
    wtd = WidthThenDepth(widths=(1.0, 0.25), depths=(1.0, 0.5), width_fraction=0.5)
    first = wtd.subnets(space, 4, 10, rng)
    assert first == [space.make(depth=space.max()["depth"], width=w) for w in (1.0, 0.25)]
    second = wtd.subnets(space, 5, 10, rng)
    assert len(second) == 4 and second[:2] == first
    half = [min(c for c in e.choices if c >= 0.5 * e.choices[-1]) for e in space.entries("depth")]
    assert second[2] == space.make(depth=half, width=1.0)
    # once-for-all: largest only, then elastic depth (width stays largest), then depth and width
    ps = ProgressiveShrinking(("depth", "width"), num_random=8)
    assert ps.subnets(space, 0, 9, rng) == [space.max()]
    depth_stage = ps.subnets(space, 3, 9, rng)
    assert all(c["width"] == space.max()["width"] for c in depth_stage)
    assert any(c["depth"] != space.max()["depth"] for c in depth_stage)
    assert any(c["width"] != space.max()["width"] for c in ps.subnets(space, 8, 9, rng))


def test_distill_a_cnn_from_its_original_with_tuple_inputs():
    # A "pretrained" model (a few supervised epochs), then distilled from its frozen copy without labels.
    model = tiny_digits(widths=(8, 16, 16))
    x, y = blobs(256)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    subnetact.train.train_supernet(model, [(x[i : i + 32], y[i : i + 32]) for i in range(0, 256, 32)], opt, epochs=3)
    original = copy.deepcopy(model).eval()
    held, unlabelled = [blobs(64, seed=3)[0]], images(8)
    half = model.space.make(depth=model.space.max()["depth"], width=0.5)

    def served(cfg, metric):  # measured as served: with the subnet's own BatchNorm statistics
        work = copy.deepcopy(model)
        subnetact.calibrate(work, unlabelled, subnets=[cfg])
        return evaluate(work, [cfg], held, metric=metric, teacher=original)[cfg]

    before = served(half, "kl")
    full_before = served(model.space.max(), "kl")
    batches = [(b,) for b in unlabelled]  # tuples: model(*batch)
    result = distill(model, batches, torch.optim.Adam(model.parameters(), lr=3e-3), epochs=3, seed=1)
    assert result.reordered and result.steps == 24
    assert all(len(r.subnets) == 4 and r.subnets[0] == model.space.max() for r in result.history)
    after = served(half, "kl")
    assert after < 0.5 * before, (before, after)
    # the largest subnet, calibrated on the unlabelled images, also comes closer to the original (which runs on the
    # running statistics of its supervised training)
    assert served(model.space.max(), "kl") < 0.5 * full_before


@pytest.mark.parametrize(
    ("kwargs", "batches", "match"),
    [
        ({"schedule": WidthThenDepth(width="heads")}, None, r"schedule=.*names dimension 'heads'"),
        ({"schedule": ProgressiveShrinking(("depth", "kernel"))}, None, r"dimension 'kernel'"),
        ({}, [], r"batches yielded no batch"),
        ({}, iter([torch.zeros(2, 1, 8, 8)]), r"one-shot iterator"),
        ({"loss": "embedding"}, None, r"loss='embedding' needs last_hidden_state"),
        ({"loss": "mse"}, None, r"loss='mse' must be one of"),
        ({"teacher": "self"}, None, r"teacher='self' must be one of"),
        ({"steps": 0}, None, r"steps=0 must be an int >= 1"),
        ({"temperature": float("nan")}, None, r"temperature=nan"),
    ],
)
def test_bad_input_is_refused_and_nothing_changes(kwargs, batches, match):
    model = tiny_digits()
    before = snapshot(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with pytest.raises(subnetact.SubnetActError, match=match) as info:
        distill(model, images(1) if batches is None else batches, opt, **{"steps": 2, **kwargs})
    assert isinstance(info.value, ValueError)
    after = snapshot(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not opt.state


def run(model, steps, *, checkpoint_dir=None, resume=None, every=0):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    distill(
        model, lambda epoch: images(3, 8 + epoch), opt, steps=steps, lr_scheduler=sched, schedule=Sandwich(2),
        checkpoint_dir=checkpoint_dir, checkpoint_every=every, resume=resume, seed=3,
    )  # fmt: skip
    return opt


def test_resume_from_a_checkpoint_continues_bit_identically(tmp_path):
    # Uninterrupted: 7 steps (over epochs of 3 batches; the data changes with the epoch).
    torch.manual_seed(0)
    straight = tiny_digits(seed=2)
    run(straight, 7)
    # Interrupted after 4 steps (checkpoints every 2), resumed in a fresh process-like state.
    torch.manual_seed(0)
    first = tiny_digits(seed=2)
    run(first, 4, checkpoint_dir=tmp_path / "ckpt", every=2)
    assert (tmp_path / "ckpt" / "supernet.safetensors").exists()
    torch.manual_seed(123)  # the checkpoint restores the torch random state
    resumed = tiny_digits(seed=9)  # other weights: all come from the checkpoint
    run(resumed, 7, resume=tmp_path / "ckpt")
    a, b = straight.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_checkpoint_round_trip_restores_optimizer_and_sampler(tmp_path):
    from subnetact.train.checkpoint import TrainerState

    model = tiny_digits()
    opt = run(model, 2)
    sampler = random.Random(5)
    sampler.random()
    state = TrainerState(2, sampler, opt)
    save_checkpoint(tmp_path, model, state)
    other = tiny_digits(seed=4)
    opt2 = torch.optim.Adam(other.parameters(), lr=1e-2)
    state2 = TrainerState(0, random.Random(0), opt2)
    load_checkpoint(tmp_path, other, state2)
    assert state2.step == 2 and state2.sampler.random() == sampler.random()
    for (_, s1), (_, s2) in zip(opt.state_dict()["state"].items(), opt2.state_dict()["state"].items()):
        assert all(torch.equal(s1[k], s2[k]) for k in s1)
    with pytest.raises(subnetact.CheckpointError, match="trainer.safetensors does not exist"):
        load_checkpoint(tmp_path / "missing", other, state2)


def test_torchrun_two_processes_give_the_weights_of_one(tmp_path):
    # The same global batches and steps on 1 process and, under torchrun, on 2 (gloo, each rank half of every batch):
    # the gradients are averaged over the ranks, so the weights agree to float rounding.
    worker = HERE / "distill_worker.py"
    env_path = str(Path(subnetact.__file__).resolve().parents[1])
    env = {"PYTHONPATH": env_path, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    one = subprocess.run(
        [sys.executable, str(worker), str(tmp_path / "one.pt")], env=env, capture_output=True, text=True, timeout=300
    )
    assert one.returncode == 0, one.stderr[-2000:]
    for _ in range(2):
        two = subprocess.run(
            [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                str(worker), str(tmp_path / "two.pt"),
            ],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        # A gloo rank aborting as the process exits ("terminate called without an active exception", seen once in
        # ~10 runs on torch 2.14.1 and 2.15) is the launcher's teardown, not a result: launch once more. Any other
        # failure, or the abort twice, fails the test, and the weights are compared either way.
        if two.returncode == 0 or "terminate called without an active exception" not in two.stderr:
            break
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    moved = [k for k in a["start"] if not torch.equal(a["start"][k], a["end"][k])]
    assert len(moved) > 10  # training changed the weights ...
    for k in a["end"]:
        torch.testing.assert_close(b["end"][k], a["end"][k], rtol=1e-4, atol=1e-5, msg=k)  # ... identically
    assert b["world"] == 2 and a["world"] == 1


def test_fixed_weights_scale_each_subnets_loss():
    # One SGD step of distill with Fixed(weights=) against the same step written out: 3 x KL(small) + 0.5 x KL(max).
    torch.manual_seed(0)
    model = tiny_digits()
    by_hand = copy.deepcopy(model)
    teacher = copy.deepcopy(model).eval()
    x = images(1)[0]
    small, largest = model.space.min(), model.space.max()
    distill(model, [x], torch.optim.SGD(model.parameters(), lr=0.1), steps=1, reorder=False,
            schedule=Fixed((small, largest), weights=(3, 0.5)))  # fmt: skip
    with torch.no_grad():
        target = torch.log_softmax(teacher(x, subnet=largest), dim=-1)
    by_hand.train()
    total = 0.0
    for cfg, w in ((small, 3.0), (largest, 0.5)):
        log_p = torch.log_softmax(by_hand(x, subnet=cfg), dim=-1)
        total = total + w * (target.exp() * (target - log_p)).sum(-1).mean()
    total.backward()
    with torch.no_grad():
        for p in by_hand.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    for (name, got), want in zip(model.named_parameters(), by_hand.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    for bad in ((1.0,), (1.0, 0.0), (1.0, float("inf")), (True, 1.0)):
        with pytest.raises(subnetact.ConfigError, match=r"weights=.* must be 2 finite numbers > 0"):
            Fixed((small, largest), weights=bad)
