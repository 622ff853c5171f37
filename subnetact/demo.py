"""``subnetact demo``: the whole SuperServe idea on real data, on this machine, in a couple of minutes.

1. Load the embedded digits supernet (:mod:`subnetact.digits`) with its calibrated Pareto set.
2. Profile the Pareto set on this CPU (:func:`subnetact.profile`); each subnet's accuracy in the profile is the one
   the Pareto search ranked it by (augmented views of the validation images; see :func:`subnetact.digits.info`).
3. For each policy (SlackFit, MinCost, and Fixed on every subnet), start the live :class:`scheduling.Scheduler` with
   real inference workers (threads calling ``model(x, subnet=cfg)`` on one shared model) and replay the same bursty
   trace of held-out digits (:func:`subnetact.digits.test_set`: rotated, scaled, shifted and noisy views of the test
   split, disjoint from the training and validation images), each request with the same SLO. ``trials`` (3) traces
   (seeds ``seed``, ``seed + 1``, ...) are replayed, every policy on each trial before the next trial starts, so a
   change in how busy the machine is affects all policies alike; each trial starts one policy later than the one
   before (no policy always runs first), and each run starts after a full garbage collection with the survivors
   frozen (a collection of the whole process inside a run stalls it, whichever policy runs).
4. Print, per policy, the mean over the trials of: SLO attainment (with its standard deviation), accuracy against
   the true labels of the requests answered within their SLO and the profile's (validation) accuracy of the subnets
   that answered them, p50/p99 latency of the answered requests and throughput, with a mark on the policies on the
   attainment/accuracy frontier (no other policy has better attainment at no lower accuracy, or better accuracy at
   no lower attainment). Write ``results.json`` (with every trial's values), ``frontier.png`` (attainment against
   accuracy of every policy, error bars one standard deviation over the trials) and ``dynamics.png``: the system
   dynamics (ingest rate, each request's latency against the SLO, accuracy of the chosen subnet, batch size over
   time) of SlackFit beside those of MinCost and of Fixed on the most accurate subnet, on the first trial.

``slackfit`` is the default, backlog-aware SlackFit, which plans with its own :class:`scheduling.LatencyModel`;
``slackfit-paper`` is the paper's rule (slack only, no latency feedback), for comparison (``slackfit-adaptive``, the
paper-era name for SlackFit with a latency model, is still accepted). With ``background_load`` the demo starts that
many busy processes after profiling and stops them at the end, so the machine changes under the profile and the rows
show what feedback buys.

Load and SLO (:mod:`subnetact.demo_load`): unless given, both are derived from the profile just measured, so the
trade-off shows on any machine. The SLO is twice the most accurate subnet's p99 latency at batch 16 (at least 50 ms,
for the OS pauses a shared CPU inflicts); the mean rate is 0.8 x the most accurate subnet's capacity within that SLO,
but at most half the least accurate subnet's. So the bursts (CV² 8) exceed what the most accurate subnet can serve in
time, and the mean is within reach of the smaller ones. ``rate``/``slo_ms`` set them explicitly, and ``load`` /
``slo_factor`` relative to the most accurate subnet's batch-16 throughput and latency. The demo prints in what
fraction of the SLO-long windows the rate exceeds the most accurate subnet's capacity (measured on this machine, at
start) and warns when none does: then no policy needs to trade accuracy for attainment, and the rows differ by noise.
"""

from __future__ import annotations

