"""``SubnetNorm``: BatchNorm with per-subnet running statistics and a shared, sliced affine transform."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from .config import SubnetConfig
from .handlers import OperatorEntry, register_operator_kind
from .operator import Operator, cloned_parameter
from .slimmable_norm import slimmable_norm


class SubnetNorm(Operator, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose eval-mode statistics belong to the active subnet.

    Registered subnets (the served set, see :func:`subnetact.calibrate`) each have their own mean and variance,
    stored only for the channels the subnet uses. The affine ``weight`` / ``bias`` are the original Parameters,
    sliced to the first k channels.

    An unregistered subnet uses the supernet's own running statistics sliced to its first k channels (what
    once-for-all does without recalibration). They are exact for the full subnet of a plain model and can be far
    off for small subnets, so actuating such a subnet emits a one-time :class:`UncalibratedSubnetWarning`.

    In training mode it normalises with batch statistics and updates the prefix ``running_mean[:k]`` /
    ``running_var[:k]`` of the shared buffers in place (once-for-all's supernet training behaviour).

    Shapes: ``x`` (N, k, H, W) -> (N, k, H, W).
    """

    is_subnet_norm = True
    group: int | None
    _op_index: int

    @classmethod
    def from_module(cls, bn: nn.BatchNorm2d, group: int | None) -> SubnetNorm:
        """The operator for ``bn``: an ``nn.BatchNorm2d``, or a subclass that only adds ``drop`` / ``act`` modules
        after the norm (timm's ``BatchNormAct2d``), which keep running after the sliced norm."""
        with torch.device("meta"):
            new = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
        # Take over the very same Parameters and buffers (no copy).
        new.weight, new.bias = bn.weight, bn.bias
        new.running_mean, new.running_var = bn.running_mean, bn.running_var
        new.num_batches_tracked = bn.num_batches_tracked
        new.training = bn.training
        new.group = group
        for name in ("drop", "act"):
            if name in bn._modules:
                new.add_module(name, bn._modules[name])
        # A norm without running statistics always normalises by the batch: it has nothing to calibrate, and
        # registered statistics would make it differ from its export.
        new.is_subnet_norm = bn.track_running_stats
        new._base_class = type(bn)
        new._base_state = {k: v for k, v in bn.__dict__.items() if not k.startswith("_") and k != "training"}
        return new

    def _post(self, y: torch.Tensor) -> torch.Tensor:
        for name in ("drop", "act"):
            module = self._modules.get(name)
            if module is not None:
                y = module(y)
        return y

    def active_channels(self, sizes: list[int]) -> int:
        return self.num_features if self.group is None else sizes[self.group]

    def plan_entry(self, cfg: SubnetConfig, sizes: list[int], stats: tuple | None) -> tuple:
        k = self.active_channels(sizes)
        if stats is None or not self.is_subnet_norm:
            mean = None if self.running_mean is None else self.running_mean[:k]
            var = None if self.running_var is None else self.running_var[:k]
        else:
            mean, var = stats
        weight = None if self.weight is None else self.weight[:k]
        bias = None if self.bias is None else self.bias[:k]
        return (k, weight, bias, mean, var)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self._subnetact_state
        k, weight, bias, mean, var = state.current().entries[self._op_index]
        if torch.is_grad_enabled() and self.weight is not None and self.weight.requires_grad:
            weight, bias = self.weight[:k], self.bias[:k]
        calibration = getattr(state.local, "calibration", None)
        if calibration is not None and self.is_subnet_norm:
            return self._post(self._calibrate(x, weight, bias, calibration))
        if self.training or mean is None:
            return self._post(self._train_forward(x, k, weight, bias))
        return self._post(F.batch_norm(x, mean, var, weight, bias, False, 0.0, self.eps))

    def _train_forward(self, x: torch.Tensor, k: int, weight, bias) -> torch.Tensor:
        # nn.BatchNorm2d's momentum / cumulative-average logic, on the prefix views of the shared buffers.
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or self.running_mean is None
        mean = self.running_mean[:k] if self.running_mean is not None and self.training else None
        var = self.running_var[:k] if self.running_var is not None and self.training else None
        return F.batch_norm(x, mean, var, weight, bias, use_batch_stats, momentum, self.eps)

    def _calibrate(self, x: torch.Tensor, weight, bias, calibration: dict) -> torch.Tensor:
        # Exactly once-for-all's set_running_statistics: biased per-batch mean and variance, accumulated weighted by
        # batch size, and the batch normalised with its own statistics.
        batch_mean = x.mean(dim=(0, 2, 3))  # (k,)
        batch_var = (x - batch_mean[None, :, None, None]).pow(2).mean(dim=(0, 2, 3))  # (k,)
        n = x.shape[0]
        acc = calibration.get(self._op_index)
        if acc is None:
            calibration[self._op_index] = [batch_mean.double() * n, batch_var.double() * n, n]
        else:
            acc[0] += batch_mean.double() * n
            acc[1] += batch_var.double() * n
            acc[2] += n
        return F.batch_norm(x, batch_mean, batch_var, weight, bias, False, 0.0, self.eps)

    def _plain(self, k: int) -> nn.BatchNorm2d:
        """An empty module of the original class for ``k`` channels (its own attributes, no tensors yet)."""
        cls = self._base_class
        with torch.device("meta"):
            plain = nn.BatchNorm2d.__new__(cls)
            nn.BatchNorm2d.__init__(plain, k, self.eps, self.momentum, self.affine, self.track_running_stats)
        plain.__dict__.update(self._base_state)
        plain.num_features = k
        return plain

    def to_dense(self, entry: tuple) -> nn.BatchNorm2d:
        k, weight, bias, mean, var = entry
        dense = self._plain(k)
        if self.affine:
            dense.weight = cloned_parameter(self.weight[:k], self.weight.requires_grad)
            dense.bias = cloned_parameter(self.bias[:k], self.bias.requires_grad)
        if self.track_running_stats:
            dense.running_mean = mean.detach().clone()
            dense.running_var = var.detach().clone()
            dense.num_batches_tracked = self.num_batches_tracked.detach().clone()
        for name, module in self._modules.items():
            dense.add_module(name, copy.deepcopy(module))
        dense.training = self.training
        return dense

    def to_base(self) -> nn.BatchNorm2d:
        base = self._plain(self.num_features)
        base.weight, base.bias = self.weight, self.bias
        base.running_mean, base.running_var = self.running_mean, self.running_var
        base.num_batches_tracked = self.num_batches_tracked
        for name, module in self._modules.items():
            base.add_module(name, module)
        base.training = self.training
        return base

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group={self.group}"


@register_operator_kind("norm")
def norm_layer(norm: nn.Module, entry: OperatorEntry) -> nn.Module:
    """Handler of kind ``"norm"``: a BatchNorm becomes a :class:`SubnetNorm` (group None: unsliced, still
    calibrated per subnet); a LayerNorm / GroupNorm a slimmable norm (kind ``"slimmable_norm"``)."""
    (group,) = entry.groups
    if isinstance(norm, (nn.LayerNorm, nn.GroupNorm)):
        return slimmable_norm(norm, entry)
    return SubnetNorm.from_module(norm, group)
