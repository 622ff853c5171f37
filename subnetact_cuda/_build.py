"""Build configuration of ``subnetact_cuda._C``, shared by ``setup.py`` and the build test.

Kept free of torch imports at module level: ``setup.py`` loads this file by path before deciding whether torch is
there at all. See ``docs/cuda.md``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("csrc/sliced_linear.cpp", "csrc/sliced_conv2d.cu")

#: Architectures built when TORCH_CUDA_ARCH_LIST is unset and no GPU is visible: A100 and H100/H200, plus PTX
#: that newer GPUs JIT-compile.
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"


def sources(relative_to: Path | None = None) -> list[str]:
    """Source files; relative to ``relative_to`` (setuptools wants paths relative to setup.py) or absolute."""
    paths = [HERE / s for s in SOURCES]
    if relative_to is not None:
        return [os.path.relpath(p, relative_to) for p in paths]
    return [str(p) for p in paths]


def nvcc_toolkit_root() -> str | None:
    """The CUDA toolkit ``nvcc`` on PATH belongs to, asked from nvcc itself.

    ``nvcc`` may be a wrapper script (``/usr/local/bin/nvcc`` here), so neither its path nor torch's guess gives
    the toolkit; ``nvcc --dryrun`` prints ``TOP=<toolkit>/bin/..``.
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", os.devnull], capture_output=True, text=True, timeout=60
        ).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"^#\$ TOP=(.+?)\s*$", out, re.MULTILINE)
    return str(Path(match.group(1)).resolve()) if match else None


def cuda_home() -> str | None:
    """``CUDA_HOME`` / ``CUDA_PATH`` if set, else the toolkit of the ``nvcc`` on PATH."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and Path(value, "bin", "nvcc").exists():
            return value
    return nvcc_toolkit_root()


def _cublas_location(home: str | None) -> tuple[list[str], list[str], list[str]]:
    """(include dirs, library dirs, linker flags) for cuBLASLt.

    PyTorch's CUDA headers include cuBLAS / cuSPARSE / cuSOLVER headers. A full toolkit has them; a minimal one
    (only nvcc and cudart, as on these build machines) does not, but the NVIDIA wheels PyTorch depends on ship
    both the headers and ``libcublasLt.so.<major>``, the very library PyTorch loads at run time.
    """
    if home and Path(home, "include", "cublasLt.h").exists():
        return [], [], ["-lcublasLt"]
    for site in sys.path:
        for header in sorted(glob.glob(os.path.join(site, "nvidia", "*", "include", "cublasLt.h"))):
            root = Path(header).parent.parent
            libs = sorted(root.glob("lib/libcublasLt.so*"))
            if libs:
                return [str(root / "include")], [str(root / "lib")], [f"-l:{libs[0].name}"]
    raise RuntimeError(
        f"cannot find cuBLASLt headers: neither CUDA_HOME={home!r} nor an nvidia-* wheel on sys.path has "
        "include/cublasLt.h; install the CUDA toolkit's cuBLAS or PyTorch's CUDA wheels"
    )


def compile_args(home: str | None) -> dict:
    """Keyword arguments for ``CUDAExtension`` (and, reshaped, ``torch.utils.cpp_extension.load``)."""
    include_dirs, library_dirs, link_flags = _cublas_location(home)
    return {
        "include_dirs": include_dirs,
        "library_dirs": library_dirs,
        "extra_link_args": link_flags,
        "extra_compile_args": {
            "cxx": ["-O3"],
            # -lineinfo: profiles (nsight compute) map back to source lines at no runtime cost.
            "nvcc": ["-O3", "-lineinfo", "--expt-relaxed-constexpr"],
        },
    }