import gc
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from . import digits
from .checks import is_int
from .config import SubnetConfig
from .demo_load import capacity_within_slo, derive_load
from .errors import ConfigError
from .profiler import profile

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class PolicyResult:
    """One row of the demo's table: one policy's run, or the mean of its trials (:func:`combine_trials`)."""

    policy: str
    requests: int
    slo_attainment: float
    accuracy: float  # % correct against the true labels, over requests answered within their SLO
    profile_accuracy: float  # mean profiled (validation) accuracy of the subnets that answered them on time
    latency_p50_ms: float
    latency_p99_ms: float
    throughput: float  # answered requests per second of trace
    dropped: int
    late: int
    mean_batch_size: float
    # Per trial (one value each; a single run has one): what the means above and the error bars come from.
    attainment_trials: tuple[float, ...] = ()
    accuracy_trials: tuple[float, ...] = ()

    @property
    def slo_attainment_std(self) -> float:
        """Sample standard deviation of the attainment over the trials (0 for one trial)."""
        return _std(self.attainment_trials)

    @property
    def accuracy_std(self) -> float:
        """Sample standard deviation of the label accuracy over the trials (0 for one trial)."""
        return _std(self.accuracy_trials)


def _std(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    if len(finite) < 2:
        return 0.0
    mean = sum(finite) / len(finite)
    return math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def combine_trials(runs: Sequence[PolicyResult]) -> PolicyResult:
    """One row from the runs of one policy over several trials: means (requests, dropped and late are totals)."""
    return PolicyResult(
        policy=runs[0].policy,
        requests=sum(r.requests for r in runs),
        slo_attainment=_mean([r.slo_attainment for r in runs]),
        accuracy=_mean([r.accuracy for r in runs]),
        profile_accuracy=_mean([r.profile_accuracy for r in runs]),
        latency_p50_ms=_mean([r.latency_p50_ms for r in runs]),
        latency_p99_ms=_mean([r.latency_p99_ms for r in runs]),
        throughput=_mean([r.throughput for r in runs]),
        dropped=sum(r.dropped for r in runs),
        late=sum(r.late for r in runs),
        mean_batch_size=_mean([r.mean_batch_size for r in runs]),
        attainment_trials=tuple(r.slo_attainment for r in runs),
        accuracy_trials=tuple(r.accuracy for r in runs),
    )


@dataclass(frozen=True)
class DemoResult:
    rows: tuple[PolicyResult, ...]
    settings: dict[str, Any]
    profile_path: Path
    results_path: Path
    plot_path: Path | None
    seconds: float
    frontier_path: Path | None = None


def run_demo(
    *,
    duration_s: float = 3.0,
    rate: float | None = None,
    load: float | None = None,
    cv2: float = 8.0,
    slo_ms: float | None = None,
    slo_factor: float | None = None,
    latency_stat: str = "p99",
    policies: Sequence[str] | None = None,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    workers: int = 1,
    threads: int = 1,
    repeats: int = 15,
    background_load: int = 0,
    seed: int = 0,
    out_dir: str | Path = "subnetact-demo",
    plot: bool = True,
    stream: TextIO | None = None,
    trials: int = 3,
) -> DemoResult:
    """Run the demo and return its results (also printed to ``stream`` and written to ``out_dir``).

    Args:
        duration_s: length of each trial's trace, seconds (> 0). Default 3: with 3 trials, about as long per policy
            as the single 8-second trace the demo replayed before (issue 20).
        rate: mean arrival rate, requests/s; ignored when ``load`` is given. Default (both ``None``): derived from
            the profile (:func:`subnetact.demo_load.derive_load`).
        load: if given, the rate is ``load`` x the most accurate subnet's throughput at batch 16 in the profile.
        cv2: burstiness (squared coefficient of variation) of the trace's variable stream (>= 0). The trace is
            :func:`scheduling.traces.bursty` with half of the rate constant and half gamma-distributed.
        slo_ms: the latency SLO of every request, ms; ignored when ``slo_factor`` is given. Default (both ``None``):
            derived from the profile.
        slo_factor: if given, the SLO is ``slo_factor`` x the most accurate subnet's batch-16 latency in the profile.
        latency_stat: ``"p99"`` (default) or ``"mean"``: the profiled latency every policy plans with. On a shared
            CPU the p99 leaves room for the jitter that makes mean-planned batches finish late.
        policies: any name :func:`scheduling.make_policy` knows (``"slackfit"``, ``"maxacc"``, ``"maxbatch"``,
            ``"mincost"``, a registered one), ``"slackfit-adaptive"`` (with a :class:`scheduling.LatencyModel`),
            ``"fixed"`` (every subnet) and ``"fixed:<id>"``; default: SlackFit, adaptive
            SlackFit, MinCost and Fixed on every subnet.
        batch_sizes: batch sizes to profile (the policies choose among them).
        workers: inference worker threads (each runs one batch at a time on the shared model).
        threads: torch intra-op threads (``torch.set_num_threads``).
        repeats: timed forwards per (subnet, batch size) when profiling.
        background_load: busy-looping processes to run during the policy runs (started after profiling, stopped at
            the end, even on error); 0 (default) runs on the machine as it is.
        seed: seeds the first trial's trace and which held-out images are requested (trial ``t``: ``seed + t``).
        out_dir: where ``profile.json``, ``results.json``, ``dynamics.png`` and ``frontier.png`` go (created).
        plot: write the PNGs (need matplotlib; skipped with a note if it is not installed).
        stream: where the table and progress go (default stdout).
        trials: traces replayed per policy (>= 1; default 3); the table shows means, the frontier plot error bars.
    """
    from scheduling import traces
    from scheduling.metrics import rate_series

    out = sys.stdout if stream is None else stream
    start = time.perf_counter()
    _check_settings(duration_s, cv2, rate, load, slo_ms, slo_factor, latency_stat, workers, threads, repeats, trials)
    if not is_int(background_load) or background_load < 0:
        raise ConfigError(f"background_load={background_load!r} must be an int >= 0 (busy processes to start)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads)

    # -- model, data, profile -------------------------------------------------------------------------------------
    model, record = digits.load_supernet()
    images, labels = digits.test_set(record)  # augmented views of the test split, and their true labels
    x_test = digits.to_input(images)  # (N, 1, 8, 8)
    served = [SubnetConfig.from_dict(r["config"]) for r in record["pareto"]]
    accuracies = [float(r["accuracy"]) for r in record["pareto"]]
    chosen = _policy_names(policies, len(served))
    print(
        f"digits supernet: {len(served)} Pareto subnets, {len(labels)} held-out images; profiling on this CPU ...",
        file=out,
    )
    prof = profile(
        model,
        served,
        list(batch_sizes),
        example_input=x_test[:1],
        accuracies=accuracies,
        repeats=repeats,
        name="digits supernet",
    )
    profile_path = out_dir / "profile.json"
    prof.save(profile_path)
    largest = max(range(len(served)), key=lambda i: accuracies[i])
    ref_b = 16 if 16 in prof.batch_sizes else max(prof.batch_sizes)
    for i in range(len(served)):
        lat = ", ".join(f"b{b} {1e3 * prof.latency(i, b):.1f}" for b in prof.batch_sizes)
        print(f"  subnet {i}: accuracy (val) {accuracies[i]:.2f}%  latency ms: {lat}", file=out)
    if load is not None:
        rate = load * ref_b / prof.latency(largest, ref_b)
    if slo_factor is not None:
        slo_ms = slo_factor * 1e3 * prof.latency(largest, ref_b)
    derived = None
    if rate is None or slo_ms is None:
        derived = derive_load(
            prof, workers=workers, latency_stat=latency_stat, slo_s=None if slo_ms is None else slo_ms / 1e3
        )
        print(f"load from the profile: {derived.describe()}", file=out)
        rate = derived.rate if rate is None else rate
        slo_ms = 1e3 * derived.slo_s
    slo_s = slo_ms / 1e3

    # -- the traces ------------------------------------------------------------------------------------------------
    traces_ = []
    for t in range(trials):
        arrivals = traces.bursty(rate / 2, rate / 2, cv2=cv2, duration_s=duration_s, seed=seed + t)
        rng = random.Random(seed + t)
        traces_.append((arrivals, [rng.randrange(len(labels)) for _ in arrivals]))
    n_requests = [len(a) for a, _ in traces_]
    print(
        f"traces: {trials} x bursty, {min(n_requests)}-{max(n_requests)} requests in {duration_s:g}s each (mean "
        f"{rate:.0f} req/s, CV2 {cv2:g}), SLO {slo_ms:.1f} ms, {workers} worker(s), policies plan with "
        f"{latency_stat} latency",
        file=out,
    )
    top_capacity, _ = capacity_within_slo(prof, largest, slo_s, workers=workers, latency_stat=latency_stat)
    windows = [w for a, _ in traces_ for w in rate_series(a, slo_s, end=duration_s)]
    over_top = sum(r > top_capacity for _, r in windows) / max(len(windows), 1)
    print(
        f"bursts: in {100 * over_top:.0f} % of the SLO-long windows the rate exceeds what the most accurate subnet "
        f"can serve within the SLO ({top_capacity:.0f} req/s, from the profile measured now)",
        file=out,
    )
    if over_top == 0:
        print(
            "warning: no burst exceeds the most accurate subnet's capacity, so no policy needs to trade accuracy for "
            "attainment and the rows differ by noise; raise --load, --rate or --cv2",
            file=out,
        )

    # -- every policy on each trial ----------------------------------------------------------------------------------
    runs: dict[str, list[PolicyResult]] = {name: [] for name in chosen}
    timelines: dict[str, tuple[list, list]] = {}
    hogs = _start_background_load(background_load, out)
    try:
        for t, (arrivals, requested) in enumerate(traces_):
            # Each trial starts one policy later, so no policy always runs first (after profiling, or after the
            # previous trial's most overloaded run) or always at the same point of the process's life.
            order = chosen[t % len(chosen) :] + chosen[: t % len(chosen)]
            trial_rows, trial_timelines = _run_policies(
                order, latency_stat, out, f"trial {t + 1}/{trials} ", model, served, prof, x_test, labels,
                arrivals, requested, slo_s, workers,
            )  # fmt: skip
            for row in trial_rows:
                runs[row.policy].append(row)
            if t == 0:
                timelines = trial_timelines
    finally:
        _stop_background_load(hogs)
        gc.unfreeze()
    rows = [combine_trials(runs[name]) for name in chosen]

    # -- report ----------------------------------------------------------------------------------------------------
    print("\n" + format_table(rows), file=out)
    print(format_dominance(rows), file=out)
    settings = {
        "duration_s": duration_s,
        "rate": rate,
        "cv2": cv2,
        "slo_ms": slo_ms,
        "latency_stat": latency_stat,
        "workers": workers,
        "threads": threads,
        "seed": seed,
        "trials": trials,
        "background_load": background_load,
        "load_from_profile": derived.describe() if derived is not None else None,
        "windows_over_top_capacity": over_top,
        "requests": sum(n_requests),
        "device": prof.metadata.get("device"),
    }
    results_path = out_dir / "results.json"
    dominated = {r.policy: by for r, by in zip(rows, dominated_beyond_noise(rows), strict=True)}
    results_path.write_text(
        json.dumps({"settings": settings, "rows": [asdict(r) for r in rows], "dominated_by": dominated}, indent=1)
        + "\n"
    )
    plot_path = frontier_path = None
    if plot:
        shown = [n for n in ("slackfit", "mincost", f"fixed:{largest}") if n in timelines] or list(timelines)[:1]
        first_arrivals = traces_[0][0]
        plot_path = _plot([(n, timelines[n]) for n in shown], first_arrivals, slo_s, out_dir / "dynamics.png", out)
        if plot_path is not None:
            frontier_path = _plot_frontier(rows, out_dir / "frontier.png")
    seconds = time.perf_counter() - start
    written = [profile_path, results_path, *(p for p in (plot_path, frontier_path) if p is not None)]
    print(f"wrote {', '.join(map(str, written))} ({seconds:.0f}s)", file=out)
    return DemoResult(tuple(rows), settings, profile_path, results_path, plot_path, seconds, frontier_path)


def _check_settings(
    duration_s: Any,
    cv2: Any,
    rate: Any,
    load: Any,
    slo_ms: Any,
    slo_factor: Any,
    latency_stat: Any,
    workers: Any,
    threads: Any,
    repeats: Any,
    trials: Any,
) -> None:
    """Raise :class:`ConfigError` naming the first of :func:`run_demo`'s settings that is not valid."""
    for name, value, positive in (("duration_s", duration_s, True), ("cv2", cv2, False)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise ConfigError(f"{name}={value!r} must be a finite number {'> 0' if positive else '>= 0'}")
    for name, value in (("rate", rate), ("load", load), ("slo_ms", slo_ms), ("slo_factor", slo_factor)):
        if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"{name}={value!r} must be a finite number > 0")
    if latency_stat not in ("mean", "p99"):
        raise ConfigError(f"latency_stat={latency_stat!r} must be 'mean' or 'p99'")
    for name, value in (("workers", workers), ("threads", threads), ("repeats", repeats), ("trials", trials)):
        if not is_int(value) or value < 1:
            raise ConfigError(f"{name}={value!r} must be an int >= 1")


def _run_policies(
    chosen: list[str], latency_stat: str, out: TextIO, label: str, model: torch.nn.Module, *run: Any
) -> tuple[list[PolicyResult], dict[str, tuple[list, list]]]:
    """One live run per policy name on one trace (``run``: the rest of :func:`_run_policy`'s arguments after the
    policy); ``label`` prefixes each progress line. Returns the rows and each policy's timeline."""
    from scheduling import LatencyModel, make_policy

    prof = run[1]
    rows = []
    timelines = {}
    for name in chosen:
        adaptive = name.endswith(ADAPTIVE)
        policy = make_policy(name.removesuffix(ADAPTIVE), prof, latency_stat=latency_stat)
        latency_model = LatencyModel(prof) if adaptive else None
        # A full garbage collection inside a run stalls the whole process (submitter and workers): measured 0.5-1.7 s
        # with torch loaded on a busy 2-core machine, landing on whichever policy was running. Collect now, outside
        # the timed run, and freeze what survives (the model, the traces, earlier results), so that the collections
        # a run triggers only scan the objects it made.
        gc.collect()
        gc.freeze()
        row, timelines[name] = _run_policy(name, policy, model, *run, latency_model)
        rows.append(row)
        print(
            f"  {label}{name:>17}: attainment {row.slo_attainment:.4f}, accuracy {row.accuracy:.2f}%, "
            f"p99 {row.latency_p99_ms:.1f} ms",
            file=out,
        )
    return rows, timelines


def frontier(rows: Sequence[PolicyResult]) -> list[bool]:
    """Per row, whether it is on the attainment/accuracy frontier: no other row has higher attainment at no lower
    accuracy, or higher accuracy at no lower attainment."""

    def dominates(o: PolicyResult, r: PolicyResult) -> bool:
        return (o.slo_attainment > r.slo_attainment and o.accuracy >= r.accuracy) or (
            o.accuracy > r.accuracy and o.slo_attainment >= r.slo_attainment
        )

    return [not any(dominates(o, r) for o in rows if o is not r) for r in rows]


ATTAINMENT_FLOOR = 0.0005
"""A difference in SLO attainment counts as beyond noise only if it also exceeds this (as in the simulator's
dominance grid, ``benchmarks/scheduling/dominance_grid.py``)."""
ACCURACY_FLOOR = 0.05
"""The same floor for label accuracy, in percentage points."""


def _paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the per-trial differences ``a - b`` (trials where either is nan are left out)."""
    d = [x - y for x, y in zip(a, b) if not (math.isnan(x) or math.isnan(y))]
    if not d:
        return math.nan, math.nan
    return sum(d) / len(d), _std(d) / math.sqrt(len(d))


def dominated_beyond_noise(rows: Sequence[PolicyResult]) -> list[list[str]]:
    """Per row, the policies that dominate it beyond trial-to-trial noise: at least as good on both mean attainment
    and mean label accuracy, and better on one by more than twice the standard error of the per-trial differences
    plus a floor (:data:`ATTAINMENT_FLOOR`, :data:`ACCURACY_FLOOR`). The differences are paired: every policy replays
    the same trace in a trial. The rule is the simulator grid's (its seeds are the demo's trials)."""
    out = []
    for r in rows:
        by = []
        for o in rows:
            if o is r or len(o.attainment_trials) != len(r.attainment_trials):
                continue
            att, att_se = _paired(o.attainment_trials, r.attainment_trials)
            acc, acc_se = _paired(o.accuracy_trials, r.accuracy_trials)
            if math.isnan(att) or math.isnan(acc) or att < 0 or acc < 0:
                continue
            if att > 2 * att_se + ATTAINMENT_FLOOR or acc > 2 * acc_se + ACCURACY_FLOOR:
                by.append(o.policy)
        out.append(by)
    return out


def format_dominance(rows: Sequence[PolicyResult]) -> str:
    """One line per row dominated beyond noise (:func:`dominated_beyond_noise`), or one line saying none is. A
    SlackFit row's line also gives each paired difference (mean ± standard error)."""
    lines = []
    for r, by in zip(rows, dominated_beyond_noise(rows), strict=True):
        if by and r.policy.startswith("slackfit"):
            parts = []
            for name in by:
                o = next(x for x in rows if x.policy == name)
                att, att_se = _paired(o.attainment_trials, r.attainment_trials)
                acc, acc_se = _paired(o.accuracy_trials, r.accuracy_trials)
                parts.append(f"{name} (attainment {att:+.4f} ± {att_se:.4f}, accuracy {acc:+.2f} ± {acc_se:.2f})")
            lines.append(f"  {r.policy} by {', '.join(parts)}")
        elif by:
            lines.append(f"  {r.policy} by {', '.join(by)}")
    trials = max((len(r.attainment_trials) for r in rows), default=1)
    head = (
        f"dominated beyond trial-to-trial noise (paired over {trials} trial(s): better by > 2 standard errors + "
        f"{ATTAINMENT_FLOOR:g} attainment or {ACCURACY_FLOOR:g} points, no worse on the other):"
    )
    return head + ("\n" + "\n".join(lines) if lines else " none")


def format_table(rows: Sequence[PolicyResult]) -> str:
    """The demo's results as a fixed-width text table; ``*`` marks the attainment/accuracy frontier.

    ``accuracy %`` is measured against the true labels of the on-time answers; ``val acc %`` is the profile's
    (validation) accuracy of the subnets that gave them, what the policies chose by. ``± sd`` is the standard deviation
    of the attainment over the trials.
    """
    names = ("SLO attain.", "± sd", "accuracy %", "val acc %", "p50 ms", "p99 ms", "req/s", "dropped")
    head = f"{'policy':<19} " + " ".join(f"{n:>{max(8, len(n))}}" for n in names)
    lines = [head, "-" * len(head)]
    for r, best in zip(rows, frontier(rows), strict=True):
        lines.append(
            f"{r.policy + (' *' if best else ''):<19} {r.slo_attainment:>11.4f} {r.slo_attainment_std:>8.4f} "
            f"{r.accuracy:>10.2f} {r.profile_accuracy:>9.2f} {r.latency_p50_ms:>8.1f} {r.latency_p99_ms:>8.1f} "
            f"{r.throughput:>8.0f} {r.dropped:>8d}"
        )
    lines.append("* on the attainment/accuracy frontier (no other policy is better on one and no worse on the other)")
    return "\n".join(lines)


def _start_background_load(n: int, out: TextIO) -> list[subprocess.Popen]:
    """Start ``n`` busy-looping Python processes (a co-located job competing for the CPU)."""
    if n:
        print(f"background load: starting {n} busy process(es) for the policy runs", file=out)
    return [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(n)
    ]


def _stop_background_load(hogs: list[subprocess.Popen]) -> None:
    for p in hogs:
        p.kill()
    for p in hogs:
        p.wait()


#: A policy name plus this suffix: the policy plans with an online :class:`scheduling.LatencyModel`.
ADAPTIVE = "-adaptive"


def _policy_names(policies: Sequence[str] | None, n: int) -> list[str]:
    """The policy runs of the demo (``policies`` None: its default set), each a :func:`scheduling.make_policy` name,
    ``"slackfit-adaptive"`` or ``"fixed:<i>"`` for the ``n`` served subnets."""
    from scheduling import policy_names

    if policies is None:
        return ["slackfit", "slackfit-paper", "mincost", *(f"fixed:{i}" for i in range(n))]
    plain = [p for p in policy_names() if ":" not in p]
    known = {*plain, "slackfit" + ADAPTIVE, *(f"fixed:{i}" for i in range(n))}
    names: list[str] = []
    for p in policies:
        key = p.strip().lower()
        if key == "fixed":
            names += [f"fixed:{i}" for i in range(n)]
        elif key in known:
            names.append(key)
        else:
            others = [p for p in plain if p != "slackfit"]
            allowed = ["slackfit", "slackfit" + ADAPTIVE, *others, "fixed", *(f"fixed:{i}" for i in range(n))]
            raise ConfigError(f"policies contains {p!r}; allowed: {', '.join(allowed)}")
    if not names:
        raise ConfigError("policies is empty; give at least one of slackfit, mincost, maxacc, fixed, fixed:<id>")
    return list(dict.fromkeys(names))


def _run_policy(
    name: str,
    policy: Any,
    model: torch.nn.Module,
    served: list[SubnetConfig],
    prof: Any,
    x_test: torch.Tensor,
    labels: Any,
    arrivals: list[float],
    requested: list[int],
    slo_s: float,
    workers: int,
    latency_model: Any = None,
) -> tuple[PolicyResult, list]:
    from scheduling import Scheduler

    def infer(subnet_id: int, payloads: list[int]) -> list[int]:
        idx = torch.tensor(payloads)
        with torch.inference_mode():
            logits = model(x_test.index_select(0, idx), subnet=served[subnet_id])  # (B, 10)
        return logits.argmax(1).tolist()

    n = len(arrivals)
    done_at = [math.nan] * n
    submitted_at = [0.0] * n

    def on_done(i: int):
        def callback(_fut) -> None:
            done_at[i] = time.monotonic()

        return callback

    # No model given: the Scheduler's default, so each policy runs as users get it (one that wants a latency model
    # gets one).
    options = {} if latency_model is None else {"latency_model": latency_model}
    sched = Scheduler(policy, [infer] * workers, record_timeline=True, **options)
    futures = []
    t0 = time.monotonic() + 0.05
    try:
        for i, (t, image) in enumerate(zip(arrivals, requested)):
            delay = t0 + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            submitted_at[i] = time.monotonic()
            fut = sched.submit(image, slo_s=slo_s)
            fut.add_done_callback(on_done(i))
            futures.append(fut)
    finally:
        sched.close(drain=True)
    wall = max((t for t in done_at if not math.isnan(t)), default=time.monotonic()) - t0
    m = sched.metrics()
    correct = on_time = 0
    for i, fut in enumerate(futures):
        if fut.cancelled() or fut.exception() is not None:
            continue
        if done_at[i] - submitted_at[i] <= slo_s:
            on_time += 1
            correct += int(fut.result() == int(labels[requested[i]]))
    row = PolicyResult(
        policy=name,
        requests=n,
        slo_attainment=m.slo_attainment,
        accuracy=100.0 * correct / on_time if on_time else math.nan,
        profile_accuracy=m.mean_accuracy,
        latency_p50_ms=1e3 * m.latency_p50_s,
        latency_p99_ms=1e3 * m.latency_p99_s,
        throughput=(m.on_time + m.late) / wall if wall > 0 else math.nan,
        dropped=m.dropped,
        late=m.late,
        mean_batch_size=m.mean_batch_size,
    )
    decisions = [(d.time - t0, prof.subnet(d.subnet_id).accuracy, d.batch_size) for d in sched.timeline()]
    latencies = [
        (submitted_at[i] - t0, done_at[i] - submitted_at[i])
        for i, fut in enumerate(futures)
        if not fut.cancelled() and fut.exception() is None
    ]
    return row, (decisions, latencies)


def _pyplot(out: TextIO, what: str) -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: skipping {what} (pip install matplotlib)", file=out)
        return None
    return plt


def _plot(
    timelines: list[tuple[str, tuple[list, list]]], arrivals: list[float], slo_s: float, path: Path, out: TextIO
) -> Path | None:
    """``dynamics.png``: one column per policy (SlackFit first, then the baselines), the same four panels each."""
    plt = _pyplot(out, "dynamics.png and frontier.png")
    if plt is None:
        return None
    from scheduling.metrics import rate_series

    bin_s = 0.25
    rates = rate_series(arrivals, bin_s)
    cols = len(timelines)
    fig, grid = plt.subplots(4, cols, figsize=(4.2 * cols + 1, 8.5), sharex=True, sharey="row", squeeze=False)
    for c, (name, (decisions, latencies)) in enumerate(timelines):
        axes = grid[:, c]
        axes[0].step([t for t, _ in rates], [r for _, r in rates], where="post")
        ok = [(t, 1e3 * lat) for t, lat in latencies if lat <= slo_s]
        late = [(t, 1e3 * lat) for t, lat in latencies if lat > slo_s]
        axes[1].plot([t for t, _ in ok], [v for _, v in ok], ".", markersize=1, label="within SLO")
        axes[1].plot([t for t, _ in late], [v for _, v in late], ".", markersize=2, color="tab:red", label="late")
        axes[1].axhline(1e3 * slo_s, color="black", linestyle="--", linewidth=1, label=f"SLO {1e3 * slo_s:.1f} ms")
        axes[2].plot([t for t, _, _ in decisions], [a for _, a, _ in decisions], ".", markersize=3)
        axes[3].plot([t for t, _, _ in decisions], [b for _, _, b in decisions], ".", markersize=3)
        axes[3].set_xlabel("time (s)")
        axes[0].set_title(name)
    grid[1, 0].legend(loc="upper right", fontsize=7)
    for ax, label in zip(
        grid[:, 0], ("ingest (req/s)", "request latency (ms)", "subnet accuracy (val, %)", "batch size"), strict=True
    ):
        ax.set_ylabel(label)
    fig.suptitle("serving the digits supernet: system dynamics (first trial)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_frontier(rows: Sequence[PolicyResult], path: Path) -> Path | None:
    """``frontier.png``: SLO attainment against label accuracy, one point per policy with one-standard-deviation error
    bars over the trials; the frontier's points filled."""
    plt = _pyplot(sys.stdout, "frontier.png")
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 5))
    for r, best in zip(rows, frontier(rows), strict=True):
        color = "tab:red" if r.policy.startswith("slackfit") else "tab:blue"
        ax.errorbar(
            r.accuracy,
            r.slo_attainment,
            xerr=r.accuracy_std,
            yerr=r.slo_attainment_std,
            fmt="o",
            color=color,
            mfc=color if best else "white",
            capsize=3,
        )
        ax.annotate(r.policy, (r.accuracy, r.slo_attainment), textcoords="offset points", xytext=(5, 4), fontsize=8)
    trials = max((len(r.attainment_trials) for r in rows), default=1)
    ax.set_xlabel("accuracy against the labels, on-time answers (%)")
    ax.set_ylabel("SLO attainment")
    ax.set_title(f"every policy, mean ± 1 sd over {trials} trial(s); filled: on the frontier")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
