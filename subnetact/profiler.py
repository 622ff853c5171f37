"""``profile``: measure each subnet's batch latency on a device and return a ``scheduling.Profile``.

The profile is what the scheduling policies (SlackFit and the baselines) decide from: for every subnet of the served
set and every batch size, the mean and p99 of the time one forward of that batch takes.

Machines are noisy (other processes, frequency scaling, a shared GPU), and a profile that is wrong in one entry makes
a policy plan with it for the whole run (issue 12: on a busy machine batch 2 measured slower than batch 32). So:

- **interleaved repeats**: the repeats of every (subnet, batch size) are spread over ``rounds`` passes over all the
  entries, so a burst of background load spreads over all entries instead of corrupting the ones measured during it;
- **trimmed statistics**: the mean drops the fastest and slowest ``trim`` fraction of the samples; the p99 is still
  the nearest-rank percentile of all of them (it is a tail statistic);
- **a monotone fit**: latency may not fall as the batch grows (P1); violations left after the above are pooled
  (isotonic regression) and a warning names every entry it changed;
- the **noise** is recorded in the profile's metadata: per entry, the relative spread of the samples, plus the
  machine's load average before and after.
"""

from __future__ import annotations

import math
import os
import platform
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._progress import Progress
from .checks import is_int, is_real
from .config import SubnetConfig
from .errors import ConfigError
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
    rounds: int = 5,
    trim: float = 0.1,
    monotone: bool = True,
    keep_samples: bool = False,
    name: str = "",
    progress: bool | None = None,
) -> Profile:
    """Measure the latency of every (subnet, batch size) on ``device`` and return a :class:`scheduling.Profile`.

    Every entry first runs ``warmup`` untimed forwards. Then, ``rounds`` times, every entry in turn runs one untimed
    forward (when ``warmup > 0``: the switch from the previous entry is not timed) and its share of the ``repeats``
    timed forwards, one by one under ``torch.inference_mode`` with ``model(x, subnet=cfg)`` (the model's active subnet
    is left alone). On CUDA the device is synchronised before starting and after each forward, so the time covers the
    kernels, not just their launch. Latency is the wall-clock time of one forward of the whole batch. See the module
    docstring for why the repeats are interleaved, the mean trimmed and the result fitted.

    Args:
        model: a converted model, already on ``device``; it is put in eval mode and its mode restored afterwards.
        subnets: the subnets to profile: a sequence of configs (ids become 0, 1, ...) or a mapping id -> config.
        batch_sizes: positive ints, e.g. ``(1, 2, 4, 8, 16)``.
        example_input: a tensor whose first dimension is the batch (a batch of one or more samples; it is repeated
            or cut to each batch size), or a callable ``batch_size -> input`` (a tensor, a tuple of positional
            arguments or a dict of keyword arguments) for models with several inputs, called once per batch size.
        device: where to measure; default: the device of the model's first parameter. The model must already be
            there; the input is moved there.
        accuracies: each subnet's accuracy (a sequence aligned with ``subnets`` or a mapping by id), e.g. top-1 % on
            a validation set; the policies trade it against latency. None stores 0.0 for every subnet, which is only
            useful to look at latencies.
        warmup: untimed forwards per measurement (>= 0).
        repeats: timed forwards per (subnet, batch size) (>= 1); p99 is the nearest-rank percentile of these.
        rounds: passes over all the entries that the repeats are spread over (>= 1; capped at ``repeats``). 1 is the
            old behaviour: each entry's repeats back to back.
        trim: fraction of the samples dropped at *each* end for the mean and std (0 <= trim < 0.5; default 0.1).
        monotone: fit the means so that latency never falls as the batch grows (P1), warning with
            :class:`scheduling.ProfilePropertyWarning` that names each corrected entry; its p99 and std are scaled
            by the same factor. The measured values are kept in ``metadata["noise"]["corrected"]``.
        keep_samples: store the raw timings in the profile (``LatencyStats.samples_s``).
        name: the profile's name.
        progress: draw a progress line on stderr; None: only when stderr is a terminal.

    Returns:
        A :class:`scheduling.Profile` whose subnets carry ``config`` (the config's ``to_dict()``) and whose
        metadata records the device, torch version, threads, warm-up, repeats, rounds, trim, and ``"noise"``:
        ``rel_spread`` per entry (``[subnet id, batch size, (p90 - p10) / median]``), its median and maximum, the
        entries the monotone fit corrected, and the load average (1 min) before and after (``None`` where the OS has
        none).

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
    for arg, value, low in (("warmup", warmup, 0), ("repeats", repeats, 1), ("rounds", rounds, 1)):
        if not is_int(value) or value < low:
            raise ConfigError(f"{arg}={value!r} must be an int >= {low}")
    if not is_real(trim) or not 0.0 <= trim < 0.5:
        raise ConfigError(f"trim={trim!r} must be a number with 0 <= trim < 0.5 (the fraction cut at each end)")
    rounds = min(rounds, repeats)
    device = _device(model, device)
    make_input = _input_maker(example_input, device)

    entries = [(i, b) for i in range(len(configs)) for b in batch_sizes]
    load_before = _load_average()
    samples = _time_entries(model, configs, entries, make_input, device, warmup, repeats, rounds, progress)
    stats = {e: _trimmed_stats(s, trim) for e, s in samples.items()}  # (mean, std, p99)
    corrected = _monotone_fit(stats, ids, batch_sizes, len(configs)) if monotone else []
    table: dict[int, dict[int, Any]] = {i: {} for i in range(len(configs))}
    for (i, b), (mean, std, p99) in stats.items():
        keep = tuple(samples[(i, b)]) if keep_samples else None
        table[i][b] = LatencyStats(mean, p99_s=max(p99, mean), std_s=std, samples_s=keep)
    spreads = [[ids[i], b, _rel_spread(samples[(i, b)])] for i, b in entries]
    rel = sorted(x[2] for x in spreads)

    metadata = {
        "device": _device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "warmup": warmup,
        "repeats": repeats,
        "rounds": rounds,
        "trim": trim,
        "source": "subnetact.profile",
        "noise": {
            "rel_spread": spreads,
            "median_rel_spread": rel[len(rel) // 2],
            "max_rel_spread": rel[-1],
            "corrected": corrected,
            "load_average_before": load_before,
            "load_average_after": _load_average(),
        },
    }
    subnet_rows = [Subnet(ids[i], accs[i], table[i], configs[i].to_dict()) for i in range(len(configs))]
    return Profile(tuple(subnet_rows), name=name, metadata=metadata)


def _time_entries(
    model: nn.Module,
    configs: list[SubnetConfig],
    entries: list[tuple[int, int]],
    make_input: Callable[[int], tuple[tuple, dict]],
    device: torch.device,
    warmup: int,
    repeats: int,
    rounds: int,
    progress: bool | None,
) -> dict[tuple[int, int], list[float]]:
    """The timed forwards of :func:`profile`: ``(subnet index, batch size) -> seconds`` per timed forward, the repeats
    spread over ``rounds`` passes over every entry (the model's training flag restored after)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    # Round r times repeats // rounds forwards of every entry, the first (repeats % rounds) rounds one more.
    per_round = [repeats // rounds + (r < repeats % rounds) for r in range(rounds)]
    bar = Progress(len(entries) * (rounds + (warmup > 0)), "profiling", enabled=progress)
    was_training = model.training
    model.eval()
    samples: dict[tuple[int, int], list[float]] = {e: [] for e in entries}
    try:
        with torch.inference_mode():
            inputs = {b: make_input(b) for b in dict.fromkeys(b for _, b in entries)}
            if warmup:
                for i, b in entries:
                    args, kwargs = inputs[b]
                    for _ in range(warmup):
                        model(*args, subnet=configs[i], **kwargs)
                    bar.update()
            for r in range(rounds):
                for i, b in entries:
                    args, kwargs = inputs[b]
                    cfg = configs[i]
                    if warmup:
                        model(*args, subnet=cfg, **kwargs)
                    sync(device)
                    for _ in range(per_round[r]):
                        start = time.perf_counter()
                        model(*args, subnet=cfg, **kwargs)
                        sync(device)
                        samples[(i, b)].append(time.perf_counter() - start)
                    bar.update()
    finally:
        bar.close()
        model.train(was_training)
    return samples


def _subnets(model: nn.Module, subnets: SubnetsArg) -> tuple[list[int | str], list[SubnetConfig]]:
    if isinstance(subnets, Mapping):
        ids, raw = list(subnets.keys()), list(subnets.values())
    elif isinstance(subnets, Sequence) and not isinstance(subnets, (str, bytes)):
        ids, raw = list(range(len(subnets))), list(subnets)
    else:
        raise ConfigError(f"subnets={subnets!r} must be a sequence of SubnetConfigs or a mapping id -> SubnetConfig")
    if not raw:
        raise ConfigError("subnets is empty: give at least one SubnetConfig to profile")
    space = model.space
    configs = [space.validate(c if isinstance(c, SubnetConfig) else SubnetConfig.from_dict(c)) for c in raw]
    return ids, configs


def _batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    if isinstance(batch_sizes, (int, str, bytes)) or not isinstance(batch_sizes, Sequence) or not batch_sizes:
        raise ConfigError(f"batch_sizes={batch_sizes!r} must be a non-empty sequence of ints >= 1, e.g. (1, 4, 16)")
    for b in batch_sizes:
        if not is_int(b) or b < 1:
            raise ConfigError(f"batch_sizes={batch_sizes!r}: every batch size must be an int >= 1, got {b!r}")
    if len(set(batch_sizes)) != len(batch_sizes):
        raise ConfigError(f"batch_sizes={batch_sizes!r} has duplicates")
    return sorted(batch_sizes)


def _accuracies(accuracies: Any, ids: list[int | str]) -> list[float]:
    if accuracies is None:
        return [0.0] * len(ids)
    if isinstance(accuracies, Mapping):
        missing = [i for i in ids if i not in accuracies]
        if missing:
            raise ConfigError(f"accuracies has no entry for subnet id(s) {missing!r}; it has {list(accuracies)!r}")
        values = [accuracies[i] for i in ids]
    else:
        values = list(accuracies)
        if len(values) != len(ids):
            raise ConfigError(f"accuracies has {len(values)} values for {len(ids)} subnets; give one per subnet")
    for i, v in zip(ids, values):
        if not is_real(v) or not math.isfinite(v):
            raise ConfigError(f"accuracies[{i!r}]={v!r} must be a finite number")
    return [float(v) for v in values]


def _device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    param = next(model.parameters(), None)
    model_device = param.device if param is not None else torch.device("cpu")
    if device is None:
        return model_device
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device: {exc}") from None
    if device.type != model_device.type or (device.index is not None and device.index != model_device.index):
        raise ConfigError(
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
        raise ConfigError(f"example_input(batch_size) returned {type(x).__name__}; expected a tensor, tuple or dict")

    if isinstance(example_input, torch.Tensor):
        if example_input.dim() == 0 or example_input.shape[0] < 1:
            raise ConfigError(
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
    raise ConfigError(
        f"example_input={type(example_input).__name__} must be a tensor with a batch dimension or a callable "
        "batch_size -> input"
    )


def _trimmed_stats(samples: list[float], trim: float) -> tuple[float, float, float]:
    """(mean, std) of ``samples`` without the ``trim`` fraction at each end, and the nearest-rank p99 of all."""
    ordered = sorted(samples)
    n = len(ordered)
    cut = int(trim * n)
    kept = ordered[cut : n - cut]
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((s - mean) ** 2 for s in kept) / len(kept))
    p99 = ordered[max(1, math.ceil(0.99 * n)) - 1]
    return mean, std, p99


def _rel_spread(samples: list[float]) -> float:
    """(p90 - p10) / median of the samples (nearest rank): a scale-free noise level, robust to a few outliers."""
    ordered = sorted(samples)
    n = len(ordered)

    def q(p: float) -> float:
        return ordered[max(1, math.ceil(p * n)) - 1]

    return (q(0.9) - q(0.1)) / q(0.5)


def _monotone_fit(
    stats: dict[tuple[int, int], tuple[float, float, float]], ids: list[int | str], batch_sizes: list[int], n: int
) -> list[dict[str, Any]]:
    """Pool adjacent violators so each subnet's mean never falls as the batch grows (P1); update ``stats`` in place.

    Returns one record per changed entry and warns once naming all of them. p99 and std move by the same factor as
    the mean.
    """
    from scheduling import ProfilePropertyWarning

    corrected = []
    for i in range(n):
        means = [stats[(i, b)][0] for b in batch_sizes]
        fitted = _isotonic(means)
        for b, m, f in zip(batch_sizes, means, fitted, strict=True):
            if f != m:
                mean, std, p99 = stats[(i, b)]
                stats[(i, b)] = (f, std * f / mean, p99 * f / mean)
                corrected.append({"subnet": ids[i], "batch_size": b, "measured_s": m, "fitted_s": f})
    if corrected:
        named = "; ".join(
            f"subnet {c['subnet']!r} batch {c['batch_size']}: {1e3 * c['measured_s']:.3f} -> "
            f"{1e3 * c['fitted_s']:.3f} ms"
            for c in corrected
        )
        warnings.warn(
            f"profile: latency fell as the batch grew (P1) for some subnets, a sign of a noisy machine; the monotone "
            f"fit changed {len(corrected)} entr{'y' if len(corrected) == 1 else 'ies'}: {named}",
            ProfilePropertyWarning,
            stacklevel=3,
        )
    return corrected


def _isotonic(values: list[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks[-1]
            blocks[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    out: list[float] = []
    for m, c in blocks:
        out += [m] * int(c)
    return out


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every OS
        return None


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({platform.processor() or platform.machine()})"
