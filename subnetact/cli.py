"""What the ``subnetact`` console command runs once its arguments parsed (the parser is :mod:`subnetact_cli`, a
package that imports no torch, so ``--help`` is fast): ``demo`` and ``profile``.

``python -m subnetact ...`` is the same as ``subnetact ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ._imports import import_callable
from .errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m subnetact``: the console command (:func:`subnetact_cli.main`)."""
    from subnetact_cli import main as console

    return console(argv)


def _parser() -> argparse.ArgumentParser:
    from subnetact_cli import _parser as parser

    return parser()


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; errors a user can fix print one line and return 2."""
    try:
        if args.command == "demo":
            return _demo(args)
        return _profile(args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"subnetact {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(
        duration_s=args.duration,
        rate=args.rate,
        load=args.load,
        cv2=args.cv2,
        slo_ms=args.slo_ms,
        slo_factor=args.slo_factor,
        latency_stat=args.latency_stat,
        policies=args.policies.split(",") if args.policies else None,
        batch_sizes=args.batch_sizes,
        workers=args.workers,
        threads=args.threads,
        repeats=args.repeats,
        background_load=args.background_load,
        seed=args.seed,
        out_dir=args.out,
        plot=not args.no_plot,
        trials=args.trials,
    )
    return 0


def _profile(args: argparse.Namespace) -> int:
    import torch

    from . import digits
    from .io import load
    from .profiler import profile

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    accuracies = None
    if args.checkpoint == "digits":
        model, record = digits.load_supernet()
        example = digits.to_input(digits.test_split()[0][:1])
        accuracies = [r["accuracy"] for r in record["pareto"]]
    else:
        if not args.factory or not args.input_shape:
            raise ConfigError(
                f"checkpoint={args.checkpoint!r} needs --factory module:callable (the unconverted model) and "
                "--input-shape (one sample's shape, e.g. 3,224,224)"
            )
        model = load(args.checkpoint, import_callable(args.factory, "--factory")).eval()
        example = torch.randn(1, *args.input_shape)
    if args.accuracies is not None:
        data = json.loads(args.accuracies.read_text())
        accuracies = (
            {int(k) if str(k).isdigit() else k: v for k, v in data.items()} if isinstance(data, dict) else data
        )
    subnets = list(model.registered_subnets) or [model.active]
    model.to(args.device)
    prof = profile(
        model,
        subnets,
        args.batch_sizes,
        example_input=example,
        device=args.device,
        accuracies=accuracies,
        warmup=args.warmup,
        repeats=args.repeats,
        name=str(args.checkpoint),
    )
    prof.save(args.out)
    for s in prof.subnets:
        lat = ", ".join(f"b{b} {1e3 * st.mean_s:.2f}" for b, st in s.latency.items())
        print(f"subnet {s.id}: accuracy {s.accuracy:g}, mean latency ms: {lat}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
