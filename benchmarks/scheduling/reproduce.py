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

Everything is seeded; every run uses 8 workers, the SuperServe authors' A40 OFA-ResNet50 profile with worker latency =
h2d + forward + postprocess + d2h (no JPEG decode), SLO 36 ms and the drop rule. Example::

    python benchmarks/scheduling/reproduce.py --experiments a,b,c,d,e,f --jobs 2 \\
        --figures docs/figures --json docs/figures/reproduction_results.json
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
    MaxAcc,
    MaxBatch,
    MinCost,
    SimConfig,
    SlackFit,
    datasets,
    simulate,
    traces,
)
from scheduling.metrics import rate_series, windowed_outcomes

SLO = 0.036
WORKERS = 8
PROFILE = datasets.superserve_a40_profile()
ACC = {s.id: s.accuracy for s in PROFILE.subnets}
BASELINES = ["MinCost"] + [f"Fixed{i}" for i in PROFILE.ids]


# ----------------------------------------------------------------------------- building blocks
def make_policy(name: str):
    if name.endswith("-lit"):  # the paper's literal rule: decide from the slack only, ignoring the queue length
        return {"SlackFit": SlackFit, "MaxAcc": MaxAcc, "MaxBatch": MaxBatch}[name[:-4]](PROFILE, queue_aware=False)
    if name == "SlackFit":
        return SlackFit(PROFILE)
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
    """One simulation: (tag, trace spec, policy name, SimConfig kwargs, scale) -> summary dict (+ dynamics)."""
    tag, trace_spec, policy_name, cfg_kwargs, scale = job
    arrivals = make_trace(trace_spec)
    if scale != 1.0:  # scale the rate by compressing time (keeps the trace's shape and CV²)
        arrivals = [t / scale for t in arrivals]
    cfg = SimConfig(slo_s=SLO, num_workers=WORKERS, **cfg_kwargs)
    t0 = time.perf_counter()
    r = simulate(make_policy(policy_name), arrivals, cfg)
    wall = time.perf_counter() - t0
    out = {"tag": tag, "policy": policy_name, "requests": len(arrivals), "wall_s": wall, **r.summary.as_dict()}
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
    return out


def run_all(jobs: list[tuple], n_jobs: int) -> list[dict[str, Any]]:
    if n_jobs <= 1:
        return [run(j) for j in jobs]
    with ProcessPoolExecutor(n_jobs) as ex:
        return list(ex.map(run, jobs, chunksize=1))


def capacity_table() -> list[tuple[Any, float, int, float]]:
    """Per subnet: (id, accuracy, best batch, max throughput of 8 workers) over batches with latency <= SLO."""
    rows = []
    for s in PROFILE.subnets:
        best = max((b / st.mean_s, b) for b, st in s.latency.items() if st.mean_s <= SLO)
        rows.append((s.id, s.accuracy, best[1], WORKERS * best[0]))
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
def exp_a(args) -> dict:
    lvs, cvs = [2950, 4900, 5550], [2, 4, 8]
    pols = ["SlackFit", *BASELINES]
    jobs = [
        (("a", lv, cv), ("bursty", 1500, lv, cv, args.duration, args.seed), p, {}, args.rate_scale)
        for lv in lvs
        for cv in cvs
        for p in pols
    ]
    res = run_all(jobs, args.jobs)
    cells: dict[tuple, list[dict]] = {}
    for r in res:
        cells.setdefault(r["tag"][1:], []).append(r)
    scatter_grid(cells, lvs, cvs, "λv", "CV²", "(a) bursty traces, λb=1500, SLO 36 ms (cf. paper Fig. 9)",
                 figpath(args, "repro_a_bursty.png"))  # fmt: skip
    table = []
    for key, rs in cells.items():
        sf = next(r for r in rs if r["policy"] == "SlackFit")
        base = [r for r in rs if r["policy"] != "SlackFit"]
        table.append({"lambda_v": key[0], "cv2": key[1], "slackfit": sf, "dominated_by": dominated_by(sf, base),
                      "headline": headline(sf, base), "baselines": base})  # fmt: skip
    return {"cells": table}


def exp_b(args) -> dict:
    l2s, taus = [4800, 6800, 7800], [250, 500, 5000]
    pols = ["SlackFit", *BASELINES]
    jobs = [
        (("b", l2, tau), ("timevarying", 2500, l2, tau, 8.0, args.tv_duration, 5.0, args.seed), p, {}, args.rate_scale)
        for l2 in l2s
        for tau in taus
        for p in pols
    ]
    res = run_all(jobs, args.jobs)
    cells: dict[tuple, list[dict]] = {}
    for r in res:
        cells.setdefault(r["tag"][1:], []).append(r)
    scatter_grid(cells, l2s, taus, "λ2", "τ", "(b) time-varying traces, λ1=2500, CV²=8 (cf. paper Fig. 10)",
                 figpath(args, "repro_b_timevarying.png"))  # fmt: skip
    table = []
    for key, rs in cells.items():
        sf = next(r for r in rs if r["policy"] == "SlackFit")
        base = [r for r in rs if r["policy"] != "SlackFit"]
        table.append({"lambda2": key[0], "tau": key[1], "slackfit": sf, "dominated_by": dominated_by(sf, base),
                      "headline": headline(sf, base), "baselines": base})  # fmt: skip
    return {"cells": table}


