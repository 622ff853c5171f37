"""Reproduce SuperServe's scheduling results (NSDI'25 Figs. 8-11, 1c) with the simulator and the A40 profile.

Experiments (``--experiments a,b,c,d,e,f``):

(a) bursty grid, Fig. 9: λ_b=1500, λ_v ∈ {2950, 4900, 5550}, CV² ∈ {2, 4, 8}, SLO 36 ms;
    SlackFit vs Clipper+ (Fixed, each of the 6 subnets) vs INFaaS (MinCost).
(b) time-varying grid, Fig. 10: λ1=2500 -> λ2 ∈ {4800, 6800, 7800} at τ ∈ {250, 500, 5000} q/s², CV²=8.
(c) MAF trace, Fig. 8: 24 h compressed to 120 s at mean 6400 q/s, plus the system-dynamics plot (Fig. 8c).
(d) policy space, Fig. 11c: SlackFit vs MaxAcc vs MaxBatch, λ_b=1500 + λ_v=5550, CV² ∈ {2, 4, 8}.
(e) fault tolerance, Fig. 11a: 8 workers, one killed every 12 s over 60 s.
(f) actuation delay, Fig. 1c: a coarse-grained load-indexed policy (GearPlan) with 100 ms vs 0 ms switching delay,
    and SlackFit, on a bursty MAF window.

Added by issue 12, each over ``--seeds`` (default 0 1 2), normally with ``--noise lognormal``:

(g) system dynamics (E5 = Fig. 8c, E6 = Fig. 13): the share of requests each subnet serves, over time and in total,
    for SlackFit and the literal rule, plus a rate sweep and SlackFit's choice table (why the 80.16 % subnet appears).
(h) App. B (E10): MAF at 4000 q/s, SLO 30 ms, 6 workers; SlackFit vs Clipper+ on each subnet and INFaaS.
(i) interference: half the workers 1.5x slower for the middle third of the bursty grid's traces; SlackFit with and
    without a LatencyModel (and the same grid without interference).
(j) the Clipper+(76.69) and Clipper+(78.25) drops of Fig. 9: their cells at 1x to 2.5x the paper's rates.

Added by issue 20 (the default SlackFit is backlog-aware and plans at the p99 with its own LatencyModel; every
experiment that compares policies also runs ``SlackFit-paper``, the paper's bucket rule, queue-aware, at the mean):

(g) also draws Fig. 13's batch-size panels; (h) also records the head's slack at every decision (Figs. 14-15).
(k) Fig. 11b: the highest constant rate (CV² = 0) each worker count serves at >= 0.999 attainment, by bisection.
(l) Fig. 1b: SLO misses as the actuation delay grows from 0 to 100 ms, on the bursty MAF hour of (f).

Everything is seeded; every run uses 8 workers (except (h) and (k)), the SuperServe authors' A40 OFA-ResNet50
profile with worker latency = h2d + forward + postprocess + d2h (no JPEG decode), SLO 36 ms (except (h)) and the drop
rule. Example::

    python benchmarks/scheduling/reproduce.py --experiments a,b,c,d,e,f --jobs 2 \\
        --figures docs/figures --json docs/figures/reproduction_results.json
    python benchmarks/scheduling/reproduce.py --experiments h,g --noise lognormal --seeds 0 1 2 --jobs 2 \\
        --figures docs/figures --json docs/figures/reproduction_results_gh.json
    python benchmarks/scheduling/reproduce.py --experiments i,j --noise lognormal --seeds 0 1 2 --jobs 2 \\
        --figures docs/figures --json docs/figures/reproduction_results_ij.json
    python benchmarks/scheduling/reproduce.py --experiments k,l --noise lognormal --seed 0 --jobs 2 \\
        --figures docs/figures --json docs/figures/reproduction_results_issue20.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from scheduling import (
    Fixed,
    GearPlan,
    Interference,
    LatencyModel,
    MaxAcc,
    MaxBatch,
    MinCost,
    SimConfig,
    SlackFit,
    datasets,
    simulate,
    traces,
)
from scheduling.metrics import rate_series, subnet_share_series, subnet_shares, windowed_outcomes

SLO = 0.036
WORKERS = 8
PROFILE = datasets.superserve_a40_profile()
ACC = {s.id: s.accuracy for s in PROFILE.subnets}
BASELINES = ["MinCost"] + [f"Fixed{i}" for i in PROFILE.ids]
SLACKFITS = ("SlackFit", "SlackFit-paper")  # the default and the paper's rule: compared, never baselines


# ----------------------------------------------------------------------------- building blocks
def make_policy(name: str):
    if name == "SlackFit-lit":  # the paper's literal rule: the slack only (not the queue length), the mean latency
        return SlackFit(PROFILE, queue_aware=False, backlog_aware=False, latency_stat="mean")
    if name.endswith("-lit"):
        return {"MaxAcc": MaxAcc, "MaxBatch": MaxBatch}[name[:-4]](PROFILE, queue_aware=False)
    if name == "SlackFit":  # the default: backlog-aware, p99 with its own LatencyModel (issue 20)
        return SlackFit(PROFILE)
    if name == "SlackFit-paper":  # the default before issue 20: the paper's bucket rule, queue-aware, mean latency
        return SlackFit(PROFILE, backlog_aware=False, latency_stat="mean")
    if name == "MaxAcc":
        return MaxAcc(PROFILE)
    if name == "MaxBatch":
        return MaxBatch(PROFILE)
    if name == "MinCost":
        return MinCost(PROFILE)
    if name.startswith("Fixed"):
        return Fixed(PROFILE, int(name[5:]))
    if name.startswith("GearPlan"):
        max_qps = float(name.split(":")[1])
        return GearPlan.from_profile(PROFILE, slo_s=SLO, num_workers=WORKERS, max_qps=max_qps, num_gears=8)
    raise ValueError(f"unknown policy {name!r}")


def make_trace(spec: tuple) -> list[float]:
    kind, *args = spec
    if kind == "bursty":
        base, variant, cv2, dur, seed = args
        return traces.bursty(base, variant, cv2=cv2, duration_s=dur, seed=seed)
    if kind == "timevarying":
        r1, r2, tau, cv2, dur, ramp_start, seed = args
        return traces.time_varying(r1, r2, accel=tau, cv2=cv2, duration_s=dur, ramp_start_s=ramp_start, seed=seed)
    if kind == "maf":
        dur, rate, minutes, seed = args
        return traces.maf(datasets.maf_per_minute(), duration_s=dur, mean_rate=rate, minutes=minutes, seed=seed)
    raise ValueError(kind)


def run(job: tuple) -> dict[str, Any]:
    """One simulation: (tag, trace spec, policy name, SimConfig kwargs, scale) -> summary dict (+ dynamics).

    The SimConfig kwargs may override ``slo_s`` and ``num_workers`` (default: the paper's 36 ms and 8 workers) and may
    hold ``adaptive``: ``True`` plans with a :class:`~scheduling.LatencyModel` fed by the simulated service times,
    ``False`` with the static profile; absent, the simulator's default (a model for the policies that want one: the
    default SlackFit).
    """
    tag, trace_spec, policy_name, cfg_kwargs, scale = job
    arrivals = make_trace(trace_spec)
    if scale != 1.0:  # scale the rate by compressing time (keeps the trace's shape and CV²)
        arrivals = [t / scale for t in arrivals]
    cfg_kwargs = dict(cfg_kwargs)
    adaptive = cfg_kwargs.pop("adaptive", None)
    record_slack = cfg_kwargs.pop("record_slack", False)
    cfg = SimConfig(**{"slo_s": SLO, "num_workers": WORKERS, **cfg_kwargs})
    model = "auto" if adaptive is None else LatencyModel(PROFILE) if adaptive else None
    policy = make_policy(policy_name)
    slacks: list[float] = []
    if record_slack:  # the head's slack at every decision (App. B, Figs. 14-15): wrap the policy's decide
        decide = policy.decide

        def recording_decide(slack_s: float, queue_len: int, now: float):
            slacks.append(slack_s)
            return decide(slack_s, queue_len, now)

        policy.decide = recording_decide
    t0 = time.perf_counter()
    r = simulate(policy, arrivals, cfg, latency_model=model)
    wall = time.perf_counter() - t0
    out = {"tag": tag, "policy": policy_name, "requests": len(arrivals), "wall_s": wall, **r.summary.as_dict()}
    if record_slack:
        out["slack_hist"] = slack_histogram(slacks, cfg.slo_s)
    if cfg.record_timeline:
        bin_s = 0.5 if r.end_time > 30 else 0.25
        out["rate"] = rate_series(arrivals, bin_s)
        out["windows"] = windowed_outcomes(r.outcomes, bin_s)
        dec: dict[int, list[float]] = {}
        for d in r.decisions:
            b = dec.setdefault(int(d.time // bin_s), [0.0, 0.0, 0.0])
            b[0] += 1
            b[1] += d.batch_size
            b[2] += ACC[d.subnet_id] * d.batch_size
        out["decisions"] = [(i * bin_s, b[1] / b[0], b[2] / b[1]) for i, b in sorted(dec.items())]
        out["shares"] = subnet_shares(r.decisions)
        out["share_series"] = subnet_share_series(r.decisions, bin_s)
        # Requests per (subnet, batch size): how the largest subnet gets its share (E6's explanation).
        by_batch: dict[str, int] = {}
        for d in r.decisions:
            key = f"{d.subnet_id}/{d.batch_size}"
            by_batch[key] = by_batch.get(key, 0) + d.batch_size
        out["requests_by_subnet_batch"] = by_batch
    return out


def slack_histogram(slacks: list[float], slo_s: float, bin_ms: float = 0.5) -> dict[str, Any]:
    """Counts of head slacks (ms) in ``bin_ms`` bins over [0, SLO]; slacks outside land in the first or last bin."""
    n_bins = math.ceil(slo_s * 1e3 / bin_ms)
    counts = [0] * n_bins
    for x in slacks:
        counts[min(max(int(x * 1e3 / bin_ms), 0), n_bins - 1)] += 1
    return {"bin_ms": bin_ms, "counts": counts, "decisions": len(slacks)}


def run_all(jobs: list[tuple], n_jobs: int) -> list[dict[str, Any]]:
    return run_all_fn(run, jobs, n_jobs)


def run_all_fn(fn, jobs: list[tuple], n_jobs: int) -> list[dict[str, Any]]:
    """``fn`` over ``jobs``, in ``n_jobs`` processes when more than one."""
    if n_jobs <= 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(n_jobs) as ex:
        return list(ex.map(fn, jobs, chunksize=1))


def capacity_table(slo: float = SLO, workers: int = WORKERS) -> list[tuple[Any, float, int, float]]:
    """Per subnet: (id, accuracy, best batch, max throughput of ``workers``) over batches with latency <= ``slo``."""
    rows = []
    for s in PROFILE.subnets:
        best = max(((b / st.mean_s, b) for b, st in s.latency.items() if st.mean_s <= slo), default=(0.0, 0))
        rows.append((s.id, s.accuracy, best[1], workers * best[0]))
    return rows


# ----------------------------------------------------------------------------- analysis
def dominated_by(r: dict, others: list[dict], eps: float = 1e-9) -> list[str]:
    """Names of the runs with both higher attainment and higher accuracy than ``r``."""
    return [
        o["policy"]
        for o in others
        if o["slo_attainment"] > r["slo_attainment"] + eps and o["mean_accuracy"] > r["mean_accuracy"] + eps
    ]


def headline(sf: dict, baselines: list[dict], att_tol: float = 1e-4) -> dict[str, Any]:
    """The paper's two headline comparisons for one cell.

    - accuracy gain at the same attainment: SlackFit accuracy minus the best accuracy of baselines whose attainment is
      at least SlackFit's (minus ``att_tol``); ``None`` if no baseline reaches it.
    - attainment ratio at the same accuracy: SlackFit attainment over the best attainment of baselines at least as
      accurate as SlackFit; ``None`` if no baseline is.
    """
    same_att = [b for b in baselines if b["slo_attainment"] >= sf["slo_attainment"] - att_tol]
    same_acc = [b for b in baselines if b["mean_accuracy"] >= sf["mean_accuracy"]]
    gain = sf["mean_accuracy"] - max(b["mean_accuracy"] for b in same_att) if same_att else None
    best_att = max((b["slo_attainment"] for b in same_acc), default=None)
    ratio = (sf["slo_attainment"] / best_att if best_att else math.inf) if same_acc else None
    return {"acc_gain_pts": gain, "att_ratio": ratio}


def fmt(x: float | None, spec: str) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


# ----------------------------------------------------------------------------- plotting
def figpath(args, name: str) -> str:
    """Path of a figure, with ``--suffix`` inserted before the extension."""
    root, ext = os.path.splitext(name)
    return os.path.join(args.figures, f"{root}{args.suffix}{ext}")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(name: str) -> str:
    if name.startswith("Fixed"):
        return f"Clipper+({ACC[int(name[5:])]:.2f})"
    return {"MinCost": "INFaaS", "SlackFit": "SlackFit"}.get(name, name)


MARKERS = {
    "SlackFit": ("*", "tab:red", 220),
    "SlackFit-paper": ("P", "tab:pink", 110),
    "SlackFit-lit": ("*", "tab:orange", 120),
    "MinCost": ("s", "tab:green", 60),
    "MaxAcc": ("^", "tab:blue", 80),
    "MaxAcc-lit": ("^", "tab:cyan", 60),
    "MaxBatch": ("v", "tab:brown", 80),
    "MaxBatch-lit": ("v", "tab:olive", 60),
}


def scatter_grid(
    cells: dict[tuple, list[dict]], rows: list, cols: list, rlabel: str, clabel: str, title: str, path: str
):
    plt = _plt()
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(4.2 * len(cols), 3.4 * len(rows)), squeeze=False)
    for i, rv in enumerate(rows):
        for j, cv in enumerate(cols):
            ax = axes[i][j]
            for r in cells[(rv, cv)]:
                m, c, s = MARKERS.get(r["policy"], ("o", None, 40))
                ax.scatter(r["mean_accuracy"], r["slo_attainment"], marker=m, color=c, s=s, label=_label(r["policy"]))
            ax.set_title(f"{rlabel}={rv}, {clabel}={cv}", fontsize=9)
            ax.set_xlabel("mean serving accuracy (%)", fontsize=8)
            ax.set_ylabel("SLO attainment", fontsize=8)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8)
    fig.suptitle(title, y=0.995, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dynamics_plot(run_: dict, title: str, path: str, kills: list[float] = ()):
    plt = _plt()
    fig, axes = plt.subplots(4, 1, figsize=(9, 8), sharex=True)
    t, rate = zip(*run_["rate"], strict=True)
    axes[0].plot(t, rate, lw=0.8)
    axes[0].set_ylabel("ingest (q/s)")
    w = run_["windows"]
    axes[1].plot([x[0] for x in w], [x[1] for x in w], lw=0.8, color="tab:red")
    axes[1].set_ylabel("SLO attainment")
    d = run_["decisions"]
    axes[2].plot([x[0] for x in d], [x[2] for x in d], lw=0.8, color="tab:purple")
    axes[2].set_ylabel("served acc. (%)")
    axes[3].plot([x[0] for x in d], [x[1] for x in d], lw=0.8, color="tab:green")
    axes[3].set_ylabel("mean batch")
    axes[3].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        for k in kills:
            ax.axvline(k, color="red", ls=":", lw=1)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- experiments
def by_cell(results: list[dict]) -> dict[tuple, list[dict]]:
    """Group run results by their tag without the experiment letter: one list of policies' results per cell."""
    cells: dict[tuple, list[dict]] = {}
    for r in results:
        cells.setdefault(r["tag"][1:], []).append(r)
    return cells


