"""Does the HTTP server recover from a start-up profile measured on a busy machine? (issue 20, deliverable 3)

    python benchmarks/serving/bench_fail_closed.py                       # the server's defaults
    python benchmarks/serving/bench_fail_closed.py --server-args="--threads 2"                    # torch's default
    python benchmarks/serving/bench_fail_closed.py --slow-profile 100                 # a profile 100x too slow
    python benchmarks/serving/bench_fail_closed.py --slow-profile 100 --server-args=--static-profile  # as before
    python benchmarks/serving/bench_fail_closed.py --background 2 --json /tmp/bfc.json   # contention in the window
    python benchmarks/serving/bench_fail_closed.py --keep-alive          # keep-alive client connections

1. Start one busy process (``yes > /dev/null``) per core, then ``python -m subnetact.serving --digits``: it measures
   its start-up profile while every core is busy.
2. Stop the load ``--load-s`` (10) seconds after the server was started, or once it listens if that is later (so the
   whole profile is measured under load).
3. From then on send ``--rate`` (200) requests/s, each with the server's default 100 ms deadline budget, for
   ``--window-s`` (15) seconds, and poll ``/readyz``.

``--slow-profile F`` reproduces the issue's start-up profile (108-1188 ms per batch where the machine does 1-30 ms)
without waiting for it: the digits profile is measured here first (before the load, one thread) and every latency
multiplied by ``F``; the server gets it as ``--profile``. (With two torch threads, the server measuring its own
profile under this load did not finish within 5 minutes, load average 12-15.)

Prints the fraction of the requests sent in the window that were answered on time (HTTP 200 and a client-side
latency within the budget: the target is >= 0.95), the same per second, when ``/readyz`` first said 200 and the
server's plan log lines, then one line per second of the window: what happened to the requests sent in it (on
time, dropped, answered late, on time at the server but late at the client), client and server latencies, and the
server's state meanwhile, sampled every 0.1 s: the CPU share it got (``server_cpu``, cores), readiness, queue
length, and its ``/stats`` plan (fastest planned latency, the latency model's worker factor and tail, the measured
arrival rate, probes). ``--json PATH`` also saves every request's outcome. The busy processes die with this script
(``PR_SET_PDEATHSIG``) and are killed on exit.

``--background N`` keeps N more busy processes running through the traffic window: the condition the target
excludes (the load ends), which on a shared machine other jobs can bring back at any time; it shows what such
contention costs each policy (``--server-args="--policy fixed:0"`` for the cheapest static choice).
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:
    # Linux: the child gets SIGKILL when this script dies, however it dies (a busy loop must never outlive a run).
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def start_load(n: int) -> list[subprocess.Popen]:
    """``n`` busy processes, each ``yes > /dev/null``."""
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _post(url: str, body: bytes, timeout: float) -> tuple[str, dict]:
    """The outcome (the status, and for a 504 whether the request was dropped or answered late) and the JSON body."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return str(r.status), json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read() or b"{}")
        if exc.code == 504:
            return ("504 late" if answer.get("on_time") is False else "504 dropped"), answer
        return str(exc.code), answer
    except OSError:
        return "no answer", {}


_local = threading.local()


