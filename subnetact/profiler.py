"""``profile``: measure each subnet's batch latency on a device and return a ``scheduling.Profile``.

The profile is what the scheduling policies (SlackFit and the baselines) decide from: for every subnet of the served
set and every batch size, the mean and p99 of the time one forward of that batch takes.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._progress import Progress
from .config import SubnetConfig
from .supernet import state_of

if TYPE_CHECKING:  # scheduling is imported lazily: ``import subnetact`` stays light
    from scheduling import Profile

SubnetsArg = Sequence[SubnetConfig | Mapping[str, Sequence[float]]] | Mapping[int | str, SubnetConfig]


def profile(
    model: nn.Module,
    subnets: SubnetsArg,
    batch_sizes: Sequence[int],
    *,
    example_input: torch.Tensor | Callable[[int], Any],
    device: torch.device | str | None = None,
    accuracies: Sequence[float] | Mapping[int | str, float] | None = None,
    warmup: int = 3,
    repeats: int = 20,
    keep_samples: bool = False,
    name: str = "",
    progress: bool | None = None,
) -> Profile:
    """Measure the latency of every (subnet, batch size) on ``device`` and return a :class:`scheduling.Profile`.

    Each measurement runs ``warmup`` untimed forwards, then times ``repeats`` forwards one by one under
    ``torch.inference_mode`` with ``model(x, subnet=cfg)`` (the model's active subnet is left alone). On CUDA the
    device is synchronised before starting and after each forward, so the time covers the kernels, not just their
    launch. Latency is the wall-clock time of one forward of the whole batch.

    Args:
        model: a converted model, already on ``device``; it is put in eval mode and its mode restored afterwards.
        subnets: the subnets to profile: a sequence of configs (ids become 0, 1, ...) or a mapping id -> config.
        batch_sizes: positive ints, e.g. ``(1, 2, 4, 8, 16)``.
        example_input: a tensor whose first dimension is the batch (a batch of one or more samples; it is repeated
            or cut to each batch size), or a callable ``batch_size -> input`` (a tensor, a tuple of positional
            arguments or a dict of keyword arguments) for models with several inputs.
        device: where to measure; default: the device of the model's first parameter. The model must already be
            there; the input is moved there.
        accuracies: each subnet's accuracy (a sequence aligned with ``subnets`` or a mapping by id), e.g. top-1 % on
            a validation set; the policies trade it against latency. None stores 0.0 for every subnet, which is only
            useful to look at latencies.
        warmup: untimed forwards per measurement (>= 0).
        repeats: timed forwards per measurement (>= 1); p99 is the nearest-rank percentile of these.
        keep_samples: store the raw timings in the profile (``LatencyStats.samples_s``).
        name: the profile's name.
        progress: draw a progress line on stderr; None: only when stderr is a terminal.

    Returns:
        A :class:`scheduling.Profile` whose subnets carry ``config`` (the config's ``to_dict()``) and whose
        metadata records the device, torch version, threads, warm-up and repeats.

    Raises:
        ValueError: a bad argument (named in the message).
        TypeError: ``model`` is not a converted supernet.

    Example::

        >>> prof = subnetact.profile(model, model.registered_subnets, (1, 4, 16),
        ...                          example_input=torch.randn(1, 3, 224, 224), accuracies=[71.2, 76.0, 79.1])
        >>> prof.save("profile.json")
    """
    from scheduling import LatencyStats, Profile, Subnet

    state_of(model)
    ids, configs = _subnets(model, subnets)
    batch_sizes = _batch_sizes(batch_sizes)
    accs = _accuracies(accuracies, ids)
    for arg, value, low in (("warmup", warmup, 0), ("repeats", repeats, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{arg}={value!r} must be an int >= {low}")
    device = _device(model, device)
    make_input = _input_maker(example_input, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)

    bar = Progress(len(configs) * len(batch_sizes), "profiling", enabled=progress)
    was_training = model.training
    model.eval()
    table: dict[int, dict[int, Any]] = {}
    try:
        with torch.inference_mode():
            for i, cfg in enumerate(configs):
                table[i] = {}
                for b in batch_sizes:
                    args, kwargs = make_input(b)
                    for _ in range(warmup):
                        model(*args, subnet=cfg, **kwargs)
                    samples = []
                    sync(device)
                    for _ in range(repeats):
                        start = time.perf_counter()
                        model(*args, subnet=cfg, **kwargs)
                        sync(device)
                        samples.append(time.perf_counter() - start)
                    table[i][b] = _stats(LatencyStats, samples, keep_samples)
                    bar.update()
    finally:
        bar.close()
        model.train(was_training)

    metadata = {
        "device": _device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "warmup": warmup,
        "repeats": repeats,
        "source": "subnetact.profile",
    }
    subnet_rows = [Subnet(ids[i], accs[i], table[i], configs[i].to_dict()) for i in range(len(configs))]
    return Profile(tuple(subnet_rows), name=name, metadata=metadata)


def _subnets(model: nn.Module, subnets: SubnetsArg) -> tuple[list[int | str], list[SubnetConfig]]:
    if isinstance(subnets, Mapping):
        ids, raw = list(subnets.keys()), list(subnets.values())
    elif isinstance(subnets, Sequence) and not isinstance(subnets, (str, bytes)):
        ids, raw = list(range(len(subnets))), list(subnets)
    else:
        raise ValueError(f"subnets={subnets!r} must be a sequence of SubnetConfigs or a mapping id -> SubnetConfig")
    if not raw:
        raise ValueError("subnets is empty: give at least one SubnetConfig to profile")
    space = model.space
    configs = [space.validate(c if isinstance(c, SubnetConfig) else SubnetConfig.from_dict(c)) for c in raw]
    return ids, configs


def _batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    if isinstance(batch_sizes, (int, str, bytes)) or not isinstance(batch_sizes, Sequence) or not batch_sizes:
        raise ValueError(f"batch_sizes={batch_sizes!r} must be a non-empty sequence of ints >= 1, e.g. (1, 4, 16)")
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"batch_sizes={batch_sizes!r}: every batch size must be an int >= 1, got {b!r}")
    if len(set(batch_sizes)) != len(batch_sizes):
        raise ValueError(f"batch_sizes={batch_sizes!r} has duplicates")
    return sorted(batch_sizes)


def _accuracies(accuracies: Any, ids: list[int | str]) -> list[float]:
    if accuracies is None:
        return [0.0] * len(ids)
    if isinstance(accuracies, Mapping):
        missing = [i for i in ids if i not in accuracies]
        if missing:
            raise ValueError(f"accuracies has no entry for subnet id(s) {missing!r}; it has {list(accuracies)!r}")
        values = [accuracies[i] for i in ids]
    else:
        values = list(accuracies)
        if len(values) != len(ids):
            raise ValueError(f"accuracies has {len(values)} values for {len(ids)} subnets; give one per subnet")
    for i, v in zip(ids, values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"accuracies[{i!r}]={v!r} must be a finite number")
    return [float(v) for v in values]


def _device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    param = next(model.parameters(), None)
    model_device = param.device if param is not None else torch.device("cpu")
    if device is None:
        return model_device
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device: {exc}") from None
    if device.type != model_device.type or (device.index is not None and device.index != model_device.index):
        raise ValueError(
            f"device={str(device)!r} but the model is on {str(model_device)!r}; call model.to(device) first"
        )
    return model_device


def _input_maker(example_input: Any, device: torch.device) -> Callable[[int], tuple[tuple, dict]]:
    def place(x: Any) -> tuple[tuple, dict]:
        if isinstance(x, torch.Tensor):
            return (x.to(device),), {}
        if isinstance(x, tuple):
            return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in x), {}
        if isinstance(x, Mapping):
            return (), {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in x.items()}
        raise ValueError(f"example_input(batch_size) returned {type(x).__name__}; expected a tensor, tuple or dict")

    if isinstance(example_input, torch.Tensor):
        if example_input.dim() == 0 or example_input.shape[0] < 1:
            raise ValueError(
                f"example_input has shape {tuple(example_input.shape)}; it needs a leading batch dimension of >= 1"
            )

        def from_tensor(b: int) -> tuple[tuple, dict]:
            n = example_input.shape[0]
            reps = -(-b // n)
            x = example_input.repeat(reps, *([1] * (example_input.dim() - 1)))[:b]  # (b, ...)
            return place(x)

        return from_tensor
    if callable(example_input):
        return lambda b: place(example_input(b))
    raise ValueError(
        f"example_input={type(example_input).__name__} must be a tensor with a batch dimension or a callable "
        "batch_size -> input"
    )


def _stats(latency_stats: type, samples: list[float], keep: bool) -> Any:
    ordered = sorted(samples)
    mean = sum(samples) / len(samples)
    std = math.sqrt(sum((s - mean) ** 2 for s in samples) / len(samples))
    p99 = ordered[max(1, math.ceil(0.99 * len(ordered))) - 1]
    return latency_stats(mean, p99_s=p99, std_s=std, samples_s=tuple(samples) if keep else None)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({platform.processor() or platform.machine()})"
