"""The model side of serving: run a batch of requests on one subnet of a converted supernet.

A :class:`ModelSpec` says where the model comes from (a :func:`subnetact.save` file and the factory that builds its
architecture) and is plain data, so it pickles: this is how Ray workers get the model (a converted model itself does
not pickle; every worker loads the file). :meth:`ModelSpec.build` returns a :class:`SupernetRunner`, the callable
``runner(subnet_id, payloads) -> answers`` that a :class:`scheduling.Scheduler` worker or a Ray worker calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from scheduling import Profile

from .._imports import import_callable
from ..config import SubnetConfig

__all__ = ["ModelSpec", "SupernetRunner"]

_POSTPROCESS = ("argmax", "logits")


class SupernetRunner:
    """Runs batches on the subnets of a profile: ``runner(subnet_id, payloads) -> one answer dict per payload``.

    Args:
        model: A converted supernet (eval mode is set here), on ``device``.
        profile: The served subnets; each subnet's ``config`` (a :class:`~subnetact.SubnetConfig` dict, as
            :func:`subnetact.profile` writes it) says what to actuate for its id.
        input_shape: The shape of one request's input, without the batch dimension, e.g. ``(1, 8, 8)``.
        postprocess: ``"argmax"`` (default): each answer is ``{"prediction": int}`` (classification);
            ``"logits"``: ``{"output": [...]}`` (the model's output row as a list).
        device: Where the inputs go; default: the device of the model's first parameter.

    Each answer also carries ``"subnet"`` (the id that served it) and ``"batch_size"`` (how many requests ran in
    that forward). Calls from several threads are safe: each forward passes its subnet with ``subnet=``.

    Example::

        >>> model, record = digits.load_supernet()
        >>> runner = SupernetRunner(model, profile, input_shape=(1, 8, 8))
        >>> runner(0, [np.zeros((1, 8, 8), np.float32)])
        [{'prediction': 1, 'subnet': 0, 'batch_size': 1}]
    """

    def __init__(
        self,
        model: nn.Module,
        profile: Profile,
        *,
        input_shape: Sequence[int],
        postprocess: str = "argmax",
        device: torch.device | str | None = None,
    ) -> None:
        if not isinstance(profile, Profile):
            raise TypeError(f"profile must be a scheduling.Profile, got {type(profile).__name__}")
        shape = tuple(input_shape)
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise ValueError(f"input_shape={input_shape!r} must be a non-empty sequence of positive ints")
        if postprocess not in _POSTPROCESS:
            raise ValueError(f"postprocess={postprocess!r} must be one of {list(_POSTPROCESS)}")
        configs = {}
        for s in profile.subnets:
            if not s.config:
                raise ValueError(
                    f"subnet {s.id!r} of the profile has no config; profile it with subnetact.profile, which "
                    "stores each subnet's SubnetConfig"
                )
            configs[s.id] = SubnetConfig.from_dict(dict(s.config))
        self.model = model.eval()
        self.profile = profile
        self.configs = configs
        self.input_shape = shape
        self.postprocess = postprocess
        self.device = torch.device(device) if device is not None else next(model.parameters()).device

    def __call__(self, subnet_id: Any, payloads: Sequence[np.ndarray | torch.Tensor]) -> list[dict[str, Any]]:
        """Run ``payloads`` (each of shape ``input_shape``) as one batch on subnet ``subnet_id``."""
        x = torch.stack([torch.as_tensor(p) for p in payloads]).to(self.device)  # (N, *input_shape)
        with torch.inference_mode():
            out = self.model(x, subnet=self.configs[subnet_id])  # (N, ...)
        n = len(payloads)
        if self.postprocess == "argmax":
            rows = [{"prediction": p} for p in out.argmax(1).tolist()]
        else:
            rows = [{"output": r} for r in out.float().cpu().tolist()]
        for r in rows:
            r["subnet"] = subnet_id
            r["batch_size"] = n
        return rows


@dataclass(frozen=True)
class ModelSpec:
    """Where a served model comes from; plain data that pickles (Ray ships it to every worker).

    Args:
        checkpoint: A file written by :func:`subnetact.save`.
        factory: ``"module:callable"`` building the model's architecture (converted or not), e.g.
            ``"subnetact.digits:build"`` or ``"torchvision.models:resnet50"``.
        profile: The served subnets with their latency and accuracy: a :class:`scheduling.Profile` or the path of
            its JSON (``subnetact profile --out``). Subnets need their ``config``.
        input_shape: One request's input shape without the batch dimension.
        postprocess: ``"argmax"`` or ``"logits"`` (see :class:`SupernetRunner`).
        device: ``"cpu"`` (default), ``"cuda"``, ``"cuda:1"``...
        threads: ``torch.set_num_threads`` in the process that builds the runner; ``None`` leaves it alone.
    """

    checkpoint: str
    factory: str
    profile: Profile | str
    input_shape: tuple[int, ...]
    postprocess: str = "argmax"
    device: str = "cpu"
    threads: int | None = None

    def load_profile(self) -> Profile:
        return self.profile if isinstance(self.profile, Profile) else Profile.load(self.profile)

    def build(self) -> SupernetRunner:
        """Load the checkpoint and return a :class:`SupernetRunner` (one per process)."""
        from ..io import load

        if self.threads is not None:
            torch.set_num_threads(self.threads)
        model = load(self.checkpoint, import_callable(self.factory, "factory")).to(self.device)
        return SupernetRunner(
            model,
            self.load_profile(),
            input_shape=self.input_shape,
            postprocess=self.postprocess,
            device=self.device,
        )
