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
    sf = SlackFit(PROFILE)
    for q, row in table["rows"].items():
        for s_ms, cell in zip(table["slacks_ms"], row, strict=True):
            d = sf.decide(s_ms / 1e3, q, 0.0)
            assert cell == f"{d.subnet_id}/{d.profile_batch}"
    # The cells docs/reproduction.md (g) builds its explanation on.
    assert table["rows"][16][1] == "5/16" and table["rows"][32][2] == "4/32"


def test_e6_queue_aware_serves_the_largest_subnet_the_literal_rule_does_not():
    spec = ("bursty", 1500, 5500, 2, 4.0, 0)
    kw = {"latency_noise": "lognormal", "seed": 0, "record_timeline": True}
    aware = reproduce.run((("g",), spec, "SlackFit", kw, 1.0))
    literal = reproduce.run((("g",), spec, "SlackFit-lit", kw, 1.0))
    top = PROFILE.ids[-1]
    assert aware["shares"].get(top, 0.0) > 0.15
    assert literal["shares"].get(top, 0.0) < 0.01
    assert aware["slo_attainment"] > 0.999 and literal["slo_attainment"] > 0.999
    assert sum(n for k, n in aware["requests_by_subnet_batch"].items()) == aware["total"] - aware["dropped"]
