"""Every example script runs end to end (fast settings), as a user would run it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# script, arguments, modules it needs
EXAMPLES = [
    ("resnet_actuate.py", ["--arch", "resnet18", "--image-size", "64", "--reps", "1"], ["torchvision"]),
    ("ofa_resnet50.py", [], ["ofa"]),
    ("bert_supernet.py", [], ["transformers"]),
]


@pytest.mark.parametrize(("script", "args", "needs"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_runs(script, args, needs):
    path = ROOT / "examples" / script
    if not path.exists():
        pytest.skip(f"{script} is not in the tree")
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{script} needs {module}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(path), *args], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "the example printed nothing"
