"""SIGKILL of a Ray Serve router replica mid-burst (issue 22): what clients see, with 1 router replica and with 2.

    python benchmarks/serving/bench_router_kill.py --requests 600 --clients 16 --routers 1 2 --profile profile.json

Starts a local Ray cluster (``subnetact.serving.ray_local.local_ray``: ``ray.init(num_cpus=2)``, no dashboard)
whose HTTP proxy runs :class:`subnetact_proxy.ProxyEntry` (``--no-proxy-entry``: Ray's proxy alone), deploys the
digits supernet with ``build_app(num_workers=2, num_routers=R)`` for each ``R`` and sends a closed-loop burst of
``--requests`` JSON predictions from ``--clients`` threads through Ray's HTTP proxy. When ``--kill-at`` of them are
answered, one router replica's process gets SIGKILL. Each client sends each request once; with ``--client-retry``
it sends it again on a 500/502/503 or a dropped connection, with the remaining deadline (``--deadline-ms``).
Reported per configuration:

- final answers: 200 (checked against the same model in this process), 500, 503, 504, 0 (the connection dropped),
  and ``gave up`` (the client's budget ran out with no answer: an unanswered request);
- how many requests needed a client retry, and what their failed attempts got;
- the longest gap between consecutive answers during the burst (the outage a client sees);
- kill -> a replacement router serving, and whether it adopted the dead router's worker (no model load).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RETRY_STATUSES = (500, 502, 503)


def predict(served, x: list, budget_ms: float, retry: bool) -> dict:
    """POST /predict once, or (``retry``) until an answer not worth retrying or the budget is spent. Returns the
    final status (0: the connection dropped; ``"gave up"``: no attempt was answered in time), the body, and what each
    failed attempt got."""
    deadline = time.monotonic() + budget_ms / 1e3
    failed: list[str] = []
    final: dict = {"status": "gave up", "body": None}
    while (left_ms := 1e3 * (deadline - time.monotonic())) > 1.0:
        status, body, _ = served.predict(x, left_ms, timeout=left_ms / 1e3 + 2.0)
        if status == 0 and retry:  # the connection dropped or timed out: send it again
            failed.append(body["error"].split(":")[0])
            continue
        final = {"status": status, "body": body}
        if not retry or status not in RETRY_STATUSES:
            break
        failed.append(str(status))
        time.sleep(0.02)
    return {**final, "failed": failed, "t": time.monotonic()}


def run_one(num_routers: int, spec, reference, inputs, args) -> dict:
    from subnetact.serving.ray_local import serve_app
    from subnetact.serving.ray_serve import build_app

    served = serve_app(
        build_app(
            spec,
            num_workers=2,
            num_routers=num_routers,
            worker_options={"num_cpus": 0.5},
            app_options={"default_deadline_ms": args.deadline_ms},
            lease_s=args.lease_s,
        )
    )
    routers = served.router_stats(num_routers, 60)
    victim_pid, victim = next(iter(routers.items()))
    n = args.requests
    answered = threading.Semaphore(0)
    killed_at: list[float] = []

    def one(k: int) -> dict:
        out = predict(served, inputs[k % len(inputs)], args.deadline_ms, args.client_retry)
        answered.release()
        return out

    def killer():
        for _ in range(int(args.kill_at * n)):
            answered.acquire()
        os.kill(victim_pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    threading.Thread(target=killer, daemon=True).start()
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.clients) as pool:
        results = list(pool.map(one, range(n)))
    t_end = time.monotonic()
    wrong = 0
    for k, r in enumerate(results):
        if r["status"] == 200:
            body = r["body"]
            x = np.asarray(inputs[k % len(inputs)], dtype=np.float32)
            wrong += body["prediction"] != reference(body["subnet"], [x])[0]["prediction"]
    times = [t0, *sorted(r["t"] for r in results)]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    kill = killed_at[0] if killed_at else float("nan")
    after_kill = [r["t"] - kill for r in results if r["t"] > kill]

    # Time until a replacement router answers (and whether it adopted the dead router's worker).
    replacement, t_replaced = None, float("nan")
    known = {st["router_id"] for st in routers.values()}
    give_up = time.monotonic() + 120
    while replacement is None and time.monotonic() < give_up:
        for st in served.router_stats(num_routers, 5).values():
            if st["router_id"] not in known:
                replacement, t_replaced = st, time.monotonic() - kill
        time.sleep(0.1)
    served.shutdown()
    statuses = collections.Counter(r["status"] for r in results)
    return {
        "routers": num_routers,
        "requests": n,
        "final": dict(sorted(statuses.items(), key=str)),
        "wrong_predictions": wrong,
        "client_retried": sum(bool(r["failed"]) for r in results),
        "failed_attempts": dict(collections.Counter(f for r in results for f in r["failed"])),
        "longest_gap_s": round(max(gaps), 3),
        "burst_s": round(t_end - t0, 2),
        "last_answer_after_kill_s": round(max(after_kill), 2) if after_kill else None,
        "median_answer_after_kill_s": round(statistics.median(after_kill), 3) if after_kill else None,
        "replacement_after_s": round(t_replaced, 1),
        "replacement_adopted": None if replacement is None else replacement["adopted"],
        "replacement_started": None if replacement is None else replacement["started"],
        "victim_workers": victim["workers"],
        "replacement_workers": None if replacement is None else replacement["workers"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--routers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=1, help="repeat each configuration (interleaved)")
    p.add_argument("--kill-at", type=float, default=0.25, help="fraction of the burst answered before the kill")
    p.add_argument("--deadline-ms", type=float, default=20000.0, help="each request's budget, retries included")
    p.add_argument("--lease-s", type=float, default=3.0)
    p.add_argument("--profile", help="reuse a profile JSON instead of measuring one")
    p.add_argument("--client-retry", action="store_true", help="clients send a request again on 500/502/503")
    p.add_argument("--no-proxy-entry", action="store_true", help="Ray's proxy without subnetact_proxy.ProxyEntry")
    args = p.parse_args()

    import torch

    from subnetact import digits
    from subnetact.serving.digits import digits_spec, measure_digits_profile
    from subnetact.serving.ray_local import local_ray

    torch.set_num_threads(1)
    if args.profile is None:
        args.profile = str(Path(tempfile.mkdtemp(prefix="bench_router_kill_")) / "profile.json")
        measure_digits_profile().save(args.profile)
    spec = digits_spec(args.profile, threads=1)
    reference = spec.build()
    inputs = digits.to_input(digits.test_split()[0][:200]).numpy().tolist()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    print(f"proxy entry: {not args.no_proxy_entry}, client retry: {args.client_retry}", flush=True)
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    with local_ray(num_cpus=2, proxy_entry=not args.no_proxy_entry):
        for _ in range(args.rounds):
            for r in args.routers:
                print(json.dumps(run_one(r, spec, reference, inputs, args)), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