def cell_table(cells: dict[tuple, list[dict]], names: tuple[str, ...]) -> list[dict]:
    """Per cell: both SlackFits, who dominates each and its headline against the baselines; ``names`` label the
    cell's key (e.g. ``("lambda_v", "cv2")``)."""
    table = []
    for key, rs in cells.items():
        sf = next(r for r in rs if r["policy"] == "SlackFit")
        paper = next(r for r in rs if r["policy"] == "SlackFit-paper")
        base = [r for r in rs if r["policy"] not in SLACKFITS]
        table.append({"slackfit_paper": paper, "paper_dominated_by": dominated_by(paper, base),
                      "paper_headline": headline(paper, base), **dict(zip(names, key, strict=True)), "slackfit": sf,
                      "dominated_by": dominated_by(sf, base),
                      "headline": headline(sf, base), "baselines": base})  # fmt: skip
    return table


def exp_a(args) -> dict:
    lvs, cvs = [2950, 4900, 5550], [2, 4, 8]
    pols = ["SlackFit", "SlackFit-paper", *BASELINES]
    jobs = [
        (
            ("a", lv, cv),
            ("bursty", 1500, lv, cv, args.duration, args.seed),
            p,
            sim_kwargs(args, args.seed),
            args.rate_scale,
        )
        for lv in lvs
        for cv in cvs
        for p in pols
    ]
    cells = by_cell(run_all(jobs, args.jobs))
    scatter_grid(cells, lvs, cvs, "λv", "CV²", "(a) bursty traces, λb=1500, SLO 36 ms (cf. paper Fig. 9)",
                 figpath(args, "repro_a_bursty.png"))  # fmt: skip
    return {"cells": cell_table(cells, ("lambda_v", "cv2"))}


