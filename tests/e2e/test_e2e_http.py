"""examples/http_server.py on loopback, driven by a real HTTP client (urllib): answers, errors, late and rejected
requests, metrics, and every request answered exactly once."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from subnetact import digits

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


http_server = _load("http_server")
load_generator = _load("load_generator")


def _request(url: str, body: object | None = None, *, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class _Served:
    def __init__(self, app):
        self.app = app
        self.server = http_server.make_server(app, "127.0.0.1", 0)
        host, port = self.server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.app.close()


@pytest.fixture(scope="module")
def profile():
    app = http_server.digits_app(batch_sizes=(1, 4, 16), repeats=3)
    app.close()
    return app.profile


@pytest.fixture
def served(profile):
    model, _ = digits.load_supernet()
    s = _Served(http_server.App(profile, model, slo_ms=2000.0))
    yield s
    s.close()


def test_predict_answers_with_prediction_subnet_and_timing(served):
    images, labels = digits.test_split()
    status, answer = _request(served.url + "/predict", {"image": images[0].tolist()})  # 8 rows of 8
    assert status == 200, answer
    assert set(answer) == {"prediction", "subnet", "subnet_accuracy", "batch_size", "latency_ms", "on_time"}
    assert answer["on_time"] is True and 0 < answer["latency_ms"] < 2000
    assert answer["subnet"] in served.app.configs
    with torch.no_grad():  # the answer is what that subnet predicts
        expected = served.app.model(digits.to_input(images[:1]), subnet=served.app.configs[answer["subnet"]])
    assert answer["prediction"] == int(expected.argmax(1))
    assert answer["subnet_accuracy"] == served.app.profile.subnet(answer["subnet"]).accuracy
    status, flat = _request(served.url + "/predict", {"image": images[0].reshape(-1).tolist(), "deadline_ms": 1500})
    assert status == 200 and flat["prediction"] == answer["prediction"]


def test_concurrent_requests_are_batched_and_mostly_correct(served):
    images, labels = digits.test_split()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda k: _request(served.url + "/predict", {"image": images[k].tolist()}), range(48)))
    assert all(s == 200 for s, _ in answers)
    correct = sum(a["prediction"] == int(labels[k]) for k, (_, a) in enumerate(answers))
    assert correct >= 44  # every served subnet is >= 90% accurate on the test split
    assert max(a["batch_size"] for _, a in answers) > 1


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ([1, 2], "must be a JSON object"),
        ({}, "missing field 'image'"),
        ({"image": [0] * 63}, r"must be 64 numbers in 0\.\.16"),
        ({"image": [17] * 64}, r"must be 64 numbers in 0\.\.16"),
        ({"image": [0] * 64, "deadline_ms": -5}, r"deadline_ms=-5 must be a number of milliseconds > 0"),
        ({"image": [0] * 64, "slo": 5}, r"unknown field\(s\) \['slo'\]"),
    ],
)
def test_bad_requests_get_400_naming_the_problem(served, body, match):
    status, answer = _request(served.url + "/predict", body)
    assert status == 400
    assert re.search(match, answer["error"]), answer


def test_not_json_and_unknown_endpoints(served):
    assert _request(served.url + "/predict", raw=b"{nope")[0] == 400
    assert _request(served.url + "/nothing", {"image": [0] * 64})[0] == 404
    assert _request(served.url + "/healthz") == (200, {"ok": True})


def test_impossible_deadline_is_answered_504_and_counted(served):
    status, answer = _request(served.url + "/predict", {"image": [0] * 64, "deadline_ms": 0.001})
    assert status == 504 and answer["error"] == "deadline missed"
    status, metrics = _request(served.url + "/metrics")
    assert status == 200
    assert metrics["dropped"] >= 1 and metrics["http_status"]["504"] >= 1


def test_full_queue_is_answered_429_and_every_request_once(profile):
    model, _ = digits.load_supernet()
    release = threading.Event()
    started = threading.Event()

    class Blocking(http_server.App):
        def infer(self, subnet_id, images):
            started.set()
            release.wait(30)  # hold the only worker so that the queue fills up
            return super().infer(subnet_id, images)

    s = _Served(Blocking(profile, model, slo_ms=20000.0, max_queue=2))
    try:
        with ThreadPoolExecutor(8) as pool:
            first = pool.submit(_request, s.url + "/predict", {"image": [0] * 64})
            assert started.wait(30)  # the only worker now holds the first request
            rest = [pool.submit(_request, s.url + "/predict", {"image": [0] * 64}) for _ in range(6)]
            # two fit in the queue; the other four are answered 429 at once, while the worker is still blocked
            t0 = time.monotonic()
            while sum(f.done() for f in rest) < 4 and time.monotonic() - t0 < 30:
                time.sleep(0.01)
            answered_while_blocked = sum(f.done() for f in rest)
            release.set()
            results = [first.result(timeout=30)] + [f.result(timeout=30) for f in rest]
        assert answered_while_blocked == 4
        statuses = sorted(st for st, _ in results)
        assert statuses.count(429) == 4 and statuses.count(200) == 3, statuses
        m = s.app.metrics()
        assert m["rejected"] == 4 and m["on_time"] == 3 and sum(m["http_status"].values()) == 7
    finally:
        release.set()
        s.close()


def test_no_worker_is_answered_503(profile):
    model, _ = digits.load_supernet()
    s = _Served(http_server.App(profile, model, slo_ms=1000.0))
    try:
        for wid in s.app.scheduler.workers:
            s.app.scheduler.remove_worker(wid)
        status, answer = _request(s.url + "/predict", {"image": [0] * 64})
        assert status == 503 and answer["error"] == "no inference worker"
    finally:
        s.close()


def test_load_generator_against_the_server(served):
    outcomes = load_generator.run(served.url, rate=80.0, duration_s=0.6, deadline_ms=2000.0, threads=8, seed=1)
    assert outcomes and all(o.status == 200 for o in outcomes)
    assert sum(o.correct for o in outcomes) >= 0.9 * len(outcomes)
    text = load_generator.summarize(outcomes)
    assert "on time: 1.0000" in text and "HTTP status: {200:" in text


def test_unknown_policy_is_refused(profile):
    model, _ = digits.load_supernet()
    with pytest.raises(
        ValueError, match=r"policy='fastest' is not one of \['slackfit', 'maxacc', 'mincost', 'fixed:0'"
    ):
        http_server.App(profile, model, policy="fastest")
