"""Hand-written "models users write": each converts with parity or is refused cleanly with the package's error.

The table holds the patterns a trace can miss: tied weights, a layer's weight reused functionally, sizes read in
Python, weight norm (legacy hook and parametrization), auxiliary heads that run only in training, loops over an
``nn.ModuleList``, ``chunk`` / ``split``, ``interpolate``, 1-D audio convolutions, an LSTM. For every row:

- ``convert`` either raises :class:`subnetact.UnsupportedModelError` (never a builtin exception), leaving the model
  exactly as it was, or returns a supernet whose largest subnet is the original bit for bit and whose smallest, a
  random and the largest subnet each equal their own ``export()`` on a fresh input (not the one convert checked);
- calibrating the smallest and a random subnet raises nothing (a norm that runs only in training is skipped with a
  note) and keeps that parity;
- rows listed as ``refused`` must be refused and name the blocking module and operation in the message, rows listed
  as ``converts`` must convert with at least one elastic dimension (so the table cannot pass by refusing everything).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from test_convert import _assert_unchanged, _snapshot
from torch import nn

import subnetact
from subnetact.verify import relative_difference

# -- the models ------------------------------------------------------------------------------------------------------


class TiedAutoencoder(nn.Module):
    """The decoder runs the encoder's weights transposed (``F.conv_transpose2d(h, self.enc2.weight)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Conv2d(3, 16, 3, padding=1)
        self.enc2 = nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.enc2(F.relu(self.enc1(x))))
        h = F.relu(F.conv_transpose2d(h, self.enc2.weight, padding=1))
        return F.conv_transpose2d(h, self.enc1.weight, padding=1)


class TiedAutoencoderWithHead(TiedAutoencoder):
    """The tied autoencoder plus a classifier MLP that may still become elastic."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 24)
        self.fc2 = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = super().forward(x)
        return y, self.fc2(F.relu(self.fc1(y.mean((2, 3)))))


class FunctionalSidePath(nn.Module):
    """A side path computes ``F.linear(x, self.fc1.weight)`` outside ``fc1``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = F.linear(x, self.fc1.weight).sum(-1, keepdim=True)
        return self.head(self.fc2(F.relu(self.fc1(x))) + side)


class PythonSideSize(nn.Module):
    """Scales by ``(8 / self.conv1.out_channels) ** 0.5``: a size read in Python, invisible to tensor ops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3)
        self.conv2 = nn.Conv2d(16, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.conv1(x))) * (8 / self.conv1.out_channels) ** 0.5


class WeightShapeRead(nn.Module):
    """Reads ``self.fc1.weight.shape[0]`` to normalise its hidden layer by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 20)
        self.fc2 = nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)) / self.fc1.weight.shape[0])


class BufferReadOutside(nn.Module):
    """Subtracts ``self.bn.running_mean`` by hand next to the BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 12, 3)
        self.bn = nn.BatchNorm2d(12)
        self.conv2 = nn.Conv2d(12, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x)
        return self.conv2(F.relu(self.bn(h)) + 0.1 * (h - self.bn.running_mean[:, None, None]))


class Mlp(nn.Module):
    def __init__(self, hidden: int = 32, wrap: Callable[[nn.Module], nn.Module] = lambda m: m) -> None:
        super().__init__()
        self.fc1 = wrap(nn.Linear(10, hidden))
        self.fc2 = wrap(nn.Linear(hidden, hidden))
        self.fc3 = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def weight_norm_legacy() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.nn.utils.weight_norm is deprecated; users still call it
        return Mlp(wrap=nn.utils.weight_norm)


def weight_norm_parametrized() -> nn.Module:
    return Mlp(wrap=nn.utils.parametrizations.weight_norm)


class ConvNetWeightNormHead(nn.Module):
    """Convolutions (elastic) and a weight-normalised linear head (kept full width)."""

    def __init__(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 12, 3, padding=1)
        self.head = wrap(nn.Linear(12, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.conv2(F.relu(self.conv1(x)))).mean((2, 3)))


def weight_norm_head_legacy() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return ConvNetWeightNormHead(nn.utils.weight_norm)


def weight_norm_head_parametrized() -> nn.Module:
    return ConvNetWeightNormHead(nn.utils.parametrizations.weight_norm)


class AuxHeadNet(nn.Module):
    """GoogLeNet-style: an auxiliary classifier that runs only in training."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(16, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU())
        self.aux = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.aux_fc = nn.Linear(8, 5)
        self.fc = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = self.stem(x)
        out = self.fc(self.body(h).mean((2, 3)))
        if self.training:
            return out, self.aux_fc(self.aux(h).flatten(1))
        return out


class ResidualMlpBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


class ModuleListLoop(nn.Module):
    """``for block in self.blocks: x = x + block(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.blocks = nn.ModuleList(ResidualMlpBlock(16) for _ in range(3))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class ChunkGlu(nn.Module):
    """A gated unit: ``a, b = conv(x).chunk(2, dim=1); a * sigmoid(b)``, then ``split`` of another layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 12, 1)
        self.conv3 = nn.Conv2d(6, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.conv1(x).chunk(2, dim=1)
        h = self.conv2(a * torch.sigmoid(b))
        c, d = torch.split(h, [6, 6], dim=1)
        return self.conv3(F.relu(c) + d)


class TinyUNet(nn.Module):
    """Down, up with ``F.interpolate`` and a skip concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU())
        self.down2 = nn.Sequential(nn.Conv2d(12, 24, 3, padding=1, stride=2), nn.BatchNorm2d(24), nn.ReLU())
        self.up = nn.Sequential(nn.Conv2d(24, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU())
        self.out = nn.Conv2d(24, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down1(x)
        h = F.interpolate(self.down2(skip), scale_factor=2, mode="nearest")
        return self.out(torch.cat([self.up(h), skip], dim=1))


class AudioConv1d(nn.Module):
    """Keyword spotting: Conv1d / BatchNorm1d over a waveform, mean over time, an MLP head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 16, 9, stride=4), nn.BatchNorm1d(16), nn.ReLU(), nn.Conv1d(16, 32, 5, stride=2), nn.ReLU()
        )
        self.fc1 = nn.Linear(32, 48)
        self.fc2 = nn.Linear(48, 6)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(self.features(wave).mean(-1))))


class LstmTagger(nn.Module):
    """An embedding, an LSTM, and a per-step MLP head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.lstm = nn.LSTM(12, 20, batch_first=True)
        self.fc1 = nn.Linear(20, 32)
        self.fc2 = nn.Linear(32, 7)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(tokens))
        return self.fc2(F.relu(self.fc1(h)))


class SharedBlockTwice(nn.Module):
    """The same block object called twice in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3, padding=1))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = h + self.block(h)
        h = h + self.block(h)
        return self.head(h.mean((2, 3)))


