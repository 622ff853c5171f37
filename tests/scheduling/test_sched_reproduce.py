"""benchmarks/scheduling/reproduce.py's issue-12 additions: the run wrapper, the per-seed summaries, and the E6 finding
the reproduction documents (queue-aware SlackFit serves the 80.16 % subnet at 7000 q/s, the literal rule does not)."""

import importlib.util
import math
from pathlib import Path

import pytest

from scheduling import Interference, LatencyModel, SimConfig, SlackFit, datasets, simulate, traces

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "scheduling" / "reproduce.py"
_spec = importlib.util.spec_from_file_location("reproduce", _PATH)
reproduce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reproduce)

PROFILE = datasets.superserve_a40_profile()


def test_run_applies_slo_workers_noise_interference_and_feedback():
    spec = ("bursty", 1500, 4900, 4, 3.0, 2)
    window = (Interference(1.0, 2.0, 1.5, (0, 1)),)
    cfg = {"slo_s": 0.030, "num_workers": 6, "latency_noise": "lognormal", "seed": 2, "interference": window}
    got = reproduce.run((("t",), spec, "SlackFit", {**cfg, "adaptive": True}, 1.0))
    # The same simulation called directly (an independent path through the public API).
    arrivals = traces.bursty(1500, 4900, cv2=4, duration_s=3.0, seed=2)
    want = simulate(SlackFit(PROFILE), arrivals, SimConfig(**cfg), latency_model=LatencyModel(PROFILE)).summary
    assert got["slo_attainment"] == want.slo_attainment and got["mean_accuracy"] == want.mean_accuracy
    assert (got["total"], got["dropped"], got["batches"]) == (want.total, want.dropped, want.batches)
    static = reproduce.run((("t",), spec, "SlackFit", {**cfg, "adaptive": False}, 1.0))
    assert static["batches"] != got["batches"]  # feedback changed the plan
    # Without "adaptive" the simulator's default: the default SlackFit plans with a model of its own.
    default = reproduce.run((("t",), spec, "SlackFit", cfg, 1.0))
    assert (default["batches"], default["slo_attainment"]) == (got["batches"], got["slo_attainment"])


def test_seed_summaries_by_hand():
    rows = [{"x": 0.5, "shares": {4: 0.75, 5: 0.25}}, {"x": 1.0, "shares": {4: 1.0}}]
    assert reproduce.over_seeds(rows, "x") == {"mean": 0.75, "min": 0.5, "max": 1.0}
    shares = reproduce.mean_shares(rows)
    assert set(shares) == {str(i) for i in PROFILE.ids}
    assert shares["5"] == {"mean": 0.125, "min": 0.0, "max": 0.25} and shares["0"]["max"] == 0.0
    # windows: (bin start, attainment, accuracy, finished); [1, 3) holds 10 at 0.9 and 30 at 0.5 -> 24 / 40.
    r = {"windows": [(0.0, 1.0, 80.0, 5), (1.0, 0.9, 80.0, 10), (2.0, 0.5, 80.0, 30), (3.0, 0.0, math.nan, 7)]}
    assert reproduce._phase_attainment(r, 1.0, 3.0) == pytest.approx(0.6)
    assert math.isnan(reproduce._phase_attainment(r, 10.0, 11.0))


def test_choice_table_matches_decide():
    table = reproduce.slackfit_choice_table(queue_lens=(1, 16, 32), slacks_ms=(10, 22, 36))
    sf = SlackFit(PROFILE, backlog_aware=False, latency_stat="mean")  # the paper's rule, which the table explains
    for q, row in table["rows"].items():
        for s_ms, cell in zip(table["slacks_ms"], row, strict=True):
            d = sf.decide(s_ms / 1e3, q, 0.0)
            assert cell == f"{d.subnet_id}/{d.profile_batch}"
    # The cells docs/reproduction.md (g) builds its explanation on.
    assert table["rows"][16][1] == "5/16" and table["rows"][32][2] == "4/32"


def test_e6_queue_aware_paper_rule_serves_the_largest_subnet_the_literal_rule_does_not():
    spec = ("bursty", 1500, 5500, 2, 4.0, 0)
    kw = {"latency_noise": "lognormal", "seed": 0, "record_timeline": True}
    aware = reproduce.run((("g",), spec, "SlackFit-paper", kw, 1.0))
    literal = reproduce.run((("g",), spec, "SlackFit-lit", kw, 1.0))
    top = PROFILE.ids[-1]
    assert aware["shares"].get(top, 0.0) > 0.15
    assert literal["shares"].get(top, 0.0) < 0.01
    assert aware["slo_attainment"] > 0.999 and literal["slo_attainment"] > 0.999
    assert sum(n for k, n in aware["requests_by_subnet_batch"].items()) == aware["total"] - aware["dropped"]


def test_slack_histogram_and_recorded_slacks():
    h = reproduce.slack_histogram([-0.001, 0.0, 0.0004, 0.0006, 0.0299, 0.5], 0.030, bin_ms=0.5)
    assert len(h["counts"]) == 60 and h["decisions"] == 6
    # Below 0 lands in bin 0, 0.6 ms in bin 1, 29.9 ms and 500 ms in the last bin.
    assert h["counts"][0] == 3 and h["counts"][1] == 1 and h["counts"][59] == 2 and sum(h["counts"]) == 6
    assert reproduce.hist_quantile(h, 0.5) == 0.5 and reproduce.hist_quantile(h, 1.0) == 30.0
    # Recording the head's slack leaves the run unchanged and sees every decision, all within the SLO.
    spec = ("bursty", 1500, 2000, 2, 2.0, 1)
    cfg = {"slo_s": 0.030, "num_workers": 6, "seed": 1}
    plain = reproduce.run((("h",), spec, "Fixed3", cfg, 1.0))
    rec = reproduce.run((("h",), spec, "Fixed3", {**cfg, "record_slack": True}, 1.0))
    assert (rec["batches"], rec["slo_attainment"]) == (plain["batches"], plain["slo_attainment"])
    assert rec["slack_hist"]["decisions"] >= rec["batches"]
    lo, hi = reproduce.latency_span_ms("Fixed3", 0.030)
    lats = [st.mean_s * 1e3 for st in PROFILE.subnets[3].latency.values() if st.mean_s <= 0.030]
    assert (lo, hi) == (min(lats), max(lats))


def test_max_sustained_rate_brackets_the_target():
    got = reproduce.max_sustained_rate(("Fixed0", 1, "none", 0, 0.5, 0.999, 5))
    rate, res = got["max_rate"]["rate_qps"], got["resolution_qps"]
    cfg = SimConfig(slo_s=reproduce.SLO, num_workers=1, seed=0)

    def attainment(r):
        arrivals = [k / r for k in range(int(r * 0.5))]
        return simulate(reproduce.make_policy("Fixed0"), arrivals, cfg).summary.slo_attainment

    assert attainment(rate) >= 0.999 > attainment(rate + res)
    # One worker at subnet 0's best batch (32 in 12.1 ms) serves at most ~2,645 q/s.
    assert 1000 < rate <= 2700
