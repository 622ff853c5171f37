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


# -- the export backstop -------------------------------------------------------------------------------------------
class _ExportBreaks(nn.Module):
    """``F.linear(x, self.fc1.weight) @ self.proj``: an export narrower than fc1 cannot run the side path."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)
        self.proj = nn.Parameter(torch.randn(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) + torch.nn.functional.linear(x, self.fc1.weight) @ self.proj


def _silent_cases():
    from test_models_users_write import FunctionalSidePath, PythonSideSize, TiedAutoencoder

    return {
        "tied_autoencoder": (TiedAutoencoder, torch.randn(1, 3, 8, 8), "differs from its export"),
        "python_side_size": (PythonSideSize, torch.randn(1, 3, 8, 8), "differs from its export"),
        "functional_side_path": (FunctionalSidePath, torch.randn(2, 8), "differs from its export"),
        "export_breaks": (
            _ExportBreaks,
            torch.randn(2, 8),
            r"export\(\) of the smallest subnet .* fails in module '<root>'",
        ),
    }


@pytest.mark.parametrize("case", ["tied_autoencoder", "python_side_size", "functional_side_path", "export_breaks"])
def test_the_export_check_refuses_what_the_trace_misses(case, monkeypatch):
    # With the trace's detection of reads outside a layer switched off, these models used to convert silently
    # (issue 21); the comparison of subnets with their exports must refuse them and leave each model unchanged.
    from subnetact.trace import _Recorder

    build, x, message = _silent_cases()[case]
    monkeypatch.setattr(_Recorder, "read_outside", lambda *args: None)
    torch.manual_seed(0)
    model = build().eval()
    snap = _snapshot(model)
    with pytest.raises(subnetact.UnsupportedModelError, match=message):
        subnetact.convert(model, example_inputs=x)
    _assert_unchanged(model, snap)


def test_the_export_check_names_the_first_module_that_differs(monkeypatch):
    # A layer's weight scaled by hand in the parent's forward, after the layer ran: the trace is blinded as above,
    # and the refusal names the first module whose output differs between the subnet and its export.
    from subnetact.trace import _Recorder

    class Rescaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3)
            self.conv2 = nn.Conv2d(16, 16, 1)
            self.head = nn.Conv2d(16, 4, 1)

        def forward(self, x):
            h = self.conv2(torch.relu(self.conv1(x))) / self.conv1.weight.shape[0]
            return self.head(torch.relu(h)).mean((2, 3))

    monkeypatch.setattr(_Recorder, "read_outside", lambda *args: None)
    torch.manual_seed(0)
    with pytest.raises(subnetact.UnsupportedModelError, match="first at the output of 'head'"):
        subnetact.convert(Rescaled().eval(), example_inputs=torch.randn(1, 3, 8, 8))


class _Cancel(nn.Module):
    """``(x + 1000) - 1000``: float32 loses about 6e-5 of x here (float64 nothing), past the direct tolerance."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1000.0) - 1000.0


def test_rounding_is_told_apart_from_a_real_difference():
    from subnetact.verify import _agree, relative_difference

    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(64, 64), _Cancel(), nn.Linear(64, 64)).eval()
    x = torch.randn(4, 64)
    call = ((x,), {})
    with torch.no_grad():
        exported = dense(x)
        # The same computation with other rounding (as another kernel would round): float64, cast back.
        rounded = copy.deepcopy(dense).double()(x.double()).float()
    assert 1e-5 < relative_difference(rounded, exported) < 1e-3  # above the direct tolerance: float64 decides
    assert _agree(exported.clone(), exported, dense, call) == (True, 0.0)
    assert _agree(rounded, exported, copy.deepcopy(dense), call)[0]
    assert not _agree(exported * (1 + 2e-3), exported, copy.deepcopy(dense), call)[0]
    assert not _agree(exported[:, :32], exported, copy.deepcopy(dense), call)[0]


# -- example inputs convert builds ---------------------------------------------------------------------------------
class _Needs40(nn.Module):
    """Takes only 40x40 images (a window size, say), and says so the way timm models do."""

    pretrained_cfg = {"input_size": (3, 40, 40)}

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        assert x.shape[-2:] == (40, 40), "windows of 40 pixels"
        return self.conv2(torch.relu(self.conv1(x))).mean((2, 3))


class _Video(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8, 24)
        self.fc2 = nn.Linear(24, 4)

    def forward(self, x):  # (N, C, T, H, W)
        return self.fc2(torch.relu(self.fc1(torch.relu(self.conv(x)).mean((2, 3, 4)))))


@pytest.mark.parametrize("build", [_Needs40, _Video])
def test_convert_builds_inputs_from_pretrained_cfg_and_for_video_models(build):
    torch.manual_seed(0)
    model = build().eval()
    subnetact.convert(model)
    assert "width" in model.space.dims


def test_a_resnet_with_frozen_batchnorm_falls_back_to_the_trace():
    # Detection backbones: the built-in ResNet rule declines blocks with FrozenBatchNorm2d (it was refused), and the
    # traced analysis converts them (depth; FrozenBatchNorm2d keeps the channels full width), verified as always.
    from torchvision.models.resnet import BasicBlock, ResNet
    from torchvision.ops.misc import FrozenBatchNorm2d

    torch.manual_seed(0)
    model = ResNet(BasicBlock, [2, 2, 1, 1], num_classes=5, norm_layer=FrozenBatchNorm2d).eval()
    reference = copy.deepcopy(model)
    subnetact.convert(model)
    assert [e.choices for e in model.space.entries("depth")][:2] == [(1, 2), (1, 2)]
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
        cfg = model.space.min()
        torch.testing.assert_close(model(x, subnet=cfg), subnetact.export(model, cfg).eval()(x), rtol=0, atol=0)
