"""Ready-made served sets. :data:`SUPERSERVE_OFA_RESNET50` is the SuperServe paper's: six once-for-all ResNet-50
Pareto subnets (source and licence note in ``subnetact/zoo/_superserve_data.py``).

    >>> from subnetact import zoo
    >>> [s.accuracy for s in zoo.SUPERSERVE_OFA_RESNET50]
    [73.822, 76.686, 77.636, 78.25, 79.44, 80.158]
    >>> model = subnetact.convert(OFAResNets(**zoo.OFA_RESNET50_KWARGS))
    >>> served = [s.config(model) for s in zoo.SUPERSERVE_OFA_RESNET50]
    >>> subnetact.calibrate(model, batches, subnets=served)

Importing this module is pure Python (no torch, no ``ofa``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ._superserve_data import ROWS

# ofa.model_zoo.ofa_net("ofa_resnet50"): the supernet the six subnets come from.
OFA_RESNET50_KWARGS: Mapping[str, Any] = MappingProxyType(
    {"depth_list": [0, 1, 2], "expand_ratio_list": [0.2, 0.25, 0.35], "width_mult_list": [0.65, 0.8, 1.0]}
)


@dataclass(frozen=True)
class Latency:
    """Profiled latency of one batch, in seconds: the forward pass alone and end to end (JPEG decode, copies,
    forward, postprocess)."""

    forward_mean_s: float
    forward_std_s: float
    mean_s: float
    std_s: float
    p99_s: float


@dataclass(frozen=True)
class ServedSubnet:
    """One subnet of a served set.

    Args:
        id: position in the set, 0 = smallest.
        accuracy: published ImageNet top-1 accuracy, in %.
        ofa: once-for-all's subnet dict (``{"d", "e", "w"}``, ``w`` as indices).
        latency: batch size -> :class:`Latency` on the profiling GPU.
        constraint_mflop: the FLOP budget the subnet was searched under (0: minimum subnet; 99999999: maximum).
        predicted_mflops: the search's FLOP estimate (-1 where the file has none).
        device: the profiling GPU.
    """

    id: int
    accuracy: float
    ofa: Mapping[str, tuple]
    latency: Mapping[int, Latency]
    constraint_mflop: int
    predicted_mflops: float
    device: str = "NVIDIA A40"

    def ofa_dict(self) -> dict[str, list]:
        """A fresh copy of the OFA dict, for ``ofa_net.set_active_subnet(**s.ofa_dict())``."""
        return {k: list(v) for k, v in self.ofa.items()}

    def config(self, space: Any):
        """The :class:`~subnetact.SubnetConfig` in a converted ``ofa_resnet50``'s space (``model.space`` or the
        model)."""
        from ..ofa.config import from_ofa

        return from_ofa(self.ofa_dict(), space)


def _build() -> tuple[ServedSubnet, ...]:
    out = []
    for row in ROWS:
        out.append(
            ServedSubnet(
                id=row["id"],
                accuracy=row["accuracy"],
                ofa=MappingProxyType({"d": tuple(row["d"]), "e": tuple(row["e"]), "w": tuple(row["w"])}),
                latency=MappingProxyType(
                    {b: Latency(*(v * 1e-9 for v in vals)) for b, vals in sorted(row["latency_ns"].items())}
                ),
                constraint_mflop=row["constraint_mflop"],
                predicted_mflops=row["predicted_mflops"],
            )
        )
    return tuple(out)


SUPERSERVE_OFA_RESNET50: tuple[ServedSubnet, ...] = _build()
"""The six SuperServe Pareto subnets of ``ofa_resnet50``, smallest first."""

__all__ = ["OFA_RESNET50_KWARGS", "SUPERSERVE_OFA_RESNET50", "Latency", "ServedSubnet"]
