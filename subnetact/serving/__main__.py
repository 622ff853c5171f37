"""Container entry point: serve a supernet over HTTP on one machine.

    python -m subnetact.serving --digits --port 8000                       # the shipped digits supernet
    python -m subnetact.serving --checkpoint model.safetensors --factory torchvision.models:resnet50 \\
        --profile profile.json --input-shape 3,224,224 --device cuda --port 8000

SIGTERM drains (see :func:`subnetact.serving.serve`). Across machines, use :mod:`subnetact.serving.ray_serve`.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from scheduling import policy_names

from .app import ServingApp
from .backend import LocalBackend
from .runner import ModelSpec
from .server import serve


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated ints, e.g. 3,224,224") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive ints")
    return shape


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default in ``--help``."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m subnetact.serving", description=__doc__, formatter_class=_HelpFormatter
    )
    model = p.add_argument_group("model")
    model.add_argument("--digits", action="store_true", help="serve the shipped digits supernet")
    model.add_argument("--checkpoint", help="a file written by subnetact.save")
    model.add_argument("--factory", help="module:callable building the architecture, e.g. torchvision.models:resnet50")
    model.add_argument("--profile", help="profile JSON (subnetact profile --out); measured at start with --digits")
    model.add_argument("--input-shape", type=_shape, help="one request's input shape, e.g. 3,224,224")
    model.add_argument("--postprocess", default="argmax", choices=["argmax", "logits"])
    model.add_argument("--device", default="cpu")
    model.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's; 1 with --digits)"
    )
    sched = p.add_argument_group("scheduling")
    sched.add_argument(
        "--policy",
        default="slackfit",
        help="a scheduling.make_policy name: " + ", ".join(policy_names()).replace("<arg>", "<subnet id>"),
    )
    sched.add_argument("--workers", type=int, default=1, help="worker threads, one batch at a time each")
    sched.add_argument("--max-queue", type=int, default=1000, help="beyond it: 429")
    sched.add_argument(
        "--latency-stat",
        default=None,
        choices=["mean", "p99"],
        help="what the policy plans with (default: the policy's own: p99 for slackfit, mean for the baselines; p99 "
        "with the latency model includes the live spread of batch times)",
    )
    sched.add_argument(
        "--static-profile",
        action="store_true",
        help="plan with the profile as given, never corrected from measured batch times (no latency model)",
    )
    http = p.add_argument_group("http")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, default=8000)
    http.add_argument("--default-deadline-ms", type=float, default=100.0)
    http.add_argument(
        "--max-body-bytes", type=int, default=None, help="default: the largest valid body for the input shape"
    )
    http.add_argument(
        "--decode-processes",
        type=int,
        default=2,
        help="child processes parsing JSON bodies over 64 KiB (0: a thread pool, which holds the server's GIL)",
    )
    http.add_argument("--body-timeout-s", type=float, default=5.0)
    http.add_argument("--header-timeout-s", type=float, default=10.0)
    http.add_argument("--keep-alive-s", type=int, default=5)
    http.add_argument("--drain-delay-s", type=float, default=0.0, help="after SIGTERM, keep serving this long")
    http.add_argument("--graceful-timeout-s", type=float, default=30.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()  # stderr: drain, stuck workers, disconnects (uvicorn logs its own)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("subnetact.serving", "scheduling"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    if args.digits:
        from .digits import digits_spec

        # One intra-op thread: the digits supernet is too small for more to pay, and on a busy 2-core machine two
        # threads that wait for each other made the start-up profile 30-380x too slow (issue 20).
        threads = 1 if args.threads is None else args.threads
        torch.set_num_threads(threads)
        if args.profile is None:
            logging.getLogger("subnetact.serving").info("profiling the digits supernet on this machine ...")
        spec = digits_spec(args.profile, threads=threads)
    else:
        missing = [f"--{n}" for n in ("checkpoint", "factory", "profile") if getattr(args, n) is None]
        if args.input_shape is None:
            missing.append("--input-shape")
        if missing:
            print(f"error: give --digits, or all of {', '.join(missing)}", file=sys.stderr)
            return 2
        spec = ModelSpec(
            args.checkpoint, args.factory, args.profile, args.input_shape, args.postprocess, args.device, args.threads
        )
    runner = spec.build()
    backend = LocalBackend(
        runner,
        runner.profile,
        policy=args.policy,
        workers=args.workers,
        max_queue=args.max_queue,
        latency_model=not args.static_profile,
        latency_stat=args.latency_stat,
    )
    app = ServingApp(
        backend,
        input_shape=spec.input_shape,
        default_deadline_ms=args.default_deadline_ms,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        decode_processes=args.decode_processes,
    )

    def ready(host: str, port: int) -> None:
        print(f"serving {len(runner.configs)} subnets ({args.policy}) on http://{host}:{port}", flush=True)

    serve(
        app,
        host=args.host,
        port=args.port,
        header_timeout_s=args.header_timeout_s,
        keep_alive_s=args.keep_alive_s,
        graceful_timeout_s=args.graceful_timeout_s,
        drain_delay_s=args.drain_delay_s,
        ready=ready,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
