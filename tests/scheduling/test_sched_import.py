"""`scheduling` must stay importable without torch or subnetact (issue 3: embeddable in any serving stack)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_does_not_pull_torch_or_subnetact():
    code = (
        "import sys, scheduling, scheduling.datasets, scheduling.traces\n"
        "banned = {'torch', 'subnetact', 'subnetact_cuda', 'numpy'}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in banned)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import scheduling pulled in: {out.stdout.strip()}"


def test_public_names_are_exported():
    import scheduling

    assert len(set(scheduling.__all__)) == len(scheduling.__all__)
    for name in scheduling.__all__:
        assert hasattr(scheduling, name), name
