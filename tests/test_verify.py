"""convert's check against the original model: the trace's output is the reference, so it must be a plain forward's.

``convert`` checks that the converted model's largest subnet reproduces the original bit for bit. To save one forward
it takes the original's output from the trace's forward; these tests pin that this output is a plain forward's, bit
for bit, and that a model whose output changes under the trace still converts exactly (convert then asks the
original model itself).
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_convert import _assert_unchanged, _snapshot
from torch import nn
from torch.overrides import _get_current_function_mode
from zoo_models import HAS_TIMM, ZOO, build, inputs

import subnetact
from subnetact.trace import trace_channels
from subnetact.verify import plain_output


def _params(name):
    marks = [pytest.mark.skipif(not HAS_TIMM, reason="timm not installed")] if ZOO[name].needs_timm else []
    return pytest.param(name, marks=marks)


@pytest.mark.parametrize("name", [_params(n) for n in ZOO])
def test_the_trace_output_is_a_plain_forwards_bit_for_bit(name):
    # The ViTs run nn.MultiheadAttention, whose fused fast path is off while a TorchFunctionMode is active (1e-6
    # apart from the slow path): the trace runs such leaves outside its mode.
    model = build(name).eval()
    x = inputs(name)
    traced = trace_channels(model, (x,), {}).output
    torch.testing.assert_close(traced, plain_output(model, ((x,), {})), rtol=0, atol=0)


class ModeSensitive(nn.Module):
    """Adds 1e-3 when a TorchFunctionMode is active: a stand-in for a module whose fast path a mode switches off."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1e-3 if _get_current_function_mode() is not None else x


def _mode_sensitive_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), ModeSensitive(), nn.Conv2d(8, 4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    ).eval()


def test_a_model_whose_output_changes_under_the_trace_converts_exactly():
    model = _mode_sensitive_net()
    reference = copy.deepcopy(model)
    x = torch.randn(1, 3, 8, 8)
    assert not torch.equal(trace_channels(model, (x,), {}).output, plain_output(model, ((x,), {})))

    subnetact.convert(model, example_inputs=x)

    assert "width" in model.space.dims
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


def test_a_real_mismatch_is_still_refused_after_asking_the_original(monkeypatch):
    # The converted model's largest subnet is made wrong on purpose: convert must compare it with a plain forward of
    # the original (the trace's output differs here too) and refuse, leaving the model as it was.
    from subnetact import WeightSliceConv2d

    model = _mode_sensitive_net()
    snap = _snapshot(model)
    forward = WeightSliceConv2d.forward
    monkeypatch.setattr(WeightSliceConv2d, "forward", lambda self, x: forward(self, x) * 1.5)
    with pytest.raises(subnetact.UnsupportedModelError, match="largest subnet does not reproduce"):
        subnetact.convert(model, example_inputs=torch.randn(1, 3, 8, 8))
    _assert_unchanged(model, snap)


class ThreadProbe(nn.Module):
    """Records the intra-op thread count each forward runs with."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return x


@pytest.mark.parametrize("refused", [False, True])
def test_convert_forwards_run_on_one_thread_and_the_setting_is_restored(refused):
    torch.manual_seed(0)
    probe = ThreadProbe()
    if refused:  # the flatten into the classifier blocks the only group: nothing can be elastic
        model = nn.Sequential(nn.Conv2d(3, 8, 3), probe, nn.Flatten(), nn.Linear(8 * 6 * 6, 2)).eval()
    else:
        model = nn.Sequential(nn.Conv2d(3, 8, 3), probe, nn.Conv2d(8, 4, 1), nn.AdaptiveAvgPool2d(1)).eval()
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        if refused:
            with pytest.raises(subnetact.UnsupportedModelError):
                subnetact.convert(model, example_inputs=torch.randn(1, 3, 8, 8))
        else:
            subnetact.convert(model, example_inputs=torch.randn(1, 3, 8, 8))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert probe.seen and set(probe.seen) == {1}
