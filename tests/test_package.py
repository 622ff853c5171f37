"""Release hygiene: one version, the CLI's --version and help, the license, and docs that link to each other."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import subnetact
from subnetact import cli, demo

ROOT = Path(__file__).resolve().parents[1]
DECLARED_VERSION = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)


def _installed_version() -> str | None:
    try:
        return importlib.metadata.version("subnetact")
    except importlib.metadata.PackageNotFoundError:
        return None


def test_version_comes_from_the_package_metadata():
    installed = _installed_version()
    if installed is None:  # a source tree on PYTHONPATH, never installed
        assert subnetact.__version__ == "0+unknown"
    else:
        assert subnetact.__version__ == installed == DECLARED_VERSION
    # Written once, in pyproject.toml: no version literal in the package.
    assert not re.search(r"""__version__\s*=\s*["']""", (ROOT / "subnetact" / "__init__.py").read_text())


def test_cli_version_prints_the_version_and_exits_0():
    result = subprocess.run(
        [sys.executable, "-m", "subnetact", "--version"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"subnetact {subnetact.__version__}"


def test_demo_help_states_the_real_default_policies():
    demo_parser = next(
        a for a in cli._parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith(" demo")
    )
    (action,) = [a for a in demo_parser._actions if a.dest == "policies"]
    stated = re.search(r"\(default: ([a-z:,-]+)\)", action.help).group(1).split(",")
    assert demo._policy_names(stated, 3) == demo._policy_names(None, 3)


def test_license_file_matches_the_metadata():
    assert re.search(r'^license = "Apache-2.0"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text


def test_changelog_has_this_release():
    assert f"## [{DECLARED_VERSION.split('.dev')[0]}]" in (ROOT / "CHANGELOG.md").read_text()


_LINK = re.compile(r"\]\(([^)#\s]+\.md)(#[^)]*)?\)")


def _links(page: Path) -> set[Path]:
    return {(page.parent / m.group(1)).resolve() for m in _LINK.finditer(page.read_text()) if "://" not in m.group(1)}


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
)
def test_relative_links_resolve(page):
    broken = sorted(str(p) for p in _links(ROOT / page) if not p.exists())
    assert not broken, f"{page} links to missing files: {broken}"


def test_every_doc_page_is_reachable_from_the_readme():
    seen, todo = set(), [(ROOT / "README.md").resolve()]
    while todo:
        page = todo.pop()
        if page in seen or not page.exists():
            continue
        seen.add(page)
        todo += _links(page)
    unreachable = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in seen)
    assert not unreachable, f"docs not linked from the README (directly or through other docs): {unreachable}"


def test_console_help_answers_without_importing_torch():
    # subnetact --help must be fast (issue 21: it took ~9 s importing torch): the parser lives in subnetact_cli.
    code = (
        "import sys, subnetact_cli\n"
        "try:\n    subnetact_cli.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'torch' not in sys.modules and 'subnetact' not in sys.modules, sorted(sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout and "profile" in result.stdout


def test_console_script_sees_the_working_directory_for_factory(tmp_path):
    # A console script's sys.path starts with its bin folder, not the working directory: --factory mymod:build
    # failed with "No module named 'mymod'" (issue 21). Simulated with a script outside the working directory.
    (tmp_path / "bin").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "bin" / "subnetact").write_text("import sys, subnetact_cli\nsys.exit(subnetact_cli.main())\n")
    (tmp_path / "work" / "mymod.py").write_text("def build():\n    raise SystemExit('mymod imported')\n")
    result = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "bin" / "subnetact"),
            "profile",
            "missing.safetensors",
            "--factory",
            "mymod:build",
            "--input-shape",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path / "work",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "No module named" not in result.stderr, result.stderr
    assert "missing.safetensors" in result.stderr, result.stderr


def test_serve_subcommand_shows_the_servers_options_with_defaults():
    result = subprocess.run(
        [sys.executable, "-m", "subnetact", "serve", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert "--checkpoint" in result.stdout and "keep serving this long (default: 0.0)" in result.stdout
