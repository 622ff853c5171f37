"""A probe client's latency while other clients flood the front end with ~1 MiB JSON bodies (issue 22, finding 1).

    python benchmarks/serving/bench_flood.py --probes 200 --flood-threads 3
    python benchmarks/serving/bench_flood.py --server-args="--max-body-bytes 2097152"   # bodies parsed, not 413
    python benchmarks/serving/bench_flood.py --pythonpath /tmp/old                      # another checkout, same run

Starts ``python -m subnetact.serving --digits`` (one worker thread, torch threads 1; the profile measured once and
reused), then alternates idle and flood phases: in each, one probe client sends ``--probes`` sequential digit
predictions on a keep-alive connection; in flood phases ``--flood-threads`` threads meanwhile post ~1 MiB JSON
bodies (an input of the wrong shape: 400 if parsed, 413 if refused by size) as fast as they are answered. Prints the
probe's p50/p90 in each phase (the flood runs in its own process), the ratio of flood to idle p50, and the status
counts of the flood's answers. Interleaving the phases (``--rounds``) makes the ratio robust to a machine whose
load changes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(pythonpath: str, profile: str, port: int, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "subnetact.serving", "--digits", "--profile", profile, "--port", str(port)]
    cmd += ["--threads", "1", "--default-deadline-ms", "2000", *extra]
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    # cwd too: `-m` puts the working directory first on sys.path.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=pythonpath)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc


def _probe(port: int, n: int, body: bytes) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        times.append(1e3 * (time.perf_counter() - t))
        assert resp.status == 200, resp.status
    conn.close()
    return times


def _flood_thread(port: int, body: bytes, stop, statuses: Counter) -> None:
    while not stop.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            statuses[resp.status] += 1
        except OSError:  # a 413 closes the connection while the body is still being sent
            statuses["closed while sending"] += 1
        finally:
            conn.close()


def _flood(port: int, body: bytes, threads: int, stop, out) -> None:
    """A process of flood threads (its own GIL: the flood does not slow the probe client down)."""
    statuses: Counter = Counter()
    pool = [threading.Thread(target=_flood_thread, args=(port, body, stop, statuses)) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(dict(statuses))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", type=int, default=200, help="probe requests per phase")
    p.add_argument("--rounds", type=int, default=3, help="idle/flood phase pairs, interleaved")
    p.add_argument("--flood-threads", type=int, default=3)
    p.add_argument("--flood-bytes", type=int, default=1_000_000, help="size of each flood body (just under 1 MiB)")
    p.add_argument("--server-args", default="", help="extra arguments of python -m subnetact.serving")
    p.add_argument("--pythonpath", default=str(ROOT), help="the checkout to serve (default: this one)")
    p.add_argument("--profile", help="reuse a profile JSON instead of measuring one")
    args = p.parse_args()

    from subnetact import digits

    profile = args.profile
    if profile is None:
        from subnetact.serving.digits import measure_digits_profile

        profile = os.path.join(tempfile.mkdtemp(), "profile.json")
        measure_digits_profile().save(profile)
    x = digits.to_input(digits.test_split()[0][:1])[0].numpy()
    probe_body = json.dumps({"input": x.tolist()}).encode()
    values = ", ".join(["0.123456789"] * (args.flood_bytes // 13))
    flood_body = ('{"input": [' + values + "]}").encode()

    port = _free_port()
    proc = _start(args.pythonpath, profile, port, shlex.split(args.server_args))
    try:
        _probe(port, 20, probe_body)  # warm-up
        idle, flood, statuses = [], [], Counter()
        for _ in range(args.rounds):
            idle += _probe(port, args.probes, probe_body)
            stop, out = multiprocessing.Event(), multiprocessing.Queue()
            flooder = multiprocessing.Process(target=_flood, args=(port, flood_body, args.flood_threads, stop, out))
            flooder.start()
            time.sleep(0.5)  # the flood is under way
            flood += _probe(port, args.probes, probe_body)
            stop.set()
            statuses.update(out.get(timeout=120))
            flooder.join(60)
    finally:
        proc.terminate()
        proc.wait(30)

    def q(xs, pct):
        return sorted(xs)[min(len(xs) - 1, int(pct / 100 * len(xs)))]

    p50_idle, p50_flood = statistics.median(idle), statistics.median(flood)
    print(f"checkout {args.pythonpath}; server args {args.server_args!r}; flood body {len(flood_body):,} bytes")
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"probe idle : p50 {p50_idle:.2f} ms  p90 {q(idle, 90):.2f} ms  ({len(idle)} requests)")
    print(f"probe flood: p50 {p50_flood:.2f} ms  p90 {q(flood, 90):.2f} ms  ({len(flood)} requests)")
    print(f"flood/idle p50 ratio: {p50_flood / p50_idle:.2f}")
    print(f"flood answers: {dict(statuses)}")


if __name__ == "__main__":
    main()
