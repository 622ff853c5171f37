"""Open-loop load generator for the HTTP front end: a bursty trace of test-set digits over HTTP.

    python examples/http_server.py --port 8000 &
    python examples/load_generator.py --url http://127.0.0.1:8000 --rate 300 --duration 10 --deadline-ms 50

Requests are sent at the trace's arrival times (open loop: a slow server does not slow the sender down) from a pool
of threads using ``urllib``, each with its deadline budget. It prints the HTTP status counts, the fraction answered
on time, accuracy against the true labels of the on-time answers, latency percentiles and which subnets served them.
A request that gets no HTTP answer (the server is starting, draining or gone) is an outcome too, counted and
summarised with its reason; the summary is always printed.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from scheduling import traces
from subnetact import digits


@dataclass(frozen=True)
class Outcome:
    status: int
    latency_ms: float
    correct: bool | None  # None when there is no prediction
    subnet: object
    error: str | None = None  # why there was no HTTP answer (status NO_ANSWER)


#: The status of a request that got no HTTP answer (connection refused or reset while the server starts or
#: drains, a timeout): an outcome like any other, counted in the summary.
NO_ANSWER = 0


def post(url: str, body: dict, timeout: float) -> tuple[int, dict]:
    """POST JSON and return (status, parsed JSON answer); HTTP errors are answers too, and a request that got no
    answer is ``(NO_ANSWER, {"error": why})``."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, _json(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _json(exc.read())
    except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out (ConnectionError is an OSError)
        reason = getattr(exc, "reason", exc)
        return NO_ANSWER, {"error": f"{type(reason).__name__}: {reason}"}


def _json(data: bytes) -> dict:
    try:
        answer = json.loads(data or b"{}")
    except ValueError:  # a proxy's HTML error page, a truncated body
        return {}
    return answer if isinstance(answer, dict) else {}


def run(
    url: str, *, rate: float, duration_s: float, deadline_ms: float, cv2: float = 4.0, threads: int = 64, seed: int = 0
) -> list[Outcome]:
    """Replay a bursty trace against ``url`` (the server's base URL); one :class:`Outcome` per request."""
    images, labels = digits.test_split()
    inputs = digits.to_input(images).numpy()  # (N, 1, 8, 8) in [0, 1]: what the server's model takes
    arrivals = traces.bursty(rate / 2, rate / 2, cv2=cv2, duration_s=duration_s, seed=seed)
    rng = random.Random(seed)
    picks = [rng.randrange(len(labels)) for _ in arrivals]

    def one(i: int) -> Outcome:
        k = picks[i]
        start = time.monotonic()
        status, answer = post(
            url.rstrip("/") + "/predict",
            {"input": inputs[k].tolist(), "deadline_ms": deadline_ms},
            timeout=max(10.0, 20 * deadline_ms / 1e3),
        )
        latency = 1e3 * (time.monotonic() - start)
        prediction = answer.get("prediction")
        correct = None if prediction is None else prediction == int(labels[k])
        return Outcome(status, latency, correct, answer.get("subnet"), answer.get("error"))

    t0 = time.monotonic() + 0.05
    futures = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for i, t in enumerate(arrivals):
            delay = t0 + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(one, i))
        return [f.result() for f in futures]


def summarize(outcomes: list[Outcome]) -> str:
    if not outcomes:
        return "no requests sent"
    statuses = Counter(o.status for o in outcomes)
    on_time = [o for o in outcomes if o.status == 200]
    correct = sum(bool(o.correct) for o in on_time)
    lat = sorted(o.latency_ms for o in on_time)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q / 100 * len(lat)))] if lat else float("nan")

    subnets = Counter(o.subnet for o in on_time)
    unanswered = [o for o in outcomes if o.status == NO_ANSWER]
    errors = Counter(o.error for o in unanswered)
    return "\n".join(
        [
            f"requests: {len(outcomes)}; HTTP status: "
            f"{dict(sorted((s, n) for s, n in statuses.items() if s != NO_ANSWER))}; "
            f"no answer (server starting, draining or down): {len(unanswered)}"
            + (f" ({', '.join(f'{n}x {e}' for e, n in errors.most_common(3))})" if unanswered else ""),
            f"on time: {len(on_time) / len(outcomes):.4f}; accuracy of on-time answers: "
            + (f"{100 * correct / len(on_time):.2f}%" if on_time else "n/a"),
            f"client latency of on-time answers: p50 {pct(50):.1f} ms, p99 {pct(99):.1f} ms",
            f"subnets used: {dict(sorted(subnets.items(), key=lambda kv: str(kv[0])))}",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--rate", type=float, default=300.0, help="mean requests/s")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds")
    parser.add_argument("--deadline-ms", type=float, default=50.0)
    parser.add_argument("--cv2", type=float, default=4.0, help="burstiness")
    parser.add_argument("--threads", type=int, default=64, help="client threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    outcomes = run(
        args.url,
        rate=args.rate,
        duration_s=args.duration,
        deadline_ms=args.deadline_ms,
        cv2=args.cv2,
        threads=args.threads,
        seed=args.seed,
    )
    print(summarize(outcomes))


if __name__ == "__main__":
    main()
