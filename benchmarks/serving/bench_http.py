"""The HTTP front end under a load tool nobody here wrote (``hey``, Debian package): client vs server latency.

    python benchmarks/serving/bench_http.py --clients 20 64 --rate 300 --requests 3000 --deadline-ms 50

For each client count it starts ``python -m subnetact.serving --digits`` (one worker thread, torch threads 1, the
profile measured once and reused), runs ``hey -n REQUESTS -c CLIENTS -q RATE/CLIENTS`` with keep-alive (and, with
``--no-keepalive``, also without), and prints hey's client-side p50/p99 and throughput next to the server's own
p50/p99 over the same answers (``GET /stats``: from the moment the request's headers were parsed to its answer), and
the SLO attainment as the server sees it (200s / requests) and as the client does (200 and the round trip within
the deadline). Errors are requests hey sent that got no HTTP answer (refused or reset).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(profile: str, port: int, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "subnetact.serving", "--digits", "--profile", profile, "--port", str(port)]
    cmd += ["--threads", "1", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def run_hey(
    url: str, body: str, *, requests: int, clients: int, rate: float, keepalive: bool, deadline_ms: float
) -> dict:
    cmd = ["hey", "-n", str(requests), "-c", str(clients), "-q", f"{rate / clients:g}", "-m", "POST"]
    cmd += ["-T", "application/json", "-D", body, "-o", "csv", "-t", "10"]
    if not keepalive:
        cmd.append("-disable-keepalive")
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    sent = (requests // clients) * clients  # hey gives each client requests // clients
    times = [1e3 * float(r["response-time"]) for r in rows]
    statuses = Counter(int(r["status-code"]) for r in rows)
    span = max(float(r["offset"]) + float(r["response-time"]) for r in rows) if rows else float("nan")
    return {
        "command": " ".join([*cmd, url]),
        "answered": len(rows),
        "errors": sent - len(rows),
        "statuses": dict(sorted(statuses.items())),
        "client_p50_ms": _pct(times, 50),
        "client_p99_ms": _pct(times, 99),
        "throughput_rps": len(rows) / span,
        "attainment": statuses.get(200, 0) / sent,  # answered 200: on time by the server's clock
        # on time by the client's clock: 200 and the whole round trip within the deadline
        "client_attainment": sum(int(r["status-code"]) == 200 and t <= deadline_ms for r, t in zip(rows, times))
        / sent,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[20, 64])
    p.add_argument("--rate", type=float, default=300.0, help="total requests/s (spread over the clients)")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--deadline-ms", type=float, default=50.0)
    p.add_argument("--no-keepalive", action="store_true", help="also run without keep-alive")
    p.add_argument("--profile", help="reuse a profile JSON instead of measuring one")
    p.add_argument(
        "--server-args",
        default="",
        help="more options of python -m subnetact.serving, e.g. '--policy fixed:3 --static-profile': the same "
        "batches whatever the policy's defaults (to compare front ends across versions)",
    )
    args = p.parse_args()
    if shutil.which("hey") is None:
        sys.exit("hey is not installed: apt-get install -y hey")
    sys.path.insert(0, str(ROOT))
    from subnetact import digits

    tmp = Path(tempfile.mkdtemp(prefix="bench_http_"))
    if args.profile is None:
        from subnetact.serving.digits import measure_digits_profile

        args.profile = str(tmp / "profile.json")
        measure_digits_profile().save(args.profile)
    body = tmp / "body.json"
    body.write_text(json.dumps({"input": digits.to_input(digits.test_split()[0][:1])[0].tolist()}))
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.requests} requests at {args.rate:g}/s")
    print(
        "clients keepalive | client p50 p99 ms | server p50 p99 ms | p50 gap ms | req/s | attained server client "
        "| errors"
    )
    for clients in args.clients:
        for keepalive in [True, False] if args.no_keepalive else [True]:
            port = _free_port()
            proc = _start(
                args.profile, port, ["--default-deadline-ms", f"{args.deadline_ms:g}", *shlex.split(args.server_args)]
            )
            try:
                r = run_hey(
                    f"http://127.0.0.1:{port}/predict",
                    str(body),
                    requests=args.requests,
                    clients=clients,
                    rate=args.rate,
                    keepalive=keepalive,
                    deadline_ms=args.deadline_ms,
                )
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats") as resp:
                    server = json.loads(resp.read())["latency"]
            finally:
                proc.terminate()
                proc.wait(30)
            gap = r["client_p50_ms"] - server["p50_ms"]
            print(
                f"{clients:7d} {str(keepalive):9s} | {r['client_p50_ms']:6.2f} {r['client_p99_ms']:6.2f} | "
                f"{server['p50_ms']:6.2f} {server['p99_ms']:6.2f} | {gap:+6.2f} | {r['throughput_rps']:6.1f} | "
                f"{r['attainment']:.4f} {r['client_attainment']:.4f} | {r['errors']}  statuses {r['statuses']}",
                flush=True,
            )
            print(f"    {r['command']}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
