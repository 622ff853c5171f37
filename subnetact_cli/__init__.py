"""The ``subnetact`` console command: ``subnetact demo``, ``subnetact profile`` and ``subnetact serve``.

    subnetact demo [--duration 3] [--trials 3] [--slo-ms ...] [--rate ...] [--out subnetact-demo]
    subnetact profile [CHECKPOINT --factory torchvision.models:resnet50 --input-shape 3,224,224] --out profile.json
    subnetact serve --digits --port 8000          # or --checkpoint/--factory/--profile/--input-shape: see --help

A package of its own, so that ``subnetact --help`` (and any argument error) answers without importing torch: the
commands import ``subnetact`` only once the arguments parsed. The working directory is on ``sys.path`` (as for
``python -m``), so ``--factory mymodule:build`` finds ``mymodule.py`` there. ``python -m subnetact ...`` is the same.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints, e.g. 1,4,16") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must list ints >= 1, e.g. 1,4,16")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="subnetact", description="Serve weight-shared supernets (SuperServe).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('subnetact')}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "serve",
        help="serve a supernet over HTTP on this machine (python -m subnetact.serving; subnetact serve --help)",
        add_help=False,
    )

    demo = sub.add_parser(
        "demo",
        help="serve the embedded digits supernet with SlackFit and the baselines on this machine",
        description="Profile the embedded digits supernet on this CPU, replay a bursty trace of test digits through "
        "the live scheduler with each policy, and print SLO attainment, accuracy against the labels, latency and "
        "throughput.",
    )
    demo.add_argument("--duration", type=float, default=3.0, help="seconds of each trial's trace (default 3)")
    demo.add_argument("--trials", type=int, default=3, help="traces replayed per policy, for error bars (default 3)")
    demo.add_argument("--rate", type=float, default=None, help="mean requests/s (default: from the profile)")
    demo.add_argument("--load", type=float, default=None, help="instead of --rate: x the top subnet's b16 throughput")
    demo.add_argument("--cv2", type=float, default=8.0, help="burstiness of the trace (default 8)")
    demo.add_argument("--slo-ms", type=float, default=None, help="SLO in ms (default: from the profile)")
    demo.add_argument("--slo-factor", type=float, default=None, help="instead of --slo-ms: x the top's b16 latency")
    demo.add_argument("--latency-stat", choices=("p99", "mean"), default="p99", help="latency policies plan with")
    demo.add_argument(
        "--policies",
        default=None,
        help="comma-separated scheduling.make_policy names (slackfit,slackfit-paper,maxacc,maxbatch,mincost, "
        "registered ones), fixed (every subnet) or fixed:<id> (default: slackfit,slackfit-paper,mincost,fixed)",
    )
    demo.add_argument("--batch-sizes", type=_ints, default=[1, 2, 4, 8, 16, 32], help="profiled batch sizes")
    demo.add_argument("--workers", type=int, default=1, help="inference worker threads (default 1)")
    demo.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    demo.add_argument("--repeats", type=int, default=15, help="timed forwards per profile entry (default 15)")
    demo.add_argument(
        "--background-load", type=int, default=0, help="busy processes to run during the policy runs (default 0)"
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", type=Path, default=Path("subnetact-demo"), help="output folder")
    demo.add_argument("--no-plot", action="store_true", help="do not write dynamics.png and frontier.png")

    prof = sub.add_parser(
        "profile",
        help="measure a supernet's registered subnets and write a scheduling profile (JSON)",
        description="Load a checkpoint written by subnetact.save (default: the embedded digits supernet), measure "
        "each registered subnet at each batch size and write the profile JSON that scheduling policies read.",
    )
    prof.add_argument("checkpoint", nargs="?", default="digits", help='a .safetensors file, or "digits" (default)')
    prof.add_argument(
        "--factory", help="module:callable building the unconverted model, e.g. torchvision.models:resnet50"
    )
    prof.add_argument("--input-shape", type=_ints, help="one sample's shape, e.g. 3,224,224 (random input)")
    prof.add_argument("--batch-sizes", type=_ints, default=[1, 2, 4, 8, 16, 32])
    prof.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    prof.add_argument("--accuracies", type=Path, help="JSON list (or {id: accuracy}) of the subnets' accuracies")
    prof.add_argument("--warmup", type=int, default=3)
    prof.add_argument("--repeats", type=int, default=20)
    prof.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    prof.add_argument("--out", type=Path, default=Path("profile.json"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # The console script's sys.path starts with its own bin folder, not the working directory (python -m puts the
    # latter first): without it, --factory mymodule:fn could not import a module next to the user.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    if argv[:1] == ["serve"]:
        from subnetact.serving.__main__ import main as serve

        return serve(argv[1:])
    args = _parser().parse_args(argv)
    from subnetact.cli import run  # torch and subnetact load here, after --help / argument errors

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
