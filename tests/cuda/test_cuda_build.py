"""The extension builds from setup.py and registers a CUDA kernel for every op (needs nvcc + a CUDA torch, no GPU).

This is how CI keeps a broken kernel from landing: whenever nvcc and a CUDA build of torch are present, this test
compiles ``subnetact_cuda._C`` through ``setup.py`` (SUBNETACT_BUILD_CUDA=1, the documented GPU build) and loads it
in a fresh interpreter, where registering a kernel whose C++ signature disagrees with the Python schema fails.
The build directory persists (``SUBNETACT_CUDA_BUILD_DIR``, default ``~/.cache/subnetact/cuda-build-test``), so
ninja recompiles only what changed: about 2 minutes on a 2-core machine the first time, seconds afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import subnetact_cuda
from subnetact_cuda import _build

ROOT = Path(__file__).resolve().parents[2]
_HOME = _build.cuda_home()
_CAN_BUILD = torch.version.cuda is not None and _HOME is not None


def _setup(args: list[str], mode: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "SUBNETACT_BUILD_CUDA": mode, **env}
    return subprocess.run(
        [sys.executable, "setup.py", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=1800
    )


def test_setup_rejects_unknown_mode():
    result = _setup(["--version"], "yes")
    assert result.returncode != 0
    assert "SUBNETACT_BUILD_CUDA='yes' must be auto, 0 or 1" in result.stderr


def test_setup_mode_0_builds_nothing():
    result = _setup(["--version"], "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0.1.0"


def test_extension_not_loaded_without_build_or_when_disabled(monkeypatch):
    monkeypatch.setenv(subnetact_cuda.DISABLE_ENV, "1")
    assert subnetact_cuda.disabled() and not subnetact_cuda.available()
    monkeypatch.setenv(subnetact_cuda.DISABLE_ENV, "0")
    assert not subnetact_cuda.disabled()


@pytest.mark.skipif(
    not _CAN_BUILD,
    reason=f"needs nvcc and a CUDA build of torch (torch.version.cuda={torch.version.cuda}, nvcc toolkit={_HOME})",
)
@pytest.mark.skipif(
    os.environ.get("SUBNETACT_SKIP_CUDA_BUILD_TEST", "0") not in ("", "0"),
    reason="SUBNETACT_SKIP_CUDA_BUILD_TEST is set",
)
def test_extension_builds_and_registers_cuda_kernels():
    build_dir = Path(os.environ.get("SUBNETACT_CUDA_BUILD_DIR", Path.home() / ".cache/subnetact/cuda-build-test"))
    lib, tmp = build_dir / "lib", build_dir / "tmp"
    result = _setup(
        ["-q", "build_ext", "--build-lib", str(lib), "--build-temp", str(tmp)],
        "1",
        CUDA_HOME=os.environ.get("CUDA_HOME", _HOME),
        TORCH_CUDA_ARCH_LIST=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"),
        MAX_JOBS=os.environ.get("MAX_JOBS", "2"),
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    (so,) = (lib / "subnetact_cuda").glob("_C*.so")

    check = (
        "import sys, torch, subnetact.ops, subnetact_cuda\n"
        "subnetact_cuda.load_library(sys.argv[1])\n"
        "for op in ('sliced_linear', 'sliced_conv2d'):\n"
        "    cuda = [l for l in torch._C._dispatch_dump('subnetact::' + op).splitlines() if l.startswith('CUDA:')]\n"
        "    assert cuda and 'sliced_linear.cpp' in cuda[0], (op, cuda)\n"
        "assert not torch.cuda.is_initialized()\n"
        # CPU tensors still run the reference kernels with the library loaded.
        "x, w = torch.randn(3, 4), torch.randn(6, 5)\n"
        "y = subnetact.ops.sliced_linear(x, w, out_features=5, activation='relu')\n"
        "torch.testing.assert_close(y, torch.relu(x @ w[:5, :4].T))\n"
        "print('ok')\n"
    )
    loaded = subprocess.run([sys.executable, "-c", check, str(so)], capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "ok", loaded.stderr[-4000:]
