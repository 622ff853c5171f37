"""``subnetact demo`` and ``subnetact profile`` as a user runs them (console entry point via ``python -m``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scheduling import Profile

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
        "slackfit,mincost,fixed:0",
        "--batch-sizes",
        "1,4,16",
        "--repeats",
        "3",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert "policy" in text and "SLO attain." in text and "accuracy %" in text and "p99 ms" in text
    for name in ("slackfit", "mincost", "fixed:0"):
        assert any(line.startswith(name) for line in text.splitlines()), text
    data = json.loads((out / "results.json").read_text())
    rows = {r["policy"]: r for r in data["rows"]}
    assert set(rows) == {"slackfit", "mincost", "fixed:0"}
    for r in rows.values():
        assert r["requests"] == data["settings"]["requests"] > 0
        assert 0.0 <= r["slo_attainment"] <= 1.0
        assert r["accuracy"] >= 85.0  # measured against the labels; every served subnet is >= 90 % on the test split
        assert r["latency_p99_ms"] >= r["latency_p50_ms"] > 0
    profile = Profile.load(out / "profile.json", check="ignore")
    assert profile.batch_sizes == (1, 4, 16)
    assert (out / "dynamics.png").stat().st_size > 1000


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
        (["demo", "--policies", "fastest"], "policies contains 'fastest'; allowed: slackfit, mincost, maxacc, fixed"),
        (["demo", "--duration", "0"], "duration_s=0.0 must be a finite number > 0"),
        (["demo", "--workers", "0"], "workers=0 must be an int >= 1"),
        (["profile", "model.safetensors"], "needs --factory module:callable"),
        (["profile", "--batch-sizes", "0"], "must list ints >= 1"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(args, message, tmp_path):
    result = _run(*args, "--out", str(tmp_path / "x"), timeout=120)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
