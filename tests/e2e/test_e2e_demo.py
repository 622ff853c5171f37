"""``subnetact demo`` and ``subnetact profile`` as a user runs them (console entry point via ``python -m``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scheduling import Profile
from subnetact.demo import (
    PolicyResult,
    combine_trials,
    dominated_beyond_noise,
    format_dominance,
    format_table,
    frontier,
)
from subnetact.demo_load import derive_load

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "subnetact", *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )


def test_demo_runs_end_to_end_and_prints_the_table(tmp_path):
    out = tmp_path / "demo"
    result = _run(
        "demo",
        "--duration",
        "1.0",
        "--policies",
        "slackfit,slackfit-paper,mincost,fixed:0",
        "--batch-sizes",
        "1,4,16",
        "--repeats",
        "3",
        "--background-load",
        "1",
        "--trials",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert "policy" in text and "SLO attain." in text and "accuracy %" in text and "p99 ms" in text
    assert "val acc %" in text and "± sd" in text
    assert "background load: starting 1 busy process(es)" in text and "on the attainment/accuracy frontier" in text
    names = ("slackfit", "slackfit-paper", "mincost", "fixed:0")
    table = {line.split()[0]: line for line in text.splitlines() if line.split() and line.split()[0] in names}
    assert set(table) == set(names), text
    data = json.loads((out / "results.json").read_text())
    rows = {r["policy"]: r for r in data["rows"]}
    assert set(rows) == set(names) and data["settings"]["background_load"] == 1
    # The frontier marks in the table are those computed from the rows.
    on_front = frontier([PolicyResult(**r) for r in data["rows"]])
    assert [table[r["policy"]].split()[1] == "*" for r in data["rows"]] == on_front and any(on_front)
    # The second trial starts one policy later than the first (no policy always runs first).
    progress = [line.split()[2].rstrip(":") for line in text.splitlines() if line.strip().startswith("trial ")]
    assert progress == [*names, *names[1:], names[0]], progress
    # Who dominates whom beyond trial noise: printed under the table and saved, as computed from the rows.
    assert "dominated beyond trial-to-trial noise (paired over 2 trial(s)" in text
    dominated = dominated_beyond_noise([PolicyResult(**r) for r in data["rows"]])
    assert data["dominated_by"] == {r["policy"]: by for r, by in zip(data["rows"], dominated, strict=True)}
    for r in rows.values():
        assert r["requests"] == data["settings"]["requests"] > 0
        # Two trials each; the row is their mean (the table's ± sd and the plot's error bars come from them).
        assert len(r["attainment_trials"]) == len(r["accuracy_trials"]) == 2
        assert r["slo_attainment"] == pytest.approx(sum(r["attainment_trials"]) / 2)
        assert 85.0 <= r["profile_accuracy"] <= 100.0
        assert 0.0 <= r["slo_attainment"] <= 1.0
        assert r["accuracy"] >= 85.0  # measured against the labels; every served subnet is >= 90 % on the test split
        assert r["latency_p99_ms"] >= r["latency_p50_ms"] > 0
    profile = Profile.load(out / "profile.json", check="ignore")
    assert profile.batch_sizes == (1, 4, 16)
    # No --rate / --slo-ms: both derived from the profile the demo measured (recomputed here from profile.json).
    derived = derive_load(profile, workers=1, latency_stat="p99")
    assert "load from the profile: SLO" in text
    assert data["settings"]["rate"] == pytest.approx(derived.rate)
    assert data["settings"]["slo_ms"] == pytest.approx(1e3 * derived.slo_s)
    assert data["settings"]["load_from_profile"] == derived.describe()
    assert "bursts: in" in text and 0.0 <= data["settings"]["windows_over_top_capacity"] <= 1.0
    assert (out / "dynamics.png").stat().st_size > 1000 and (out / "frontier.png").stat().st_size > 1000


def test_profile_command_writes_a_profile(tmp_path):
    path = tmp_path / "p.json"
    result = _run("profile", "--batch-sizes", "1,8", "--repeats", "2", "--warmup", "1", "--out", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    profile = Profile.load(path, check="ignore")
    from subnetact import digits

    rows = digits.info()["pareto"]
    assert profile.ids == tuple(range(len(rows)))
    assert [s.accuracy for s in profile.subnets] == [r["accuracy"] for r in rows]
    assert profile.batch_sizes == (1, 8)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["demo", "--policies", "fastest"],
            "policies contains 'fastest'; allowed: slackfit, slackfit-adaptive, slackfit-paper, maxacc, maxbatch, "
            "mincost, fixed",
        ),
        (["demo", "--duration", "0"], "duration_s=0.0 must be a finite number > 0"),
        (["demo", "--workers", "0"], "workers=0 must be an int >= 1"),
        (["demo", "--trials", "0"], "trials=0 must be an int >= 1"),
        (["profile", "model.safetensors"], "needs --factory module:callable"),
        (["profile", "--batch-sizes", "0"], "must list ints >= 1"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(args, message, tmp_path):
    result = _run(*args, "--out", str(tmp_path / "x"), timeout=120)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr


def _row(name: str, attainment: float, accuracy: float) -> PolicyResult:
    return PolicyResult(name, 100, attainment, accuracy, accuracy, 1.0, 2.0, 100.0, 0, 0, 4.0)


def test_frontier_by_hand():
    rows = [
        _row("a", 0.99, 98.0),  # on: nothing has both >=, one >
        _row("b", 0.999, 97.0),  # on: highest attainment
        _row("c", 0.98, 98.0),  # off: a has better attainment at the same accuracy
        _row("d", 0.99, 97.5),  # off: a has better accuracy at the same attainment
        _row("e", 0.95, 99.0),  # on: highest accuracy
        _row("f", 0.95, 99.0),  # on: equal to e is not dominated
    ]
    assert frontier(rows) == [True, True, False, False, True, True]


def _trials(name: str, attainment: tuple[float, ...], accuracy: tuple[float, ...]) -> PolicyResult:
    return combine_trials([_row(name, a, c) for a, c in zip(attainment, accuracy, strict=True)])


def test_dominance_beyond_trial_noise_by_hand():
    same = (95.0, 95.0, 95.0)
    rows = [
        _trials("a", (0.990, 0.991, 0.992), same),
        _trials("b", (0.995, 0.996, 0.997), same),  # +0.005 in every trial: beyond noise, dominates a
        _trials("c", (0.990, 1.000, 0.980), same),  # mean -0.001 against a: not at least as good
        _trials("d", (0.9904, 0.9914, 0.9924), same),  # +0.0004 every trial: below the 0.0005 floor
        _trials("e", (0.990, 0.991, 0.992), (95.1, 95.1, 95.1)),  # +0.1 points every trial: dominates a
        _trials("f", (1.000, 0.989, 0.993), same),  # +0.003 on average but +0.010/-0.002/+0.001: within noise
        _trials("g", (0.995, 0.996, 0.997), (float("nan"), 94.0, 96.0)),  # nan trial left out: acc +0 vs b
    ]
    by = dict(zip("abcdefg", dominated_beyond_noise(rows), strict=True))
    # a: b and e by the rule; d (floor), f (noise) and c (worse on average) not; g: +0.005 attainment, accuracy
    # paired over the two trials with a value (94, 96 against 95, 95: +0.0), so no worse: it dominates a too.
    assert by["a"] == ["b", "e", "g"]
    assert by["b"] == [] and by["e"] == [] and by["g"] == []  # b vs g: equal attainment, accuracy +0 on average
    # c swings by +-0.01 between trials: only e's +0.1 points in every trial (at +0.001 attainment) is beyond it.
    assert by["c"] == ["e"]
    text = format_dominance(rows)
    assert text.startswith("dominated beyond trial-to-trial noise (paired over 3 trial(s)")
    assert "\n  a by b, e, g\n" in text and "\n  c by e" in text
    rows[0] = _trials("slackfit", (0.990, 0.991, 0.992), same)  # SlackFit's line gives the paired differences
    assert "  slackfit by b (attainment +0.0050 ± 0.0000, accuracy +0.00 ± 0.00), e (attainment +0.0000" in (
        format_dominance(rows)
    )
    assert format_dominance(rows[:1]).endswith(": none")


def test_trials_combine_to_means_with_a_sample_standard_deviation():
    runs = [
        PolicyResult("s", 100, 0.90, 95.0, 94.0, 1.0, 2.0, 100.0, 3, 1, 4.0),
        PolicyResult("s", 120, 1.00, 97.0, 96.0, 3.0, 4.0, 120.0, 0, 2, 6.0),
        PolicyResult("s", 110, 0.95, float("nan"), 95.0, 2.0, 3.0, 110.0, 1, 0, 5.0),  # nothing on time
    ]
    row = combine_trials(runs)
    assert (row.requests, row.dropped, row.late) == (330, 4, 3)  # totals
    assert row.slo_attainment == pytest.approx(0.95) and row.slo_attainment_std == pytest.approx(0.05)
    assert row.accuracy == pytest.approx(96.0) and row.accuracy_std == pytest.approx(2**0.5)  # nan skipped
    assert row.profile_accuracy == pytest.approx(95.0) and row.attainment_trials == (0.90, 1.00, 0.95)
    table = format_table([row])
    line = next(x for x in table.splitlines() if x.startswith("s "))
    assert line.split()[1:5] == ["*", "0.9500", "0.0500", "96.00"] and line.split()[5] == "95.00"


def test_demo_warns_when_no_burst_exceeds_the_top_subnets_capacity(tmp_path):
    result = _run(
        "demo", "--rate", "5", "--duration", "0.5", "--trials", "1", "--policies", "mincost", "--batch-sizes", "1,4",
        "--repeats", "2", "--no-plot", "--out", str(tmp_path / "d"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bursts: in 0 % of the SLO-long windows" in result.stdout
    assert "warning: no burst exceeds the most accurate subnet's capacity" in result.stdout
