"""Profile: validation, own JSON schema, SuperServe importer and the P1/P2 report."""

import json
import math
import warnings
from itertools import pairwise

import pytest

from scheduling import (
    InvalidProfileError,
    LatencyStats,
    Profile,
    ProfilePropertyWarning,
    Subnet,
    UnknownSubnetError,
    datasets,
    synthetic_profile,
)
from scheduling.profile import SUPERSERVE_WORKER_STAGES


def _two() -> Profile:
    return Profile(
        (
            Subnet("a", 70.0, {1: LatencyStats(0.002, 0.003, 0.0001), 8: LatencyStats(0.005)}, {"depth": 2}),
            Subnet("b", 80.0, {1: LatencyStats(0.004), 8: LatencyStats(0.012, samples_s=(0.011, 0.013))}),
        ),
        name="two",
        metadata={"gpu": "none"},
    )


def test_lookups():
    p = _two()
    assert p.batch_sizes == (1, 8)
    assert p.ids == ("a", "b")
    assert p.latency("b", 8) == 0.012
    assert p.latency("a", 1, "p99") == 0.003
    assert p.latency("b", 1, "p99") == 0.004  # p99 defaults to the mean
    assert p.min_latency() == 0.002
    with pytest.raises(UnknownSubnetError, match=r"unknown subnet id 'c'.*\['a', 'b'\]"):
        p.subnet("c")
    with pytest.raises(InvalidProfileError, match="batch_size 4 was not profiled"):
        p.latency("a", 4)


def test_json_round_trip(tmp_path):
    p = _two()
    path = tmp_path / "p.json"
    p.save(path)
    q = Profile.load(path)
    assert q.to_dict() == p.to_dict()
    assert q.subnet("a").config == {"depth": 2}
    assert q.subnet("b").latency[8].samples_s == (0.011, 0.013)
    assert json.loads(path.read_text())["schema"] == "scheduling.profile/1"


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Profile(()), "at least one subnet"),
        (
            lambda: Profile((Subnet(1, 70, {1: LatencyStats(0.01)}), Subnet(1, 71, {1: LatencyStats(0.02)}))),
            "duplicate subnet id 1",
        ),
        (
            lambda: Subnet(1, math.nan, {1: LatencyStats(0.01)}),
            "accuracy of subnet 1 must be a finite number, got nan",
        ),
        (lambda: Subnet(1, 70.0, {}), "non-empty mapping"),
        (lambda: Subnet(1, 70.0, {0: LatencyStats(0.01)}), r"must be ints in \[1, 65536\], got 0"),
        (lambda: Subnet(1.5, 70.0, {1: LatencyStats(0.01)}), "subnet id must be an int or str, got 1.5"),
        (lambda: LatencyStats(-0.001), "mean_s must be a positive finite number of seconds, got -0.001"),
        (lambda: LatencyStats(math.inf), "mean_s must be a positive finite"),
        (lambda: LatencyStats(0.01, math.nan), "p99_s must be a positive finite"),
        (lambda: LatencyStats(0.01, std_s=-1.0), "std_s must be a finite number >= 0"),
    ],
)
def test_bad_profiles_raise(make, match):
    with pytest.raises(InvalidProfileError, match=match):
        make()


def test_bad_schema_and_check_mode(tmp_path):
    with pytest.raises(InvalidProfileError, match="expected a mapping with 'schema'"):
        Profile.from_dict({"subnets": []})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidProfileError, match="is not valid JSON"):
        Profile.load(bad)
    with pytest.raises(InvalidProfileError, match="check must be 'warn', 'raise' or 'ignore', got 'loud'"):
        Profile.from_dict(_two().to_dict(), check="loud")


def _raw():
    return datasets.superserve_a40_raw()


def test_superserve_import_all_stages_gives_back_the_file_totals():
    raw = _raw()
    p = Profile.from_superserve(
        raw, stages=("deserialize", "h2d_copy", "forward", "postprocess", "d2h_copy"), check="ignore"
    )
    for m in raw["models"]:
        for e in m["latency_and_batch_ns"]:
            st = p.subnet(m["id"]).latency[e["batch_size"]]
            assert st.mean_s == pytest.approx(e["mean"] * 1e-9, rel=1e-12)
            assert st.std_s == pytest.approx(e["std"] * 1e-9, rel=1e-9)
            assert st.p99_s == pytest.approx(e["p99"] * 1e-9, rel=1e-9)
    assert p.subnet(5).accuracy == 80.158


def test_superserve_import_default_stages_by_hand():
    raw = _raw()
    e = raw["models"][0]["latency_and_batch_ns"][0]  # subnet 0, batch 1
    st = e["stages"]
    mean = st["h2d_copy"]["mean"] + st["forward"]["mean"] + st["postprocess"]["mean"] + st["d2h_copy"]["mean"]
    p99 = (
        st["h2d_copy"]["p99"]
        + st["forward"]["mean"]
        + 2.326 * st["forward"]["std"]
        + st["postprocess"]["p99"]
        + st["d2h_copy"]["p99"]
    )
    p = datasets.superserve_a40_profile()
    assert p.metadata["stages"] == list(SUPERSERVE_WORKER_STAGES)
    assert p.latency(0, 1) == pytest.approx(mean * 1e-9)
    assert p.latency(0, 1, "p99") == pytest.approx(p99 * 1e-9)
    assert p.batch_sizes == (1, 2, 4, 8, 16, 32)
    assert [s.accuracy for s in p.subnets] == [73.822, 76.686, 77.636, 78.25, 79.44, 80.158]
    assert p.subnet(3).config["constraint_mflop"] == 2000


def test_superserve_import_errors():
    with pytest.raises(InvalidProfileError, match="stages must be distinct names"):
        Profile.from_superserve(_raw(), stages=("forward", "jpeg"))
    with pytest.raises(InvalidProfileError, match="no 'models' list"):
        Profile.from_superserve({"nothing": 1})


def test_property_report_on_a40_matches_the_known_caveats():
    p = datasets.superserve_a40_profile()
    rep = p.check_properties()
    assert not rep.ok
    # Subnet 0 is faster at batch 4 than at batch 2 (and than at 1); subnet 5 is faster than subnet 4 at batch 1.
    assert any(v.subnet_ids == (0,) and v.batch_sizes == (2, 4) for v in rep.p1)
    assert any(v.subnet_ids == (4, 5) and v.batch_sizes == (1,) for v in rep.p2)
    # Brute-force reference for P1 on consecutive batch sizes.
    expected_p1 = {
        (s.id, b0, b1)
        for s in p.subnets
        for b0, b1 in pairwise(p.batch_sizes)
        if s.latency[b1].mean_s < s.latency[b0].mean_s
    }
    assert {(v.subnet_ids[0], *v.batch_sizes) for v in rep.p1} == expected_p1
    # The report does not change the data.
    assert p.latency(0, 4) < p.latency(0, 1)
    assert "P2: at batch 1 subnet 5" in str(rep)


def test_loader_warns_raises_or_ignores_violations():
    raw = _raw()
    with pytest.warns(ProfilePropertyWarning, match="violates the monotonicity properties"):
        Profile.from_superserve(raw)
    with pytest.raises(InvalidProfileError, match="P1: subnet 0"):
        Profile.from_superserve(raw, check="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Profile.from_superserve(raw, check="ignore")
        synthetic = synthetic_profile(20, (1, 2, 4, 8), seed=3)
        assert synthetic.check_properties().ok
        Profile.from_dict(synthetic.to_dict())  # a monotone profile does not warn
