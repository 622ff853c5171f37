"""The extension builds from setup.py and registers a CUDA kernel for every op (needs nvcc + a CUDA torch, no GPU).

This is how CI keeps a broken kernel from landing: whenever nvcc and a CUDA build of torch are present, this test
compiles ``subnetact_cuda._C`` through ``setup.py`` (SUBNETACT_BUILD_CUDA=1, the documented GPU build) and loads it
in a fresh interpreter, where registering a kernel whose C++ signature disagrees with the Python schema fails.
The build directory persists (``SUBNETACT_CUDA_BUILD_DIR``, default ``~/.cache/subnetact/cuda-build-test``), so
ninja recompiles only what changed: about 2 minutes on a 2-core machine the first time, seconds afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import subnetact_cuda
from subnetact_cuda import _build

ROOT = Path(__file__).resolve().parents[2]
_HOME = _build.cuda_home()
#: Why this machine cannot build the kernels (None: it can, so the build test must run and pass).
_CANNOT_BUILD = _build.incompatibility(torch.version.cuda, _HOME)


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
    declared = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert result.stdout.strip().splitlines()[-1] == declared


@pytest.mark.skipif(_CANNOT_BUILD is None, reason="this machine can build the kernels")
def test_setup_auto_skips_with_one_warning_and_mode_1_fails_with_the_reason():
    auto = _setup(["--version"], "auto")
    assert auto.returncode == 0, auto.stderr
    warnings = [line for line in auto.stderr.splitlines() if "not building the CUDA kernels" in line]
    assert warnings == [f"WARNING: subnetact: not building the CUDA kernels: {_CANNOT_BUILD}"]
    forced = _setup(["--version"], "1")
    assert forced.returncode != 0
    assert f"SUBNETACT_BUILD_CUDA=1 but the CUDA kernels cannot be built: {_CANNOT_BUILD}" in forced.stderr


def _fake_toolkit(root: Path, cudart_version: int, headers: tuple[str, ...] = ()) -> str:
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION  {cudart_version}\n")
    for name in headers:
        (root / "include" / name).write_text("// toolkit's own\n")
    return str(root)


def test_incompatibility_by_major_version(tmp_path):
    home = _fake_toolkit(tmp_path / "cuda", 13000)
    assert _build.toolkit_version(home) == (13, 0)
    assert _build.incompatibility("13.2", home) is None  # same major: toolkit headers, minor-version compatible
    assert _build.incompatibility("13.0", home) is None
    message = _build.incompatibility("12.8", home)
    assert "CUDA toolkit 13.0" in message and "torch's CUDA 12.8" in message
    assert "CPU build" in _build.incompatibility(None, home)
    assert "no CUDA toolkit found" in _build.incompatibility("13.2", None)
    assert "no CUDA toolkit found" in _build.incompatibility("13.2", str(tmp_path / "missing"))


def test_library_headers_never_shadow_the_toolkit(tmp_path, monkeypatch):
    """Only headers the toolkit lacks come from torch's CUDA wheel; its runtime/CCCL headers never do."""
    home = _fake_toolkit(tmp_path / "cuda", 13000, headers=("cuda_runtime.h", "cuda_fp16.h"))
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "include"
    wheel.mkdir(parents=True)
    for name in ("cuda_runtime.h", "cuda_fp16.h", "cuda_runtime_api.h", "cublasLt.h", "cublas_v2.h", "cusparse.h"):
        (wheel / name).write_text("// wheel's\n")
    (wheel / "cccl").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    scratch = tmp_path / "scratch"
    (dirs,) = _build.library_headers(home, scratch)
    assert Path(dirs) == scratch
    assert sorted(p.name for p in scratch.iterdir()) == ["cublasLt.h", "cublas_v2.h", "cusparse.h"]
    assert (scratch / "cublasLt.h").resolve() == (wheel / "cublasLt.h").resolve()
    # A toolkit with cuBLAS needs nothing from the wheel.
    full = _fake_toolkit(tmp_path / "full", 13000, headers=("cublasLt.h",))
    assert _build.library_headers(full, tmp_path / "scratch2") == []


def test_extension_not_loaded_without_build_or_when_disabled(monkeypatch):
    monkeypatch.setenv(subnetact_cuda.DISABLE_ENV, "1")
    assert subnetact_cuda.disabled() and not subnetact_cuda.available()
    monkeypatch.setenv(subnetact_cuda.DISABLE_ENV, "0")
    assert not subnetact_cuda.disabled()


@pytest.mark.skipif(_CANNOT_BUILD is not None, reason=f"CUDA kernels not compiled: {_CANNOT_BUILD}")
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
