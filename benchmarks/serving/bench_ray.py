"""The Ray Serve deployment under ``hey`` and a bursty open-loop trace: router + 1 or 2 workers vs ``@serve.batch``.

    python benchmarks/serving/bench_ray.py --duration 10 --rate 150 --deadline-ms 50

Starts a local Ray cluster (``ray.init(num_cpus=2)``, no dashboard), then for each configuration deploys the digits
supernet through Ray's HTTP proxy and measures:

1. **Hop cost**: ``hey -c 1`` (one request at a time, nothing queued) against the deployment and against the
   single-process front end (``python -m subnetact.serving --digits``, same profile and policy); the difference of
   the p50s is what the extra hops (proxy -> ingress -> router -> worker actor and back) cost per request.
2. **Constant load**: ``hey -c 20`` at ``--rate`` requests/s: client p50/p99, throughput and attainment next to the
   ingress' own p50/p99 (``GET /stats``).
3. **Bursty load**: ``examples/load_generator.py``'s open-loop bursty trace (cv² = 4) at ``--rate``: SLO attainment
   and the mean profiled accuracy of the subnets that answered on time.

Configurations: ``router-1`` / ``router-2`` (SlackFit in one router replica, 1 or 2 workers), ``routers2-2`` (two
router replicas with one worker each, ``build_app``'s default since issue 22) and ``serve.batch`` (Ray's own
``@serve.batch`` on one replica running the smallest subnet: the Clipper+ baseline on the same engine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_http import run_hey  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location("load_generator", ROOT / "examples" / "load_generator.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats") as resp:
        return json.loads(resp.read())["latency"]


def _bursty(url: str, profile, args) -> dict:
    gen = _load_generator()
    outcomes = gen.run(url, rate=args.rate, duration_s=args.duration, deadline_ms=args.deadline_ms, threads=64)
    on_time = [o for o in outcomes if o.status == 200]
    accs = [profile.subnet(o.subnet).accuracy for o in on_time]
    return {
        "requests": len(outcomes),
        "attainment": len(on_time) / len(outcomes),
        "mean_accuracy": statistics.fmean(accs) if accs else float("nan"),
    }


def _measure(name: str, url: str, body: str, profile, args) -> dict:
    data = Path(body).read_bytes()
    for _ in range(20):  # warm up every hop; the first answers may well be late (504)
        request = urllib.request.Request(url + "/predict", data, {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request).read()
        except urllib.error.HTTPError as exc:
            exc.read()
    seq = run_hey(
        url + "/predict", body, requests=args.sequential, clients=1, rate=50, keepalive=True, deadline_ms=1e9
    )
    n = int(args.rate * args.duration)
    load = run_hey(
        url + "/predict", body, requests=n, clients=20, rate=args.rate, keepalive=True, deadline_ms=args.deadline_ms
    )
    server = _stats(url)
    bursty = _bursty(url, profile, args)
    row = {"name": name, "seq_p50_ms": seq["client_p50_ms"], **{f"load_{k}": v for k, v in load.items()}}
    row.update({"server_p50_ms": server["p50_ms"], "server_p99_ms": server["p99_ms"]})
    row.update({f"bursty_{k}": v for k, v in bursty.items()})
    print(
        f"{name:12s} seq p50 {row['seq_p50_ms']:6.2f} ms | hey -c 20: client p50 {load['client_p50_ms']:6.2f} "
        f"p99 {load['client_p99_ms']:7.2f}, server p50 {server['p50_ms']:6.2f} p99 {server['p99_ms']:7.2f}, "
        f"{load['throughput_rps']:6.1f} req/s, attainment {load['attainment']:.4f} "
        f"(client {load['client_attainment']:.4f}), "
        f"errors {load['errors']} | "
        f"bursty: attainment {bursty['attainment']:.4f}, accuracy {bursty['mean_accuracy']:.2f} %",
        flush=True,
    )
    print(f"    {load['command']}")
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=150.0, help="requests/s of the constant and the bursty load")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of each load")
    p.add_argument("--deadline-ms", type=float, default=50.0)
    p.add_argument("--sequential", type=int, default=300, help="requests of the hey -c 1 hop-cost run")
    p.add_argument("--profile", help="reuse a profile JSON instead of measuring one")
    p.add_argument("--configs", nargs="+", default=["local", "router-1", "router-2", "serve.batch"])
    args = p.parse_args()

    import ray
    from ray import serve

    from scheduling import Profile
    from subnetact import digits
    from subnetact.serving.digits import digits_spec, measure_digits_profile
    from subnetact.serving.ray_serve import build_app, serve_batch_app

    tmp = Path(tempfile.mkdtemp(prefix="bench_ray_"))
    if args.profile is None:
        args.profile = str(tmp / "profile.json")
        measure_digits_profile().save(args.profile)
    profile = Profile.load(args.profile)
    spec = digits_spec(args.profile, threads=1)
    body = str(tmp / "body.json")
    Path(body).write_text(json.dumps({"input": digits.to_input(digits.test_split()[0][:1])[0].tolist()}))
    app_options = {"default_deadline_ms": args.deadline_ms}
    print(f"load average before: {os.getloadavg()[0]:.2f}; rate {args.rate:g}/s, deadline {args.deadline_ms:g} ms")

    rows = []
    if "local" in args.configs:
        port = _free_port()
        cmd = [sys.executable, "-m", "subnetact.serving", "--digits", "--profile", args.profile, "--port", str(port)]
        cmd += ["--threads", "1", "--default-deadline-ms", f"{args.deadline_ms:g}"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert "serving" in proc.stdout.readline()
            rows.append(_measure("local", f"http://127.0.0.1:{port}", body, profile, args))
        finally:
            proc.terminate()
            proc.wait(30)

    os.environ.setdefault("PYTHONPATH", str(ROOT))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        url = f"http://127.0.0.1:{port}"
        for name in [c for c in args.configs if c != "local"]:
            if name.startswith(("router-", "routers2-")):  # one router replica (as measured before) or two
                n = int(name.split("-")[1])
                routers = 2 if name.startswith("routers2-") else 1
                app = build_app(
                    spec, num_workers=n, num_routers=routers, worker_options={"num_cpus": 0.5}, app_options=app_options
                )
            elif name == "serve.batch":
                app = serve_batch_app(spec, policy="fixed:0", default_deadline_ms=args.deadline_ms)
            else:
                raise SystemExit(f"unknown config {name!r}")
            t0 = time.monotonic()
            serve.run(app, name=name, route_prefix="/")
            print(f"{name}: deployed in {time.monotonic() - t0:.1f} s", flush=True)
            rows.append(_measure(name, url, body, profile, args))
            serve.delete(name)
    finally:
        serve.shutdown()
        ray.shutdown()
    local = next((r for r in rows if r["name"] == "local"), None)
    if local is not None:
        for r in rows:
            if r["name"] != "local":
                print(
                    f"hop cost {r['name']}: {r['seq_p50_ms'] - local['seq_p50_ms']:+.2f} ms p50 vs the local front end"
                )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
