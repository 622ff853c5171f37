"""examples/load_generator.py against no server: connection errors are outcomes, and the summary still prints."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("example_load_generator", ROOT / "examples" / "load_generator.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_connection_errors_are_outcomes_and_the_summary_prints():
    # A port nobody listens on (bound, then closed): every request is refused, as while a server starts or drains
    # (issue 21: the generator crashed with a 60-line URLError traceback).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    load_generator = _load_generator()
    outcomes = load_generator.run(f"http://127.0.0.1:{port}", rate=40.0, duration_s=0.3, deadline_ms=100.0, threads=4)
    assert outcomes and all(o.status == load_generator.NO_ANSWER for o in outcomes)
    assert all("Connection" in o.error for o in outcomes)
    text = load_generator.summarize(outcomes)
    assert f"no answer (server starting, draining or down): {len(outcomes)}" in text
    assert "on time: 0.0000" in text
