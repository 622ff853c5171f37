"""Importing subnetact must stay light: no CUDA initialisation, no torchvision or transformers."""

from __future__ import annotations

import subprocess
import sys


def test_import_subnetact_is_lean():
    code = (
        "import sys, torch, subnetact\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised'\n"
        "heavy = [m for m in ('torchvision', 'transformers', 'ofa', 'scheduling') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_import_subnetact_serving_defers_the_web_and_ray_stacks():
    # The serving package imports starlette/uvicorn/prometheus_client when an app is built or served, and ray only in
    # subnetact.serving.ray_serve; `import subnetact` does not import subnetact.serving at all.
    code = (
        "import sys, subnetact\n"
        "assert 'subnetact.serving' not in sys.modules\n"
        "import subnetact.serving\n"
        "heavy = [m for m in ('starlette', 'uvicorn', 'prometheus_client', 'ray') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