def exp_b(args) -> dict:
    l2s, taus = [4800, 6800, 7800], [250, 500, 5000]
    pols = ["SlackFit", "SlackFit-paper", *BASELINES]
    jobs = [
        (
            ("b", l2, tau),
            ("timevarying", 2500, l2, tau, 8.0, args.tv_duration, 5.0, args.seed),
            p,
            sim_kwargs(args, args.seed),
            args.rate_scale,
        )
        for l2 in l2s
        for tau in taus
        for p in pols
    ]
    cells = by_cell(run_all(jobs, args.jobs))
    scatter_grid(cells, l2s, taus, "λ2", "τ", "(b) time-varying traces, λ1=2500, CV²=8 (cf. paper Fig. 10)",
                 figpath(args, "repro_b_timevarying.png"))  # fmt: skip
    return {"cells": cell_table(cells, ("lambda2", "tau"))}


def exp_c(args) -> dict:
    spec = ("maf", 120.0, 6400.0, None, args.seed)
    jobs = [
        (("c",), spec, p, {**sim_kwargs(args, args.seed), "record_timeline": p == "SlackFit"}, args.rate_scale)
        for p in ["SlackFit", "SlackFit-paper", *BASELINES]
    ]
    res = run_all(jobs, args.jobs)
    sf = next(r for r in res if r["policy"] == "SlackFit")
    paper = next(r for r in res if r["policy"] == "SlackFit-paper")
    base = [r for r in res if r["policy"] not in SLACKFITS]
    scatter_grid({(6400, 120): res}, [6400], [120], "mean q/s", "seconds", "(c) MAF trace (cf. paper Fig. 8a)",
                 figpath(args, "repro_c_maf.png"))  # fmt: skip
    dynamics_plot(sf, "(c) SlackFit system dynamics on the MAF trace (cf. paper Fig. 8c)",
                  figpath(args, "repro_c_maf_dynamics.png"))  # fmt: skip
    peak = max(r for _, r in sf["rate"])
    for r in res:
        r.pop("rate", None), r.pop("windows", None), r.pop("decisions", None)
    return {"slackfit": sf, "baselines": base, "dominated_by": dominated_by(sf, base), "headline": headline(sf, base),
            "slackfit_paper": paper, "paper_dominated_by": dominated_by(paper, base),
            "paper_headline": headline(paper, base), "peak_rate_qps": peak}  # fmt: skip


def exp_d(args) -> dict:
    cvs = [2, 4, 8]
    pols = ["SlackFit", "SlackFit-paper", "MaxAcc", "MaxBatch", "SlackFit-lit", "MaxAcc-lit", "MaxBatch-lit"]
    jobs = [
        (
            ("d", cv),
            ("bursty", 1500, 5550, cv, args.duration, args.seed),
            p,
            sim_kwargs(args, args.seed),
            args.rate_scale,
        )
        for cv in cvs
        for p in pols
    ]
    res = run_all(jobs, args.jobs)
    cells: dict[tuple, list[dict]] = {}
    for r in res:
        cells.setdefault((7050, r["tag"][1]), []).append(r)
    scatter_grid(cells, [7050], cvs, "λ", "CV²", "(d) SlackFit vs MaxAcc vs MaxBatch (cf. paper Fig. 11c)",
                 figpath(args, "repro_d_policies.png"))  # fmt: skip
    return {"cells": [{"cv2": k[1], "runs": v} for k, v in cells.items()]}


