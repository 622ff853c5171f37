"""A server whose start-up profile is far too slow does not fail closed (issue 20).

The profile says every subnet takes 200-800 ms, the deadline budget is 100 ms, the model really takes a few ms:
without correction the drop rule answers 504 to every request before any runs, so nothing is ever timed. The plan
guard reports not-ready with the reason, probes, and the backend's latency model brings the plan back within the
budget; a static backend stays not-ready (nothing can correct it) and says why. The app runs on uvicorn on loopback
(its lifespan runs the guard), driven with http.client.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import math
import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from scheduling import DeadlineMissedError, LatencyModel, LatencyStats, Profile, Subnet  # noqa: E402
from subnetact.serving import LocalBackend, PlanGuard, ServingApp, make_server  # noqa: E402
from subnetact.serving.backend import PROFILE_ERROR_LIMIT  # noqa: E402

BUDGET_MS = 100.0
SLOW = 40.0  # how much slower than the machine the start-up profile is


def _slow_profile() -> Profile:
    """Three subnets whose profiled latencies (200-800 ms) are all above the 100 ms budget."""
    subnets = []
    for i, (acc, base) in enumerate(((70.0, 0.200), (75.0, 0.300), (80.0, 0.400))):
        lat = {b: LatencyStats(base * (1 + 0.5 * k), base * (1 + 0.5 * k) * 1.1) for k, b in enumerate((1, 2, 4))}
        subnets.append(Subnet(i, acc, lat, {"id": i}))
    return Profile(tuple(subnets), name="slow start-up profile")


def _runner(profile: Profile):
    """The model as it really is: SLOW x faster than the profile (5-20 ms a batch)."""

    def run(subnet_id, payloads):
        time.sleep(profile.latency(subnet_id, 1) / SLOW)
        return [{"prediction": 0, "subnet": subnet_id, "batch_size": len(payloads)} for _ in payloads]

    return run


class _Served:
    """The app on uvicorn in a thread (lifespan on: the plan guard runs), on a free loopback port."""

    def __init__(self, app: ServingApp):
        bound = threading.Event()
        self.server = make_server(app, port=0, ready=lambda h, p: bound.set())
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        assert bound.wait(30), "server did not start"
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def predict(self) -> tuple[int, dict]:
        return self.request("POST", "/predict", {"input": [0.5, 0.5]})

    def wait_ready(self, timeout_s: float) -> bool:
        limit = time.monotonic() + timeout_s
        while time.monotonic() < limit:
            if self.request("GET", "/readyz")[0] == 200:
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "server did not stop"


def test_a_far_too_slow_profile_is_corrected_by_probes_and_traffic(caplog):
    profile = _slow_profile()
    backend = LocalBackend(_runner(profile), profile, workers=1)
    app = ServingApp(backend, input_shape=(2,), default_deadline_ms=BUDGET_MS)
    caplog.set_level(logging.INFO, logger="subnetact.serving")
    # Before the guard runs the server fails closed: the plan is infeasible and a request is dropped unserved.
    status = app.plan_guard.check()
    assert not status.feasible and math.isclose(status.fastest_s, 0.2)
    assert "100 ms deadline budget" in status.reason and "200.0 ms" in status.reason and "probes" in status.reason
    with pytest.raises(DeadlineMissedError):
        asyncio.run(backend.infer([0.5, 0.5], time.time() + BUDGET_MS / 1e3))
    assert backend.latency_model.observed == 0  # nothing ran, so nothing could have corrected the plan
    served = _Served(app)
    try:
        assert served.wait_ready(10.0), served.request("GET", "/readyz")
        assert app.plan_guard.probes >= 1
        model = backend.latency_model
        assert model.observed >= 1 and model.rejected == 0
        # Traffic from here on is served on time and refines the plan towards the real speed.
        answers = [served.predict() for _ in range(40)]
        assert sum(code == 200 for code, _ in answers) >= 38, [a for a in answers if a[0] != 200]
        assert backend.fastest_latency_s() < BUDGET_MS / 1e3
        # The estimate moved down towards the runner's real time (5 ms for subnet 0 at batch 1), from 200 ms.
        assert model.estimate(0, 1) < 0.2 / 4
        # GET /stats shows what the server plans with now: the same numbers the backend and its model hold.
        plan = served.request("GET", "/stats")[1]["plan"]
        assert plan["feasible"] is True and plan["budget_ms"] == BUDGET_MS
        assert plan["fastest_planned_ms"] == pytest.approx(1e3 * backend.fastest_latency_s(), abs=1e-3)
        assert plan["batches_timed"] == model.observed and plan["batches_rejected"] == 0
        assert plan["probes"] == app.plan_guard.probes
        (wid,) = backend.scheduler.workers
        assert plan["worker_factors"] == {str(wid): pytest.approx(model.worker_factor(wid), abs=1e-4)}
        assert plan["worker_factors"][str(wid)] < 1 / 4  # the worker runs many times faster than the profile said
        assert plan["tail"] >= 1.0
    finally:
        served.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "subnetact.serving"]
    assert lines[0].startswith("plan: ") and "NOT READY" in lines[0] and "100 ms" in lines[0], lines
    assert any(line.startswith("re-plan: ") and line.endswith("ready") for line in lines[1:]), lines


def test_a_static_backend_stays_not_ready_and_says_why():
    profile = _slow_profile()
    backend = LocalBackend(_runner(profile), profile, workers=1, latency_model=False)
    served = _Served(ServingApp(backend, input_shape=(2,), default_deadline_ms=BUDGET_MS))
    try:
        time.sleep(0.6)  # a couple of guard rounds
        code, body = served.request("GET", "/readyz")
        assert code == 503 and "does not re-measure" in body["reason"], body
        plan = served.request("GET", "/stats")[1]["plan"]
        assert plan["feasible"] is False and plan["fastest_planned_ms"] == pytest.approx(200.0)  # the profile's
        assert "batches_timed" not in plan and "worker_factors" not in plan  # no latency model
        assert served.predict()[0] == 504
        assert served.server.config.app.plan_guard.probes == 0  # nothing would learn from a probe
    finally:
        served.close()


def test_a_feasible_plan_is_ready_and_never_probed():
    slow = _slow_profile()
    fast = Profile(
        tuple(
            Subnet(
                s.id, s.accuracy, {b: LatencyStats(st.mean_s / SLOW, st.p99_s / SLOW) for b, st in s.latency.items()}
            )
            for s in slow.subnets
        )
    )
    app = ServingApp(LocalBackend(_runner(slow), fast, workers=1), input_shape=(2,), default_deadline_ms=BUDGET_MS)
    served = _Served(app)
    try:
        time.sleep(0.3)
        assert served.request("GET", "/readyz") == (200, {"ready": True})
        assert app.plan_guard.probes == 0 and app.plan_guard.check().feasible
    finally:
        served.close()


@pytest.mark.parametrize("slow", [10.0, 100.0, 500.0])
def test_the_servers_latency_model_corrects_a_profile_far_too_slow_within_a_few_batches(slow):
    # The mechanism without clocks: batches timed `slow` x faster than profiled, 20 ms apart. The server's model
    # (max_ratio PROFILE_ERROR_LIMIT) converges; LatencyModel's default (max_ratio 20) rejects every sample beyond 20x.
    profile = _slow_profile()
    served = LocalBackend(_runner(profile), profile, workers=1).latency_model
    default = LatencyModel(profile)
    assert served.max_ratio == PROFILE_ERROR_LIMIT
    batches = None
    for n in range(1, 41):
        true = profile.latency(0, 1) / slow
        served.record(0, 0, 1, true, now=0.02 * n)
        default.record(0, 0, 1, true, now=0.02 * n)
        if batches is None and served.estimate(0, 1) <= BUDGET_MS / 1e3:
            batches = n
    assert batches is not None and batches <= 2  # one sample halves the estimate: 200 ms -> 100 ms
    assert math.isclose(served.estimate(0, 1), profile.latency(0, 1) / slow, rel_tol=0.1)
    # Every entry moves with the worker factor, also those never measured: within 2x of the truth (the measured
    # entry's own offset took a share of the correction; it is 1.46x at 500x after 40 batches), from `slow` x.
    truth = profile.latency(2, 4) / slow
    assert truth <= served.estimate(2, 4) <= 2 * truth
    assert default.rejected == (40 if slow > default.max_ratio else 0)


def test_plan_guard_rejects_a_bad_interval():
    profile = _slow_profile()
    backend = LocalBackend(_runner(profile), profile, workers=1)
    try:
        with pytest.raises(ValueError, match=r"interval_s=0"):
            PlanGuard(backend, budget_s=0.1, input_shape=(2,), interval_s=0)
        with pytest.raises(ValueError, match=r"latency_model='yes'"):
            LocalBackend(_runner(profile), profile, latency_model="yes")
    finally:
        backend.scheduler.close(drain=False)


def test_a_backend_that_reports_no_plan_is_never_found_infeasible():
    class Opaque:  # e.g. a framework batcher behind the front end: no fastest_latency_s, no latency model
        profile = None

    guard = PlanGuard(Opaque(), budget_s=0.1, input_shape=(2,))
    status = guard.check()
    assert status.feasible and math.isnan(status.fastest_s) and status.reason is None and not guard.adaptive
    assert (
        guard.describe(status) == "plan: Opaque; static profile; the backend does not report a planned latency: ready"
    )
