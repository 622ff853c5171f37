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


def toolkit_version(home: str | None) -> tuple[int, int] | None:
    """(major, minor) of the CUDA toolkit at ``home``, read from its ``cuda_runtime_api.h`` (``CUDART_VERSION``).

    The header, not ``nvcc --version``: the headers are what must agree with the compiler and with torch's build.
    """
    if home is None:
        return None
    header = Path(home, "include", "cuda_runtime_api.h")
    try:
        match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text(errors="replace"))
    except OSError:
        return None
    if match is None:
        return None
    value = int(match.group(1))  # e.g. 13000 for 13.0, 12080 for 12.8
    return value // 1000, (value % 1000) // 10


def parse_version(text: str | None) -> tuple[int, int] | None:
    """``"13.2"`` -> ``(13, 2)``; None for None or anything unparsable."""
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def incompatibility(torch_cuda: str | None, home: str | None) -> str | None:
    """Why the extension cannot be built consistently with this torch and toolkit, or None if it can.

    A kernel library must be compiled by a toolkit of the same CUDA major version as torch's build: CUDA keeps
    binary compatibility within a major version (an extension built with 13.0 runs with torch's 13.2 runtime), not
    across. Within a major version the toolkit's own headers are used (see :func:`library_headers`), so an older
    minor toolkit builds fine.
    """
    torch_version = parse_version(torch_cuda)
    toolkit = toolkit_version(home)
    if torch_version is None:
        return f"torch is a CPU build (torch.version.cuda={torch_cuda!r})"
    if toolkit is None:
        return f"no CUDA toolkit found (nvcc toolkit={home!r}) for torch's CUDA {torch_cuda}"
    if toolkit[0] != torch_version[0]:
        return (
            f"CUDA toolkit {toolkit[0]}.{toolkit[1]} (nvcc at {home}) does not match torch's CUDA {torch_cuda}: "
            "the major versions differ; install a toolkit of the same major version or a matching torch"
        )
    return None


def library_headers(home: str | None, scratch: Path) -> list[str]:
    """Include dirs for the CUDA *library* headers (cuBLAS, cuSPARSE, cuSOLVER...) the toolkit at ``home`` lacks.

    PyTorch's CUDA headers include cuBLAS / cuSPARSE / cuSOLVER headers. A full toolkit has them; a minimal one
    (only nvcc and cudart, as on these build machines) does not, but the NVIDIA wheels PyTorch depends on ship them.
    Those wheels also ship a whole CUDA runtime and CCCL of *torch's* CUDA version (``nvidia/cu13/include``):
    putting that directory on the include path mixes, say, nvcc 13.0 with CCCL 13.3 headers, and CCCL stops with
    ``#error "CUDA compiler and CUDA toolkit headers are incompatible"``. So the toolkit's own headers always win:
    ``scratch`` gets links to the wheel headers the toolkit does not have, and only ``scratch`` is added.
    """
    toolkit_include = Path(home, "include") if home else None
    if toolkit_include is not None and (toolkit_include / "cublasLt.h").exists():
        return []
    wheel_includes = sorted(
        {
            Path(h).parent
            for site in sys.path
            for h in glob.glob(os.path.join(site, "nvidia", "*", "include", "cublasLt.h"))
        }
    )
    if not wheel_includes:
        raise RuntimeError(
            f"cannot find cuBLASLt headers: neither CUDA_HOME={home!r} nor an nvidia-* wheel on sys.path has "
            "include/cublasLt.h; install the CUDA toolkit's cuBLAS or PyTorch's CUDA wheels"
        )
    scratch.mkdir(parents=True, exist_ok=True)
    for stale in scratch.iterdir():
        stale.unlink()
    for header in sorted(wheel_includes[0].glob("*.h")):
        if toolkit_include is None or not (toolkit_include / header.name).exists():
            (scratch / header.name).symlink_to(header)
    return [str(scratch)]


def _cublas_library() -> tuple[list[str], list[str]]:
    """(library dirs, linker flags) for cuBLASLt: the toolkit's, else the very library PyTorch loads at run time."""
    for site in sys.path:
        for lib_dir in sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib"))):
            libs = sorted(Path(lib_dir).glob("libcublasLt.so*"))
            if libs:
                return [lib_dir], [f"-l:{libs[0].name}"]
    return [], ["-lcublasLt"]


def compile_args(home: str | None, scratch: Path) -> dict:
    """Keyword arguments for ``CUDAExtension`` (and, reshaped, ``torch.utils.cpp_extension.load``).

    ``scratch``: a directory this build may own, for the library-header links of :func:`library_headers`.
    """
    include_dirs = library_headers(home, scratch)
    if home and Path(home, "include", "cublasLt.h").exists():
        library_dirs, link_flags = [], ["-lcublasLt"]
    else:
        library_dirs, link_flags = _cublas_library()
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