def exp_e(args) -> dict:
    kills = [12.0, 24.0, 36.0, 48.0]
    out = {}
    for rate_mult in (1.0, 2.0):
        # λ = 3500 q/s (λb=1500 + λv=2000, CV²=2) as in the paper, and twice that; 60 s in both cases.
        spec = ("bursty", 1500 * rate_mult, 2000 * rate_mult, 2, 60.0, args.seed)
        jobs = [
            (
                ("e", rate_mult),
                spec,
                p,
                {**sim_kwargs(args, args.seed), "worker_failures": kills, "record_timeline": True},
                args.rate_scale,
            )
            for p in ["SlackFit", "SlackFit-paper", "Fixed4", "Fixed5"]
        ]
        res = run_all(jobs, args.jobs)
        sf = res[0]
        title = f"(e) faults: SlackFit, 8 workers, one killed every 12 s, {3500 * rate_mult:.0f} q/s (cf. Fig. 11a)"
        dynamics_plot(sf, title, figpath(args, f"repro_e_faults_{int(3500 * rate_mult)}.png"),
                      kills)  # fmt: skip
        per_phase = []
        for r in res:
            phases = []
            for k in range(5):
                lo, hi = 12.0 * k, 12.0 * (k + 1)
                ws = [w for w in r["windows"] if lo <= w[0] < hi]
                n = sum(w[3] for w in ws)
                ok = sum(w[1] * w[3] for w in ws)
                ds = [d for d in r["decisions"] if lo <= d[0] < hi]
                acc = sum(d[2] * d[1] for d in ds) / max(sum(d[1] for d in ds), 1e-9)
                phases.append({"workers": 8 - k, "attainment": ok / n if n else math.nan, "served_accuracy": acc})
            per_phase.append({"policy": r["policy"], "phases": phases, "slo_attainment": r["slo_attainment"],
                              "mean_accuracy": r["mean_accuracy"]})  # fmt: skip
        out[f"{3500 * rate_mult:.0f}"] = per_phase
    return out


def burstiest_hour(seed: int) -> tuple[int, tuple, str]:
    """The burstiest hour of the MAF sample (largest minute-to-minute swings), compressed to 20 s at mean 6400 q/s:
    (first minute, trace spec, the GearPlan policy name sized for the window's peak rate)."""
    counts = datasets.maf_per_minute()
    best = max(range(0, 1440 - 60), key=lambda m: sum(abs(counts[i + 1] - counts[i]) for i in range(m, m + 59)))
    peak_guess = 6400.0 * max(counts[best : best + 60]) * 60 / sum(counts[best : best + 60])
    return best, ("maf", 20.0, 6400.0, (best, best + 60), seed), f"GearPlan:{peak_guess:.0f}"


def exp_f(args) -> dict:
    best, spec, gear = burstiest_hour(args.seed)
    jobs = []
    for p in ["SlackFit", "SlackFit-paper", gear]:
        for delay in (0.0, 0.1):
            jobs.append(
                (
                    ("f", p, delay),
                    spec,
                    p,
                    {**sim_kwargs(args, args.seed), "actuation_delay_s": delay, "record_timeline": True},
                    args.rate_scale,
                )
            )
    res = run_all(jobs, args.jobs)
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    t, rate = zip(*res[0]["rate"], strict=True)
    axes[0].plot(t, rate, lw=0.8)
    axes[0].set_ylabel("ingest (q/s)")
    for r in res:
        lab = f"{r['policy'].split(':')[0]}, {r['tag'][2] * 1e3:.0f} ms actuation"
        w = r["windows"]
        axes[1].plot([x[0] for x in w], [1 - x[1] for x in w], lw=0.8, label=lab)
        d = r["decisions"]
        axes[2].plot([x[0] for x in d], [x[2] for x in d], lw=0.8, label=lab)
    axes[1].set_ylabel("SLO miss rate")
    axes[1].set_yscale("symlog", linthresh=1e-3)
    axes[2].set_ylabel("served acc. (%)")
    axes[2].set_xlabel("time (s)")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"(f) actuation delay on a bursty MAF hour (minutes {best}-{best + 60}) (cf. paper Fig. 1c)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(figpath(args, "repro_f_actuation.png"), dpi=110)
    plt.close(fig)
    for r in res:
        r.pop("rate", None), r.pop("windows", None), r.pop("decisions", None)
    return {"minutes": [best, best + 60], "runs": res}


# ----------------------------------------------------------------------------- experiments added by issue 12
def sim_kwargs(args, seed: int) -> dict[str, Any]:
    """SimConfig settings every run shares: ``--noise`` and the seed of the latency noise."""
    return {"latency_noise": args.noise, "seed": seed}


def over_seeds(rows: list[dict], key: str) -> dict[str, float]:
    """Mean, min and max of ``key`` over runs (one per seed)."""
    xs = [r[key] for r in rows]
    return {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}