def exp_c(args) -> dict:
    spec = ("maf", 120.0, 6400.0, None, args.seed)
    jobs = [(("c",), spec, p, {"record_timeline": p == "SlackFit"}, args.rate_scale) for p in ["SlackFit", *BASELINES]]
    res = run_all(jobs, args.jobs)
    sf = next(r for r in res if r["policy"] == "SlackFit")
    base = [r for r in res if r["policy"] != "SlackFit"]
    scatter_grid({(6400, 120): res}, [6400], [120], "mean q/s", "seconds", "(c) MAF trace (cf. paper Fig. 8a)",
                 figpath(args, "repro_c_maf.png"))  # fmt: skip
    dynamics_plot(sf, "(c) SlackFit system dynamics on the MAF trace (cf. paper Fig. 8c)",
                  figpath(args, "repro_c_maf_dynamics.png"))  # fmt: skip
    peak = max(r for _, r in sf["rate"])
    for r in res:
        r.pop("rate", None), r.pop("windows", None), r.pop("decisions", None)
    return {"slackfit": sf, "baselines": base, "dominated_by": dominated_by(sf, base), "headline": headline(sf, base),
            "peak_rate_qps": peak}  # fmt: skip


def exp_d(args) -> dict:
    cvs = [2, 4, 8]
    pols = ["SlackFit", "MaxAcc", "MaxBatch", "SlackFit-lit", "MaxAcc-lit", "MaxBatch-lit"]
    jobs = [
        (("d", cv), ("bursty", 1500, 5550, cv, args.duration, args.seed), p, {}, args.rate_scale)
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
                {"worker_failures": kills, "record_timeline": True},
                args.rate_scale,
            )
            for p in ["SlackFit", "Fixed4", "Fixed5"]
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


def exp_f(args) -> dict:
    counts = datasets.maf_per_minute()
    # The burstiest hour of the sample (largest minute-to-minute swings), compressed to 20 s at mean 6400 q/s.
    best = max(range(0, 1440 - 60), key=lambda m: sum(abs(counts[i + 1] - counts[i]) for i in range(m, m + 59)))
    spec = ("maf", 20.0, 6400.0, (best, best + 60), args.seed)
    peak_guess = 6400.0 * max(counts[best : best + 60]) * 60 / sum(counts[best : best + 60])
    gear = f"GearPlan:{peak_guess:.0f}"
    jobs = []
    for p in ["SlackFit", gear]:
        for delay in (0.0, 0.1):
            jobs.append(
                (("f", p, delay), spec, p, {"actuation_delay_s": delay, "record_timeline": True}, args.rate_scale)
            )
    res = run_all(jobs, args.jobs)
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    t, rate = zip(*res[0]["rate"], strict=True)
    axes[0].plot(t, rate, lw=0.8)
    axes[0].set_ylabel("ingest (q/s)")
    for r in res:
        lab = f"{'SlackFit' if r['policy'] == 'SlackFit' else 'GearPlan'}, {r['tag'][2] * 1e3:.0f} ms actuation"
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


EXPERIMENTS = {"a": exp_a, "b": exp_b, "c": exp_c, "d": exp_d, "e": exp_e, "f": exp_f}


# ----------------------------------------------------------------------------- report
def report(results: dict) -> None:
    print("\nCapacity of 8 workers per subnet (best batch with latency <= SLO):")
    for sid, acc, b, cap in capacity_table():
        print(f"  subnet {sid} ({acc:.2f}%): batch {b}, {cap:,.0f} q/s")

    def grid(name, cells, k1, k2):
        print(f"\n({name}) cell | SlackFit att / acc | best baseline at >= att | headline | dominated by")
        for c in cells:
            sf, h = c["slackfit"], c["headline"]
            same = [b for b in c["baselines"] if b["slo_attainment"] >= sf["slo_attainment"] - 1e-4]
            bb = max(same, key=lambda b: b["mean_accuracy"]) if same else None
            bbs = f"{_label(bb['policy'])} {bb['slo_attainment']:.5f}/{bb['mean_accuracy']:.2f}" if bb else "none"
            print(f"  {k1}={c[k1]}, {k2}={c[k2]} | {sf['slo_attainment']:.5f} / {sf['mean_accuracy']:.2f} | {bbs} | "
                  f"+{fmt(h['acc_gain_pts'], '.2f')} pts, x{fmt(h['att_ratio'], '.2f')} | "
                  f"{c['dominated_by'] or '-'}")  # fmt: skip

    if "a" in results:
        grid("a", results["a"]["cells"], "lambda_v", "cv2")
    if "b" in results:
        grid("b", results["b"]["cells"], "lambda2", "tau")
    if "c" in results:
        c = results["c"]
        print(f"\n(c) MAF: peak {c['peak_rate_qps']:,.0f} q/s")
        for r in [c["slackfit"], *c["baselines"]]:
            print(f"  {_label(r['policy']):<18} att {r['slo_attainment']:.6f} acc {r['mean_accuracy']:.3f}")
        print(f"  headline: {c['headline']}, dominated by {c['dominated_by'] or '-'}")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", default="a,b,c,d,e,f")
    ap.add_argument("--duration", type=float, default=30.0, help="bursty trace length (s) for (a) and (d)")
    ap.add_argument("--tv-duration", type=float, default=40.0, help="time-varying trace length (s) for (b)")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="multiply every arrival rate (time compression)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--figures", default="docs/figures")
    ap.add_argument("--suffix", default="", help="appended to every figure name (e.g. _x1.5)")
    ap.add_argument("--json", default=None, help="write all results to this JSON file")
    args = ap.parse_args()
    os.makedirs(args.figures, exist_ok=True)
    results = {}
    for e in args.experiments.split(","):
        t0 = time.perf_counter()
        results[e] = EXPERIMENTS[e](args)
        print(f"experiment {e} done in {time.perf_counter() - t0:.1f} s", flush=True)
    report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
