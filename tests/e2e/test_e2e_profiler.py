"""subnetact.profile: a valid scheduling Profile measured on a tiny model, and precise errors."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from e2e_models import tiny_digits

import subnetact
from scheduling import Profile, ProfilePropertyWarning, SlackFit
from subnetact import profiler

pytestmark = pytest.mark.filterwarnings("ignore::subnetact.UncalibratedSubnetWarning")


def test_profile_is_a_valid_scheduling_profile(tmp_path):
    model = tiny_digits()
    space = model.space
    subnets = [space.min(), space.make(depth=[2, 1, 1], width=0.5), space.max()]
    model.train()  # profile must measure in eval mode and give the mode back
    prof = subnetact.profile(
        model,
        subnets,
        [4, 1, 2],
        example_input=torch.randn(1, 1, 8, 8),
        accuracies=[90.0, 93.5, 97.0],
        repeats=5,
        rounds=1,  # back to back, untrimmed, unfitted: the plain statistics checked below
        trim=0.0,
        monotone=False,
        keep_samples=True,
        name="tiny",
    )
    assert model.training and model.active == space.max()
    assert isinstance(prof, Profile)
    assert prof.ids == (0, 1, 2) and prof.batch_sizes == (1, 2, 4) and prof.name == "tiny"
    for s, cfg, acc in zip(prof.subnets, subnets, [90.0, 93.5, 97.0]):
        assert s.accuracy == acc and subnetact.SubnetConfig.from_dict(s.config) == cfg
        for stats in s.latency.values():
            assert len(stats.samples_s) == 5
            assert stats.mean_s == pytest.approx(sum(stats.samples_s) / 5)
            assert stats.p99_s == max(stats.samples_s) >= stats.mean_s > 0  # nearest rank of 5 samples is the max
    assert prof.metadata["repeats"] == 5 and prof.metadata["device"].startswith("cpu")
    prof.save(tmp_path / "p.json")
    again = Profile.load(tmp_path / "p.json", check="ignore")
    assert again.latency(2, 4) == prof.latency(2, 4)
    SlackFit(again).decide(1.0, 3, now=0.0)  # usable by a policy


def test_profile_mapping_ids_and_callable_input():
    model = tiny_digits()
    seen = []

    def make(b):
        seen.append(b)
        return (torch.randn(b, 1, 8, 8),)

    prof = subnetact.profile(
        model,
        {"small": model.space.min(), "big": model.space.max()},
        [3],
        example_input=make,
        accuracies={"small": 1.0, "big": 2.0},
        warmup=0,
        repeats=2,
    )
    assert prof.ids == ("small", "big") and seen == [3]  # one input per batch size, shared by the subnets
    assert prof.subnet("big").accuracy == 2.0


def test_profile_slower_for_bigger_subnet_on_a_wide_model():
    # Enough work that the largest subnet is measurably slower than the smallest (16x the MACs at width 0.25).
    model = tiny_digits(widths=(32, 64, 64), blocks=(3, 3, 1))
    prof = subnetact.profile(
        model, [model.space.min(), model.space.max()], [16], example_input=torch.randn(2, 1, 8, 8), repeats=5
    )
    assert prof.latency(1, 16) > 1.5 * prof.latency(0, 16)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_sizes": []}, ValueError, r"batch_sizes=\[\] must be a non-empty"),
        ({"batch_sizes": [1, 0]}, ValueError, r"every batch size must be an int >= 1, got 0"),
        ({"batch_sizes": [2, 2]}, ValueError, r"batch_sizes=\[2, 2\] has duplicates"),
        ({"accuracies": [1.0]}, ValueError, r"accuracies has 1 values for 2 subnets"),
        ({"accuracies": [1.0, math.nan]}, ValueError, r"accuracies\[1\]=nan must be a finite number"),
        ({"accuracies": {0: 1.0}}, ValueError, r"accuracies has no entry for subnet id\(s\) \[1\]"),
        ({"repeats": 0}, ValueError, r"repeats=0 must be an int >= 1"),
        ({"warmup": -1}, ValueError, r"warmup=-1 must be an int >= 0"),
        ({"rounds": 0}, ValueError, r"rounds=0 must be an int >= 1"),
        ({"trim": 0.5}, ValueError, r"trim=0.5 must be a number with 0 <= trim < 0.5"),
        ({"device": "meta"}, ValueError, r"device='meta' but the model is on 'cpu'; call model.to\(device\) first"),
        ({"device": "nonsense"}, ValueError, r"device='nonsense' is not a torch device"),
        ({"example_input": torch.tensor(1.0)}, ValueError, r"needs a leading batch dimension"),
        ({"example_input": "x"}, ValueError, r"example_input=str must be a tensor"),
        ({"subnets": []}, ValueError, r"subnets is empty"),
        ({"subnets": [{"depth": [9, 9, 9]}]}, ValueError, r"config has dimensions"),
    ],
)
def test_profile_errors(kwargs, error, match):
    model = tiny_digits()
    args = {
        "subnets": [model.space.min(), model.space.max()],
        "batch_sizes": [1],
        "example_input": torch.randn(1, 1, 8, 8),
        "repeats": 1,
        "warmup": 0,
    }
    args.update(kwargs)
    subnets, batch_sizes = args.pop("subnets"), args.pop("batch_sizes")
    with pytest.raises(error, match=match):
        subnetact.profile(model, subnets, batch_sizes, **args)


def test_profile_refuses_unconverted_model():
    with pytest.raises(TypeError, match="is not a converted supernet"):
        subnetact.profile(torch.nn.Linear(2, 2), [], [1], example_input=torch.randn(1, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_on_cuda_synchronises():
    model = tiny_digits().cuda()
    prof = subnetact.profile(model, [model.space.max()], [8], example_input=torch.randn(1, 1, 8, 8), repeats=3)
    assert prof.metadata["device"] == torch.cuda.get_device_name(0)
    assert prof.latency(0, 8) > 0


# ----------------------------------------------------------------------------- robust profiling (issue 12)
class _FakeMachine:
    """A clock that a forward pre-hook advances by a scripted duration: ``base[(width, batch)] * slowdown``, where the
    slowdown is ``burst`` for forwards number ``burst_calls`` (counting every forward, timed or not)."""

    def __init__(self, model, base, burst_calls=range(0), burst=10.0):
        self.now, self.calls, self.visits = 0.0, 0, []
        self.base, self.burst_calls, self.burst = base, burst_calls, burst
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        key = (kwargs["subnet"].to_dict()["width"][0], args[0].shape[0])
        self.visits.append(key)
        self.now += self.base[key] * (self.burst if self.calls in self.burst_calls else 1.0)
        self.calls += 1

    def perf_counter(self):
        return self.now


def _fake_profile(monkeypatch, burst_calls, **kwargs):
    model = tiny_digits()
    small, big = model.space.min(), model.space.max()
    base = {(small.to_dict()["width"][0], 1): 1e-3, (small.to_dict()["width"][0], 4): 2e-3}
    base |= {(big.to_dict()["width"][0], 1): 3e-3, (big.to_dict()["width"][0], 4): 4e-3}
    machine = _FakeMachine(model, base, burst_calls)
    monkeypatch.setattr(profiler.time, "perf_counter", machine.perf_counter)
    prof = subnetact.profile(model, [small, big], [1, 4], example_input=torch.randn(1, 1, 8, 8), **kwargs)
    return prof, machine


def test_interleaved_trimmed_profile_shrugs_off_a_burst_of_background_load(monkeypatch):
    # 4 entries, warmup 1 (4 forwards), then 5 rounds x 4 entries x (1 untimed + 2 timed) forwards. A 10x burst during
    # round 2 (forwards 16..27) hits 2 of each entry's 10 samples; trimming 20 % at each end removes them.
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfilePropertyWarning)
        prof, machine = _fake_profile(monkeypatch, range(16, 28), warmup=1, repeats=10, rounds=5, trim=0.2)
    assert machine.calls == 4 + 5 * 4 * 3
    # Interleaved: after the warm-up, the entries take turns, 3 forwards per visit.
    turns = machine.visits[4::3]
    assert turns == machine.visits[4:16:3] * 5 and len(set(turns[:4])) == 4
    assert [prof.latency(i, b) for i in (0, 1) for b in (1, 4)] == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3])
    noise = prof.metadata["noise"]
    assert noise["corrected"] == [] and prof.metadata["rounds"] == 5 and prof.metadata["trim"] == 0.2
    # p90 of 10 samples (nearest rank 9) is a burst sample: spread (10 - 1) / 1 = 9 for every entry.
    assert [x[2] for x in noise["rel_spread"]] == pytest.approx([9.0] * 4)
    assert noise["max_rel_spread"] == pytest.approx(9.0)


def test_back_to_back_profile_is_corrupted_by_the_same_burst_and_the_fit_names_it(monkeypatch):
    # rounds=1, no warm-up: the entries run back to back in the order (0, 1), (0, 4), (1, 1), (1, 4), so a burst over
    # forwards 0..9 covers all 10 samples of subnet 0 at batch 1: 10 ms, more than its 2 ms at batch 4 (P1 broken).
    with pytest.warns(ProfilePropertyWarning, match=r"changed 2 entries: subnet 0 batch 1: 10\.000 -> 6\.000 ms; "
                      r"subnet 0 batch 4: 2\.000 -> 6\.000 ms"):  # fmt: skip
        prof, _ = _fake_profile(monkeypatch, range(0, 10), warmup=0, repeats=10, rounds=1, trim=0.0)
    assert prof.latency(0, 1) == prof.latency(0, 4) == pytest.approx(6e-3)  # pooled: (10 + 2) / 2
    assert prof.check_properties().p1 == ()
    (c1, c4) = prof.metadata["noise"]["corrected"]
    assert (c1["subnet"], c1["batch_size"], c1["measured_s"]) == (0, 1, pytest.approx(1e-2))
    assert (c4["subnet"], c4["batch_size"], c4["fitted_s"]) == (0, 4, pytest.approx(6e-3))
    assert prof.latency(0, 1, "p99") == pytest.approx(6e-3)  # scaled with the mean


def test_isotonic_fit_by_hand():
    assert profiler._isotonic([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert profiler._isotonic([3.0, 1.0, 2.0]) == [2.0, 2.0, 2.0]
    assert profiler._isotonic([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert profiler._isotonic([5.0, 1.0, 1.0, 9.0, 0.0]) == pytest.approx([7 / 3] * 3 + [4.5, 4.5])