def mean_shares(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per subnet: mean, min and max over seeds of its share of the dispatched requests (0 where it served none)."""
    out = {}
    for sid in PROFILE.ids:
        xs = [r["shares"].get(sid, 0.0) for r in rows]
        out[str(sid)] = {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}
    return out


def slackfit_choice_table(queue_lens=(1, 2, 4, 8, 16, 17, 32), slacks_ms=(6, 10, 15, 20, 22, 26, 36)) -> dict:
    """The paper's SlackFit's choice (subnet/batch) per queue length and head slack on the A40 profile: why it picks
    subnet 5 (the default SlackFit adds the measured rate, which a table cannot show)."""
    sf = make_policy("SlackFit-paper")
    return {
        "slacks_ms": list(slacks_ms),
        "rows": {
            q: [f"{d.subnet_id}/{d.profile_batch}" for d in (sf.decide(s / 1e3, q, 0.0) for s in slacks_ms)]
            for q in queue_lens
        },
    }


def _strip(rows: list[dict]) -> None:
    """Drop the per-run time series that the JSON does not need."""
    for r in rows:
        for k in ("rate", "windows", "decisions", "share_series", "requests_by_subnet_batch"):
            r.pop(k, None)


def share_plot(runs: list[tuple[str, dict]], path: str) -> None:
    """Per trace: ingest rate and the stacked share of requests each subnet served over time (seed 0)."""
    plt = _plt()
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.3 * len(runs)), squeeze=False)
    colors = plt.get_cmap("viridis")
    for ax, (title, r) in zip(axes[:, 0], runs, strict=True):
        ts = [t for t, _ in r["share_series"]]
        stack = [[sh.get(sid, 0.0) for _, sh in r["share_series"]] for sid in PROFILE.ids]
        labels = [f"{ACC[sid]:.2f}" for sid in PROFILE.ids]
        ax.stackplot(ts, stack, labels=labels, colors=[colors(i / 5) for i in range(6)], step="post")
        ax.set_ylim(0, 1)
        ax.set_ylabel("share served")
        ax.set_title(title, fontsize=9)
        rate = ax.twinx()
        t, q = zip(*r["rate"], strict=True)
        rate.plot(t, q, color="black", lw=0.7)
        rate.set_ylabel("ingest (q/s)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=6, fontsize=8, title="subnet top-1 % (black: ingest rate)")
    axes[-1][0].set_xlabel("time (s)")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def batch_plot(runs: dict[str, list[dict]], path: str) -> None:
    """Fig. 13's batch-size panels: per trace, the mean batch size over time of each SlackFit (seed 0) and the rate."""
    plt = _plt()
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 1.9 * len(runs)), sharex=True, squeeze=False)
    for ax, (title, rs) in zip(axes[:, 0], runs.items(), strict=True):
        for r in rs:
            d = r["decisions"]
            ax.plot([x[0] for x in d], [x[1] for x in d], lw=0.8, label=r["policy"], color=MARKERS[r["policy"]][1])
        ax.set_ylabel("mean batch", fontsize=8)
        ax.set_ylim(0, 33)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        rate = ax.twinx()
        t, q = zip(*rs[0]["rate"], strict=True)
        rate.plot(t, q, color="black", lw=0.5, alpha=0.5)
        rate.set_ylabel("ingest (q/s)", fontsize=8)
    axes[0][0].legend(fontsize=7, loc="upper left")
    axes[-1][0].set_xlabel("time (s)")
    fig.suptitle("(g) batch size over time (cf. paper Fig. 13); black: ingest rate", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def exp_g(args) -> dict:
    """E5/E6 (Fig. 8c, Fig. 13): which subnets SlackFit serves, over time and in total; and why subnet 5 appears."""
    traces_ = {
        "E5 MAF 6400 q/s": lambda s: ("maf", 120.0, 6400.0, None, s),
        "E6 bursty 7000 q/s, CV²=2": lambda s: ("bursty", 1500, 5500, 2, args.duration, s),
        "E6 bursty 7000 q/s, CV²=8": lambda s: ("bursty", 1500, 5500, 8, args.duration, s),
        "E6 2500->7400 q/s, τ=250": lambda s: ("timevarying", 2500, 7400, 250, 8.0, args.tv_duration, 5.0, s),
        "E6 2500->7400 q/s, τ=5000": lambda s: ("timevarying", 2500, 7400, 5000, 8.0, args.tv_duration, 5.0, s),
    }
    jobs = [
        (("g", name, p), make(seed), p, {**sim_kwargs(args, seed), "record_timeline": True}, args.rate_scale)
        for name, make in traces_.items()
        for p in ("SlackFit", "SlackFit-paper", "SlackFit-lit")
        for seed in args.seeds
    ]
    # The rate sweep behind the explanation: the CV²=2 bursty trace compressed or stretched in time.
    mults = (0.5, 0.75, 1.0, 1.25, 1.5)
    jobs += [
        (
            ("g-sweep", m, p),
            ("bursty", 1500, 5500, 2, args.duration, seed),
            p,
            {**sim_kwargs(args, seed), "record_timeline": True},
            args.rate_scale * m,
        )
        for m in mults
        for p in SLACKFITS
        for seed in args.seeds
    ]
    res = run_all(jobs, args.jobs)
    share_plot(
        [
            (f"{name}: SlackFit, seed {args.seeds[0]}", next(r for r in res if r["tag"] == ("g", name, "SlackFit")))
            for name in traces_
        ],
        figpath(args, "repro_g_dynamics.png"),
    )
    batch_plot(
        {name: [next(r for r in res if r["tag"] == ("g", name, p)) for p in SLACKFITS] for name in list(traces_)[1:]},
        figpath(args, "repro_g_batch.png"),
    )
    cap5 = next(c for c in capacity_table() if c[0] == PROFILE.ids[-1])[3]
    largest = str(PROFILE.ids[-1])

    def at_batch_ge(rows: list[dict], sid: str, b: int) -> float:
        """Share of subnet ``sid``'s requests that ran in batches of >= b (over all seeds)."""
        tot = ge = 0
        for r in rows:
            for key, n in r["requests_by_subnet_batch"].items():
                s_, bb = key.split("/")
                if s_ == sid:
                    tot += n
                    ge += n if int(bb) >= b else 0
        return ge / tot if tot else math.nan

    table = []
    for name in traces_:
        for p in ("SlackFit", "SlackFit-paper", "SlackFit-lit"):
            rows = [r for r in res if r["tag"] == ("g", name, p)]
            table.append(
                {
                    "trace": name,
                    "policy": p,
                    "shares": mean_shares(rows),
                    "attainment": over_seeds(rows, "slo_attainment"),
                    "accuracy": over_seeds(rows, "mean_accuracy"),
                    "largest_at_batch_ge_8": at_batch_ge(rows, largest, 8),
                }
            )
    sweep = []
    for m in mults:
        for p in SLACKFITS:
            rows = [r for r in res if r["tag"] == ("g-sweep", m, p)]
            rate = 7000.0 * args.rate_scale * m
            sweep.append(
                {
                    "policy": p,
                    "rate_qps": rate,
                    "largest_capacity_over_rate": cap5 / rate,
                    "shares": mean_shares(rows),
                    "attainment": over_seeds(rows, "slo_attainment"),
                    "accuracy": over_seeds(rows, "mean_accuracy"),
                }
            )
    return {"seeds": args.seeds, "table": table, "sweep": sweep, "choices": slackfit_choice_table()}


def latency_span_ms(policy: str, slo_s: float) -> tuple[float, float]:
    """The profiled mean latencies (ms) a policy can run within ``slo_s``: the paper's red line in Figs. 14-15."""
    subnets = [s for s in PROFILE.subnets if not policy.startswith("Fixed") or s.id == int(policy[5:])]
    if policy == "MinCost":
        subnets = [PROFILE.subnets[0]]
    lats = [st.mean_s * 1e3 for s in subnets for st in s.latency.values() if st.mean_s <= slo_s]
    return min(lats), max(lats)


def hist_quantile(h: dict, q: float) -> float:
    """The ``q`` quantile (ms, bin upper edge) of a :func:`slack_histogram`."""
    target, acc = q * sum(h["counts"]), 0
    for k, c in enumerate(h["counts"]):
        acc += c
        if acc >= target:
            return (k + 1) * h["bin_ms"]
    return len(h["counts"]) * h["bin_ms"]


def merge_hists(hs: list[dict]) -> dict:
    return {
        "bin_ms": hs[0]["bin_ms"],
        "counts": [sum(c) for c in zip(*(h["counts"] for h in hs), strict=True)],
        "decisions": sum(h["decisions"] for h in hs),
    }


def slack_density_plot(densities: dict[str, dict], spans: dict[str, tuple[float, float]], path: str) -> None:
    """Figs. 14-15: per policy, the density of the head's slack at decision time and the latency span (red)."""
    plt = _plt()
    cols = 3
    rows = -(-len(densities) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(9, 2.1 * rows), sharex=True, squeeze=False)
    for ax in axes.flat[len(densities) :]:
        ax.set_visible(False)
    for ax, (p, h) in zip(axes.flat, densities.items(), strict=False):
        n = max(sum(h["counts"]), 1)
        xs = [(k + 0.5) * h["bin_ms"] for k in range(len(h["counts"]))]
        ax.fill_between(xs, [c / n / h["bin_ms"] for c in h["counts"]], step="mid", alpha=0.6)
        lo, hi = spans[p]
        ax.axvline(lo, color="red", lw=1)
        ax.axvline(hi, color="red", lw=1)
        ax.axhline(0, xmin=0, xmax=1, color="grey", lw=0.5)
        ax.set_title(_label(p), fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("head slack at decision (ms)", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("density (1/ms)", fontsize=8)
    fig.suptitle("(h) App. B, Figs. 14-15: head slack at each decision; red: the policy's latency span", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def exp_h(args) -> dict:
    """E10 (App. B): MAF at 4000 q/s (CV²=1), SLO 30 ms, 6 workers: Clipper+ vs SlackFit, and the slack densities."""
    slo, workers = 0.030, 6
    pols = ["SlackFit", "SlackFit-paper", *BASELINES]
    jobs = [
        (
            ("h", p, seed),
            ("maf", 120.0, 4000.0, None, seed),
            p,
            {
                **sim_kwargs(args, seed),
                "slo_s": slo,
                "num_workers": workers,
                "record_timeline": p in SLACKFITS and seed == args.seeds[0],
                "record_slack": True,
            },
            args.rate_scale,
        )
        for p in pols
        for seed in args.seeds
    ]
    res = run_all(jobs, args.jobs)
    sf0 = next(r for r in res if r["policy"] == "SlackFit" and "rate" in r)
    dynamics_plot(
        sf0,
        "(h) E10 / App. B: SlackFit on MAF at 4000 q/s, SLO 30 ms, 6 workers",
        figpath(args, "repro_h_appb_dynamics.png"),
    )
    peak = max(q for _, q in sf0["rate"])
    _strip(res)
    per_seed = []
    for seed in args.seeds:
        rs = [r for r in res if r["tag"][2] == seed]
        base = [r for r in rs if r["policy"] not in SLACKFITS]
        for p in SLACKFITS:
            sf = next(r for r in rs if r["policy"] == p)
            per_seed.append(
                {"seed": seed, "policy": p, "headline": headline(sf, base), "dominated_by": dominated_by(sf, base)}
            )
    caps = [
        {"subnet": sid, "accuracy": acc, "best_batch": b, "capacity_qps": cap}
        for sid, acc, b, cap in capacity_table(slo, workers)
    ]
    table, densities, spans = [], {}, {}
    for p in pols:
        rows = [r for r in res if r["policy"] == p]
        densities[p] = merge_hists([r.pop("slack_hist") for r in rows])
        spans[p] = latency_span_ms("SlackFit" if p in SLACKFITS else p, slo)
        h = densities[p]
        n = max(sum(h["counts"]), 1)
        below = sum(c for k, c in enumerate(h["counts"]) if (k + 1) * h["bin_ms"] <= spans[p][0]) / n
        above = sum(c for k, c in enumerate(h["counts"]) if k * h["bin_ms"] >= spans[p][1]) / n
        table.append(
            {
                "policy": p,
                "attainment": over_seeds(rows, "slo_attainment"),
                "accuracy": over_seeds(rows, "mean_accuracy"),
                "latency_span_ms": spans[p],
                "slack_ms": {q: hist_quantile(h, q) for q in (0.05, 0.5, 0.95)},
                "slack_below_span": below,
                "slack_above_span": above,
                "decisions": h["decisions"],
            }
        )
    slack_density_plot(densities, spans, figpath(args, "repro_h_slack_density.png"))
    return {"seeds": args.seeds, "peak_rate_qps": peak, "capacity": caps, "table": table, "per_seed": per_seed,
            "slack_densities": densities}  # fmt: skip


def _phase_attainment(r: dict, lo: float, hi: float) -> float:
    """SLO attainment of the requests that finished in [lo, hi)."""
    ws = [w for w in r["windows"] if lo <= w[0] < hi]
    n = sum(w[3] for w in ws)
    return sum(w[1] * w[3] for w in ws) / n if n else math.nan


def exp_i(args) -> dict:
    """Interference: half the workers 1.5x slower for 10 s mid-trace; the paper's SlackFit with and without latency
    feedback, and the default SlackFit (which plans with its own feedback)."""
    lvs, cvs = [2950, 4900, 5550], [2, 4, 8]
    start, end = args.duration / 3, 2 * args.duration / 3
    window = (Interference(start, end, 1.5, tuple(range(WORKERS // 2))),)
    runs = (
        ("static", "SlackFit-paper", False),
        ("adaptive", "SlackFit-paper", True),
        ("default", "SlackFit", None),
        ("static", "MinCost", False),
    )
    jobs = []
    for check, interference in (("interference", window), ("quiet", ())):
        for lv in lvs:
            for cv in cvs:
                for seed in args.seeds:
                    for mode, p, adaptive in runs:
                        cfg = {**sim_kwargs(args, seed), "interference": interference, "record_timeline": True}
                        if adaptive is not None:
                            cfg["adaptive"] = adaptive
                        jobs.append(
                            (
                                (check, lv, cv, seed, mode),
                                ("bursty", 1500, lv, cv, args.duration, seed),
                                p,
                                cfg,
                                args.rate_scale,
                            )
                        )
    res = run_all(jobs, args.jobs)
    for r in res:
        r["during"] = _phase_attainment(r, start, end + SLO)  # + SLO: requests started in the window finish after it
        r["outside"] = _phase_attainment(r, 0.0, start)
    _strip(res)
    cells = []
    for check in ("interference", "quiet"):
        for lv in lvs:
            for cv in cvs:
                cell = {"check": check, "lambda_v": lv, "cv2": cv}
                for mode, p, _ in runs:
                    rows = [
                        r for r in res if r["tag"][:3] == (check, lv, cv) and r["tag"][4] == mode and r["policy"] == p
                    ]
                    cell[f"{mode} {p}"] = {
                        "attainment": over_seeds(rows, "slo_attainment"),
                        "accuracy": over_seeds(rows, "mean_accuracy"),
                        "during": over_seeds(rows, "during"),
                    }
                cells.append(cell)
    return {
        "seeds": args.seeds,
        "window_s": [start, end],
        "factor": 1.5,
        "workers": list(range(WORKERS // 2)),
        "cells": cells,
    }


def exp_j(args) -> dict:
    """The paper's Clipper+(76.69) and Clipper+(78.25) drops (Fig. 9): at which rate they appear on the A40 profile."""
    cells = [(5550, 2), (5550, 4), (5550, 8), (2950, 2), (4900, 2)]
    mults = (1.0, 1.5, 2.0, 2.25, 2.5)
    jobs = [
        (
            ("j", lv, cv, m, seed),
            ("bursty", 1500, lv, cv, args.duration, seed),
            p,
            sim_kwargs(args, seed),
            args.rate_scale * m,
        )
        for lv, cv in cells
        for m in mults
        for p in ("Fixed1", "Fixed3")
        for seed in args.seeds
    ]
    res = run_all(jobs, args.jobs)
    caps = {c[0]: c[3] for c in capacity_table()}
    rows = []
    for lv, cv in cells:
        for m in mults:
            row = {"lambda_v": lv, "cv2": cv, "mult": m, "rate_qps": (1500 + lv) * args.rate_scale * m}
            for p in ("Fixed1", "Fixed3"):
                rs = [r for r in res if r["tag"][1:4] == (lv, cv, m) and r["policy"] == p]
                row[p] = over_seeds(rs, "slo_attainment")
                row[f"{p} capacity_over_rate"] = caps[int(p[5:])] / row["rate_qps"]
            rows.append(row)
    return {"seeds": args.seeds, "rows": rows}


# ----------------------------------------------------------------------------- experiments added by issue 20
def max_sustained_rate(job: tuple) -> dict[str, Any]:
    """Fig. 11b, one point: the highest constant rate (CV² = 0) that ``workers`` workers serve at >= ``target``
    attainment under ``policy``, by bisection over the rate (``steps`` halvings of [0, upper])."""
    policy, workers, noise, seed, duration, target, steps = job
    hi = (
        1.05 * workers * max(b / st.mean_s for s in PROFILE.subnets for b, st in s.latency.items() if st.mean_s <= SLO)
    )
    lo, best = 0.0, None
    for _ in range(steps):
        rate = (lo + hi) / 2
        arrivals = [k / rate for k in range(int(rate * duration))]
        cfg = SimConfig(slo_s=SLO, num_workers=workers, latency_noise=noise, seed=seed)
        summ = simulate(make_policy(policy), arrivals, cfg).summary
        if summ.slo_attainment >= target:
            lo, best = rate, {"rate_qps": rate, "attainment": summ.slo_attainment, "accuracy": summ.mean_accuracy}
        else:
            hi = rate
    return {"policy": policy, "workers": workers, "max_rate": best, "resolution_qps": hi - lo}


def exp_k(args) -> dict:
    """Fig. 11b: the highest constant rate each worker count sustains at 0.999 attainment (both SlackFits)."""
    worker_counts = (1, 2, 4, 8, 13, 16)
    jobs = [(p, w, args.noise, args.seed, 5.0, 0.999, 8) for w in worker_counts for p in SLACKFITS]
    res = run_all_fn(max_sustained_rate, jobs, args.jobs)
    caps = {sid: cap / WORKERS for sid, _, _, cap in capacity_table()}
    return {"target": 0.999, "duration_s": 5.0, "per_worker_capacity_qps": caps, "rows": res}


def exp_l(args) -> dict:
    """Fig. 1b: SLO misses as the actuation delay grows, on the bursty MAF hour of (f)."""
    best, spec, gear = burstiest_hour(args.seed)
    delays = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1)
    jobs = [
        (("l", p, d), spec, p, {**sim_kwargs(args, args.seed), "actuation_delay_s": d}, args.rate_scale)
        for p in (*SLACKFITS, gear)
        for d in delays
    ]
    res = run_all(jobs, args.jobs)
    return {"minutes": [best, best + 60], "runs": res}


EXPERIMENTS = {"a": exp_a, "b": exp_b, "c": exp_c, "d": exp_d, "e": exp_e, "f": exp_f, "g": exp_g, "h": exp_h,
               "i": exp_i, "j": exp_j, "k": exp_k, "l": exp_l}  # fmt: skip


# ----------------------------------------------------------------------------- report
def report(results: dict) -> None:
    print("\nCapacity of 8 workers per subnet (best batch with latency <= SLO):")
    for sid, acc, b, cap in capacity_table():
        print(f"  subnet {sid} ({acc:.2f}%): batch {b}, {cap:,.0f} q/s")

    def grid(name, cells, k1, k2):
        print(f"\n({name}) cell | policy | att / acc | best baseline at >= att | headline | dominated by")
        for c in cells:
            for key, pre in (("slackfit", ""), ("slackfit_paper", "paper_")):
                if key not in c:
                    continue
                sf, h = c[key], c[f"{pre}headline"]
                same = [b for b in c["baselines"] if b["slo_attainment"] >= sf["slo_attainment"] - 1e-4]
                bb = max(same, key=lambda b: b["mean_accuracy"]) if same else None
                bbs = f"{_label(bb['policy'])} {bb['slo_attainment']:.5f}/{bb['mean_accuracy']:.2f}" if bb else "none"
                print(f"  {k1}={c[k1]}, {k2}={c[k2]} | {sf['policy']} | {sf['slo_attainment']:.5f} / "
                      f"{sf['mean_accuracy']:.2f} | {bbs} | +{fmt(h['acc_gain_pts'], '.2f')} pts, "
                      f"x{fmt(h['att_ratio'], '.2f')} | {c[f'{pre}dominated_by'] or '-'}")  # fmt: skip

    if "a" in results:
        grid("a", results["a"]["cells"], "lambda_v", "cv2")
    if "b" in results:
        grid("b", results["b"]["cells"], "lambda2", "tau")
    if "c" in results:
        c = results["c"]
        print(f"\n(c) MAF: peak {c['peak_rate_qps']:,.0f} q/s")
        for r in [c["slackfit"], *([c["slackfit_paper"]] if "slackfit_paper" in c else []), *c["baselines"]]:
            print(f"  {_label(r['policy']):<18} att {r['slo_attainment']:.6f} acc {r['mean_accuracy']:.3f}")
        print(f"  headline: {c['headline']}, dominated by {c['dominated_by'] or '-'}")
        if "slackfit_paper" in c:
            print(f"  SlackFit-paper headline: {c['paper_headline']}, dominated by {c['paper_dominated_by'] or '-'}")
    if "d" in results:
        print("\n(d) policy space")
        for cell in results["d"]["cells"]:
            for r in cell["runs"]:
                print(
                    f"  CV2={cell['cv2']} {r['policy']:<9} att {r['slo_attainment']:.5f} acc {r['mean_accuracy']:.3f}"
                )
    if "e" in results:
        for rate, runs in results["e"].items():
            print(f"\n(e) faults at {rate} q/s: per 12 s phase (workers): attainment / served accuracy")
            for r in runs:
                ph = " | ".join(
                    f"{p['workers']}w {p['attainment']:.4f}/{p['served_accuracy']:.2f}" for p in r["phases"]
                )
                print(f"  {_label(r['policy']):<18} {ph}")
    if "f" in results:
        print(f"\n(f) actuation delay, MAF minutes {results['f']['minutes']}")
        for r in results["f"]["runs"]:
            print(f"  {r['policy']:<16} delay {r['tag'][2] * 1e3:>4.0f} ms: att {r['slo_attainment']:.5f} "
                  f"acc {r['mean_accuracy']:.3f} dropped {r['dropped']}")  # fmt: skip


def _ms(x: dict, spec: str = ".4f") -> str:
    """'mean (min-max)' of an over_seeds dict."""
    return f"{x['mean']:{spec}} ({x['min']:{spec}}-{x['max']:{spec}})"


def report_added(results: dict) -> None:
    """Markdown tables of experiments (g)-(j): mean over seeds, (min-max) in brackets."""
    if "g" in results:
        g = results["g"]
        accs = " | ".join(f"{ACC[sid]:.2f}" for sid in PROFILE.ids)
        print(f"\n(g) E5/E6 share of requests per subnet, seeds {g['seeds']} (mean; subnet 5 min-max)")
        print(f"| trace | policy | attainment | accuracy | {accs} | subnet-5 requests at batch >= 8 |")
        print("|---|---|---|---|" + "---|" * len(PROFILE.ids) + "---|")
        for row in g["table"]:
            sh = row["shares"]
            cols = " | ".join(f"{sh[str(sid)]['mean']:.3f}" for sid in PROFILE.ids[:-1])
            top = sh[str(PROFILE.ids[-1])]
            print(
                f"| {row['trace']} | {row['policy']} | {_ms(row['attainment'], '.5f')} | "
                f"{row['accuracy']['mean']:.2f} | {cols} | {top['mean']:.3f} ({top['min']:.3f}-{top['max']:.3f}) | "
                f"{fmt(row['largest_at_batch_ge_8'], '.2f')} |"
            )
        print("\n(g) rate sweep, bursty CV²=2: share served by the 80.16 % subnet")
        print("| policy | mean rate (q/s) | subnet-5 capacity / rate | subnet-5 share | attainment | accuracy |")
        print("|---|---|---|---|---|---|")
        for row in g["sweep"]:
            top = row["shares"][str(PROFILE.ids[-1])]
            print(
                f"| {row['policy']} | {row['rate_qps']:,.0f} | {row['largest_capacity_over_rate']:.2f} | "
                f"{_ms(top, '.3f')} | "
                f"{_ms(row['attainment'], '.5f')} | {row['accuracy']['mean']:.2f} |"
            )
        ch = g["choices"]
        print("\n(g) SlackFit's choice (subnet/batch) by queue length (rows) and head slack in ms (columns)")
        print("| queue | " + " | ".join(str(x) for x in ch["slacks_ms"]) + " |")
        print("|---|" + "---|" * len(ch["slacks_ms"]))
        for q, row in ch["rows"].items():
            print(f"| {q} | " + " | ".join(row) + " |")
    if "h" in results:
        h = results["h"]
        print(
            f"\n(h) E10 / App. B: MAF 4000 q/s (peak {h['peak_rate_qps']:,.0f} q/s), SLO 30 ms, 6 workers, "
            f"seeds {h['seeds']}"
        )
        print(
            "| policy | capacity (q/s) | attainment | accuracy | latency span (ms) | head slack p5 / p50 / p95 (ms) "
            "| slack above the span |"
        )
        print("|---|---|---|---|---|---|---|")
        caps = {c["subnet"]: c for c in h["capacity"]}
        for row in h["table"]:
            p = row["policy"]
            cap = f"{caps[int(p[5:])]['capacity_qps']:,.0f}" if p.startswith("Fixed") else "-"
            lo, hi = row["latency_span_ms"]
            sq = row["slack_ms"]
            print(
                f"| {_label(p)} | {cap} | {_ms(row['attainment'], '.5f')} | {row['accuracy']['mean']:.2f} | "
                f"{lo:.1f}-{hi:.1f} | {sq[0.05]:.1f} / {sq[0.5]:.1f} / {sq[0.95]:.1f} | "
                f"{row['slack_above_span']:.3f} |"
            )
        for ps in h["per_seed"]:
            hd = ps["headline"]
            print(
                f"  seed {ps['seed']} {ps['policy']}: +{fmt(hd['acc_gain_pts'], '.2f')} pts at the same attainment, "
                f"x{fmt(hd['att_ratio'], '.2f')} attainment at the same accuracy, "
                f"dominated by {ps['dominated_by'] or '-'}"
            )
    if "i" in results:
        i = results["i"]
        print(
            f"\n(i) interference: workers {i['workers']} x{i['factor']} during {i['window_s']} s; seeds {i['seeds']}"
        )
        for check in ("interference", "quiet"):
            print(f"\n{check}: attainment mean (worst seed) / accuracy; 'during' = attainment inside the window")
            print(
                "| λv | CV² | paper's SlackFit, static | during | paper's, adaptive | during | default SlackFit | "
                "during | MinCost |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for c in (c for c in i["cells"] if c["check"] == check):
                st, ad = c["static SlackFit-paper"], c["adaptive SlackFit-paper"]
                df, mc = c["default SlackFit"], c["static MinCost"]

                def one(x):
                    return (
                        f"{x['attainment']['mean']:.4f} ({x['attainment']['min']:.4f}) / {x['accuracy']['mean']:.2f}"
                    )

                print(
                    f"| {c['lambda_v']} | {c['cv2']} | {one(st)} | {st['during']['mean']:.4f} | {one(ad)} | "
                    f"{ad['during']['mean']:.4f} | {one(df)} | {df['during']['mean']:.4f} | {one(mc)} |"
                )
    if "j" in results:
        j = results["j"]
        print(
            f"\n(j) Clipper+(76.69) = Fixed1 and Clipper+(78.25) = Fixed3 attainment, mean (worst), seeds {j['seeds']}"
        )
        print("| λv | CV² | rate × | mean rate (q/s) | Clipper+(76.69) | cap/rate | Clipper+(78.25) | cap/rate |")
        print("|---|---|---|---|---|---|---|---|")
        for r in j["rows"]:
            print(
                f"| {r['lambda_v']} | {r['cv2']} | {r['mult']:g} | {r['rate_qps']:,.0f} | "
                f"{r['Fixed1']['mean']:.4f} ({r['Fixed1']['min']:.4f}) | {r['Fixed1 capacity_over_rate']:.2f} | "
                f"{r['Fixed3']['mean']:.4f} ({r['Fixed3']['min']:.4f}) | {r['Fixed3 capacity_over_rate']:.2f} |"
            )


def report_issue20(results: dict) -> None:
    """Markdown tables of experiments (k) and (l)."""
    if "k" in results:
        k = results["k"]
        print(f"\n(k) Fig. 11b: highest constant rate at >= {k['target']} attainment ({k['duration_s']:g} s traces)")
        print("| workers | policy | max rate (q/s) | attainment | accuracy | resolution (q/s) |")
        print("|---|---|---|---|---|---|")
        for r in k["rows"]:
            m = r["max_rate"]
            if m is None:
                print(f"| {r['workers']} | {r['policy']} | none | - | - | {r['resolution_qps']:,.0f} |")
                continue
            print(
                f"| {r['workers']} | {r['policy']} | {m['rate_qps']:,.0f} | {m['attainment']:.5f} | "
                f"{m['accuracy']:.2f} | {r['resolution_qps']:,.0f} |"
            )
    if "l" in results:
        print(f"\n(l) Fig. 1b: SLO miss rate vs actuation delay, MAF minutes {results['l']['minutes']}")
        print("| policy | delay (ms) | miss rate | accuracy |")
        print("|---|---|---|---|")
        for r in results["l"]["runs"]:
            print(
                f"| {r['policy'].split(':')[0]} | {r['tag'][2] * 1e3:g} | {1 - r['slo_attainment']:.5f} | "
                f"{r['mean_accuracy']:.2f} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", default="a,b,c,d,e,f")
    ap.add_argument("--duration", type=float, default=30.0, help="bursty trace length (s) for (a) and (d)")
    ap.add_argument("--tv-duration", type=float, default=40.0, help="time-varying trace length (s) for (b)")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="multiply every arrival rate (time compression)")
    ap.add_argument("--seed", type=int, default=0, help="trace and noise seed of (a)-(f)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of (g)-(j), one run per seed")
    ap.add_argument(
        "--noise",
        choices=["none", "lognormal"],
        default="none",
        help="simulated latency noise: 'lognormal' samples around the profiled mean with its std",
    )
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--figures", default="docs/figures")
    ap.add_argument("--suffix", default="", help="appended to every figure name (e.g. _x1.5)")
    ap.add_argument("--json", default=None, help="write all results to this JSON file")
    args = ap.parse_args()
    unknown = [e for e in args.experiments.split(",") if e not in EXPERIMENTS]
    if unknown:
        ap.error(f"--experiments: unknown {unknown}; choose from {','.join(EXPERIMENTS)}")
    os.makedirs(args.figures, exist_ok=True)
    results = {}
    for e in args.experiments.split(","):
        t0 = time.perf_counter()
        results[e] = EXPERIMENTS[e](args)
        print(f"experiment {e} done in {time.perf_counter() - t0:.1f} s", flush=True)
    report(results)
    report_added(results)
    report_issue20(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