class DictOutputs(nn.Module):
    """Returns a dict of two heads over one trunk."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3), nn.ReLU())
        self.cls = nn.Linear(16, 4)
        self.box = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk(x).mean((2, 3))
        return {"cls": self.cls(h), "box": self.box(h)}


def image(size: int = 16, channels: int = 3) -> Callable[[int], torch.Tensor]:
    return lambda seed: torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(seed))


def vector(features: int) -> Callable[[int], torch.Tensor]:
    return lambda seed: torch.randn(3, features, generator=torch.Generator().manual_seed(seed))


@dataclass(frozen=True)
class Row:
    build: Callable[[], nn.Module]
    example: Callable[[int], object]  # seed -> the model's input
    expect: str  # "converts" or "refused"
    match: str = ""  # for "refused": a regex the message must contain (the module and the operation)


TABLE = {
    "tied_autoencoder": Row(
        TiedAutoencoder, image(), "refused", r"'enc2.weight' is read outside 'enc2' at '<root>' \(conv_transpose2d\)"
    ),
    "tied_autoencoder_with_head": Row(TiedAutoencoderWithHead, image(), "converts"),
    "functional_side_path": Row(FunctionalSidePath, vector(8), "converts"),
    "python_side_size": Row(
        PythonSideSize, image(), "refused", r"'conv1.out_channels' is read outside 'conv1' at '<root>'"
    ),
    "weight_shape_read": Row(WeightShapeRead, vector(6), "refused", r"'fc1.weight' is read outside 'fc1'.*shape"),
    "buffer_read_outside": Row(BufferReadOutside, image(), "refused", r"'bn.running_mean' is read outside 'bn'"),
    "weight_norm_legacy": Row(
        weight_norm_legacy,
        vector(10),
        "refused",
        r"'fc\d' recomputes its weight on every call \(torch.nn.utils.weight_norm\)",
    ),
    "weight_norm_parametrized": Row(
        weight_norm_parametrized, vector(10), "refused", r"'fc1'.*computed by a parametrization: _WeightNorm"
    ),
    "weight_norm_head_legacy": Row(weight_norm_head_legacy, image(), "converts"),
    "weight_norm_head_parametrized": Row(weight_norm_head_parametrized, image(), "converts"),
    "aux_head": Row(AuxHeadNet, image(), "converts"),
    "module_list_loop": Row(ModuleListLoop, vector(6), "converts"),
    "chunk_split": Row(ChunkGlu, image(), "refused", r"chunk at '<root>'"),
    "interpolate_unet": Row(TinyUNet, image(), "converts"),
    "audio_conv1d": Row(
        AudioConv1d, lambda seed: torch.randn(2, 1, 400, generator=torch.Generator().manual_seed(seed)), "converts"
    ),
    "lstm": Row(
        LstmTagger,
        lambda seed: torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(seed)),
        "converts",
    ),
    "shared_block_twice": Row(SharedBlockTwice, image(), "converts"),
    "dict_outputs": Row(DictOutputs, image(), "converts"),
}


def _built(row: Row) -> nn.Module:
    torch.manual_seed(0)
    model = row.build().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-trivial norm statistics: a wrong slice of them changes the output
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


def _assert_export_parity(model: nn.Module, x: object, cfg: subnetact.SubnetConfig) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", subnetact.UncalibratedSubnetWarning)
        actuated = model(x, subnet=cfg)
        exported = subnetact.export(model, cfg).eval()(x)
    assert relative_difference(actuated, exported) <= 1e-5, cfg


@pytest.mark.parametrize("name", list(TABLE))
def test_model_users_write_converts_with_parity_or_is_refused_cleanly(name):
    row = TABLE[name]
    model = _built(row)
    original = _built(row)  # the same weights (deepcopy cannot copy a legacy weight_norm layer)
    snap = _snapshot(model)
    try:
        subnetact.convert(model, example_inputs=row.example(0))
    except subnetact.UnsupportedModelError as exc:
        _assert_unchanged(model, snap)
        assert row.expect == "refused", f"{name} was refused: {exc}"
        assert type(exc).__module__ == "subnetact.errors"
        assert re.search(row.match, str(exc)), f"{row.match!r} not in {exc}"
        return
    assert row.expect == "converts", f"{name} converted with space {model.space}"
    assert any(len(e.choices) > 1 for d in model.space.dims for e in model.space.entries(d))
    x = row.example(7)  # not the input convert checked
    with torch.no_grad():
        assert relative_difference(model(x, subnet=model.space.max()), original(x)) == 0
    for cfg in (model.space.min(), model.space.sample(3), model.space.max()):
        _assert_export_parity(model, x, cfg)
    # Calibrated (the served set), still with parity, and no builtin exception from calibrate either.
    served = [model.space.min(), model.space.sample(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        subnetact.calibrate(model, [row.example(11), row.example(12)], subnets=served)
    notes = [str(w.message) for w in caught if issubclass(w.category, subnetact.UncalibratedSubnetWarning)]
    if name == "aux_head":  # its auxiliary classifier runs only in training: skipped, with a note naming it
        assert len(notes) == 1 and "'aux.1'" in notes[0] and "never ran in eval mode" in notes[0], notes
    else:
        assert not notes, notes
    for cfg in served:
        _assert_export_parity(model, x, cfg)