def _post_keep_alive(port: int, body: bytes, timeout: float) -> tuple[str, dict]:
    """:func:`_post` on this thread's own keep-alive connection (opened on first use, reopened after an error)."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read() or b"{}")
    except (OSError, http.client.HTTPException):
        conn.close()
        _local.conn = None
        return "no answer", {}
    if resp.will_close:
        conn.close()
        _local.conn = None
    if resp.status == 504:
        return ("504 late" if answer.get("on_time") is False else "504 dropped"), answer
    return str(resp.status), answer


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc``; nan when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def slow_profile(factor: float, path: Path) -> Path:
    """The digits profile measured now, with every latency ``factor`` x slower, saved to ``path``."""
    import torch

    from scheduling import LatencyStats, Profile, Subnet
    from subnetact.serving.digits import measure_digits_profile

    torch.set_num_threads(1)
    measured = measure_digits_profile()
    subnets = tuple(
        Subnet(
            s.id,
            s.accuracy,
            {b: LatencyStats(st.mean_s * factor, st.p99_s * factor) for b, st in s.latency.items()},
            s.config,
        )
        for s in measured.subnets
    )
    Profile(subnets, name=f"digits x{factor:g}", metadata=measured.metadata).save(path)
    return path


def run(args: argparse.Namespace) -> dict:
    cores = os.cpu_count() or 1
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(args.log)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "subnetact.serving", "--digits", "--port", str(port), *shlex.split(args.server_args)]
    if args.slow_profile is not None:
        cmd += ["--profile", str(slow_profile(args.slow_profile, Path(args.log).with_suffix(".profile.json")))]
    load = start_load(cores)
    background: list[subprocess.Popen] = []
    server = None
    try:
        t_start = time.monotonic()
        with log_path.open("w") as log:
            server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
        listening = None
        while listening is None:
            if server.poll() is not None:
                raise SystemExit(f"the server exited with {server.returncode}; see {log_path}")
            if _get(base + "/healthz", timeout=1.0) == 200:
                listening = time.monotonic() - t_start
            else:
                time.sleep(0.1)
            if time.monotonic() - t_start > args.start_timeout_s:
                raise SystemExit(f"the server did not listen within {args.start_timeout_s} s; see {log_path}")
        time.sleep(max(0.0, t_start + args.load_s - time.monotonic()))
        stop(load)
        t_end = time.monotonic()
        load_for = t_end - t_start

        background = start_load(args.background)  # other jobs on the machine, through the window
        ready_at: list[float] = []
        samples: list[dict] = []  # every 0.1 s: readiness, the server's /stats, its CPU time, the load average

        def poll_ready() -> None:
            while time.monotonic() - t_end < args.window_s:
                t = time.monotonic() - t_end
                ready = _get(base + "/readyz") == 200
                if ready and not ready_at:
                    ready_at.append(t)
                try:
                    with urllib.request.urlopen(base + "/stats", timeout=2.0) as r:
                        stats = json.loads(r.read())
                except (OSError, ValueError):
                    stats = {}
                samples.append(
                    {"t": t, "ready": ready, "cpu_s": _cpu_s(server.pid), "load1": os.getloadavg()[0], **stats}
                )
                time.sleep(0.1)

        poller = threading.Thread(target=poll_ready, daemon=True)
        poller.start()
        body = json.dumps({"input": [0.5] * 64}).encode()
        budget_s = args.deadline_ms / 1e3
        n = int(args.rate * args.window_s)
        outcomes: list[tuple[float, str, float, dict]] = [(0.0, "not sent", 0.0, {})] * n

        def one(i: int, due: float) -> None:
            sent = time.monotonic()
            if args.keep_alive:
                status, answer = _post_keep_alive(port, body, timeout=5.0)
            else:
                status, answer = _post(base + "/predict", body, timeout=5.0)
            outcomes[i] = (due - t_end, status, time.monotonic() - sent, answer)

        with ThreadPoolExecutor(args.threads) as pool:
            for i in range(n):
                due = t_end + i / args.rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                pool.submit(one, i, due)
        poller.join()
    finally:
        stop(load)
        stop(background)
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    on_time = [s == "200" and lat <= budget_s for _, s, lat, _ in outcomes]
    per_second = []
    timeline = []
    for k in range(int(args.window_s)):
        sel = [(o, ok) for o, ok in zip(outcomes, on_time, strict=True) if k <= o[0] < k + 1]
        per_second.append(round(sum(ok for _, ok in sel) / max(len(sel), 1), 3))
        timeline.append(_second(k, sel, [x for x in samples if k <= x["t"] < k + 1], budget_s))
    recovered = next((k for k, f in enumerate(per_second) if f >= 0.95), None)
    statuses: dict[str, int] = {}
    for _, s, _, _ in outcomes:
        statuses[s] = statuses.get(s, 0) + 1
    plan_lines = [line.rstrip() for line in log_path.read_text().splitlines() if "plan:" in line]
    return {
        "server": " ".join(cmd[1:]),
        "cores_loaded": cores,
        "listening_after_s": round(listening, 2),
        "load_stopped_after_s": round(load_for, 2),
        "requests": n,
        "on_time_fraction": round(sum(on_time) / n, 4),
        "per_second": per_second,
        "first_second_at_0.95": recovered,
        "ready_after_load_s": round(ready_at[0], 2) if ready_at else None,
        "statuses": statuses,
        "plan_log": plan_lines,
        "loadavg_at_end": os.getloadavg(),
        "background_processes": args.background,
        "client": "keep-alive connections" if args.keep_alive else "a new connection per request",
        "timeline": timeline,
        # Every request: [when it was due (s after the load ended), outcome, client ms, server ms, batch, subnet].
        "request_log": [
            [round(t, 4), s, round(1e3 * lat, 2), a.get("latency_ms"), a.get("batch_size"), a.get("subnet")]
            for t, s, lat, a in outcomes
        ],
    }


def _second(k: int, sent: list, samples: list[dict], budget_s: float) -> dict:
    """One second of the window: what happened to the requests sent in it, and the server's state meanwhile."""
    client = sorted(lat for (_, _, lat, _), _ in sent)
    served = [a for (_, s, _, a), _ in sent if "latency_ms" in a]
    plans = [x.get("plan", {}) for x in samples if x.get("plan")]
    cpu = [x["cpu_s"] for x in samples]
    row = {
        "s": k,
        "sent": len(sent),
        "on_time": sum(ok for _, ok in sent),
        "dropped": sum(s == "504 dropped" for (_, s, _, _), _ in sent),
        "late": sum(s == "504 late" for (_, s, _, _), _ in sent),
        "late_at_client": sum(s == "200" and lat > budget_s for (_, s, lat, _), _ in sent),
        "client_p50_ms": round(1e3 * client[len(client) // 2], 1) if client else None,
        "client_max_ms": round(1e3 * client[-1], 1) if client else None,
        "server_max_ms": max((a["latency_ms"] for a in served), default=None),
        "batch_max": max((a.get("batch_size", 0) for a in served), default=None),
        "server_cpu": round((cpu[-1] - cpu[0]) / (samples[-1]["t"] - samples[0]["t"]), 2) if len(cpu) > 1 else None,
        "ready": sum(x["ready"] for x in samples) / max(len(samples), 1),
        "queue_max": max((x.get("queue_len", 0) for x in samples), default=None),
        "load1": round(samples[-1]["load1"], 1) if samples else None,
    }
    if plans:
        fastest = [p["fastest_planned_ms"] for p in plans if p.get("fastest_planned_ms") is not None]
        row["fastest_planned_ms"] = [min(fastest), max(fastest)] if fastest else None
        factors = [max(p["worker_factors"].values()) for p in plans if p.get("worker_factors")]
        row["worker_factor_max"] = round(max(factors), 2) if factors else None
        row["tail_max"] = max((p.get("tail", 1.0) for p in plans), default=None)
        row["arrival_rate_max"] = max((p.get("arrival_rate", 0.0) for p in plans), default=None)
        row["probes"] = plans[-1].get("probes")
        row["batches_timed"] = plans[-1].get("batches_timed")
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-args", default="", help="extra arguments of python -m subnetact.serving --digits")
    p.add_argument("--slow-profile", type=float, default=None, help="serve with the profile this many times too slow")
    p.add_argument("--load-s", type=float, default=10.0, help="seconds of load from the server's start")
    p.add_argument("--window-s", type=float, default=15.0, help="seconds of traffic after the load ends")
    p.add_argument("--rate", type=float, default=200.0, help="requests per second")
    p.add_argument("--deadline-ms", type=float, default=100.0, help="the server's default budget (for the check)")
    p.add_argument("--threads", type=int, default=32, help="client threads")
    p.add_argument("--start-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--background",
        type=int,
        default=0,
        help="busy processes running through the traffic window (other jobs on the machine; the target has none)",
    )
    p.add_argument(
        "--keep-alive",
        action="store_true",
        help="one keep-alive connection per client thread, as a load balancer keeps (default: a new one per request)",
    )
    p.add_argument("--json", default=None, help="also write the result, with the per-second timeline, here")
    p.add_argument("--log", default="/tmp/bench_fail_closed_server.log", help="the server's output")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    timeline = result.pop("timeline")
    result.pop("request_log")
    print(json.dumps(result, indent=1))
    print("per second of the window (requests sent in it; the server's state meanwhile):")
    for row in timeline:
        print("  " + json.dumps(row))


if __name__ == "__main__":
    main()
