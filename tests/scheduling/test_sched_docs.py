"""The docstring examples of `scheduling` and the code blocks of docs/scheduling.md must run."""

import doctest
import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"
MODULES = [
    "batcher",
    "decode",
    "dispatch",
    "edf",
    "gearplan",
    "latency_model",
    "policies",
    "profile",
    "scheduler",
    "simulator",
    "slackfit",
    "traces",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(f"scheduling.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_guide_code_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 5
    for i, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name}[block {i}]", "exec"), {"__name__": f"docblock{i}"})
    assert "missed:" in capsys.readouterr().out
