"""Serve the shipped digits supernet over HTTP with SlackFit: the production front end in a few lines.

    python examples/http_server.py --port 8000
    python examples/load_generator.py --url http://127.0.0.1:8000 --rate 300 --duration 10 --deadline-ms 50
    curl -s localhost:8000/predict -H 'Content-Type: application/json' \\
        -d '{"input": [0.1, 0.5, ... 64 values in [0, 1]], "deadline_ms": 50}'

The same server, with every option, is ``python -m subnetact.serving --digits``; for your own model pass
``--checkpoint/--factory/--profile/--input-shape`` (see docs/deployment.md).
"""

from __future__ import annotations

import argparse

import torch

from subnetact.serving import LocalBackend, ServingApp, serve
from subnetact.serving.digits import INPUT_SHAPE, digits_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--policy", default="slackfit", help="slackfit, maxacc, mincost or fixed:<id>")
    parser.add_argument("--workers", type=int, default=1, help="inference threads, one batch at a time each")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runner = digits_spec().build()  # loads the subnetact.save file and profiles the subnets on this machine
    backend = LocalBackend(runner, runner.profile, policy=args.policy, workers=args.workers)
    app = ServingApp(backend, input_shape=INPUT_SHAPE, default_deadline_ms=50.0)
    print(f"serving the digits supernet with {args.policy} on http://127.0.0.1:{args.port}", flush=True)
    serve(app, port=args.port)  # until Ctrl-C / SIGTERM, then drains


if __name__ == "__main__":
    main()
