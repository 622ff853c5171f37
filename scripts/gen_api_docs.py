"""Generate docs/api.md from the docstrings of the public API (``__all__`` of each documented module).

    python scripts/gen_api_docs.py            # rewrites docs/api.md

For every public name: its signature and the first paragraph of its docstring, and for classes their public methods
and properties. ``tests/e2e/test_e2e_api_docs.py`` checks the file lists every public name.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = [
    ("subnetact", "The core: convert, actuate, calibrate, export, save/load, profile."),
    ("subnetact.search", "Pareto search: FLOPs model, accuracy predictor, evolution."),
    ("subnetact.train", "Supernet training: distillation from the original model, schedules, torchrun, checkpoints."),
    ("subnetact.digits", "The embedded digits supernet used by `subnetact demo`."),
    ("subnetact.serving", "Serving over HTTP: the ASGI front end, its backend, the model runner (extra `serve`)."),
    (
        "subnetact_proxy",
        "What runs in Ray Serve's HTTP proxy: the X-Request-Start stamp, a dead router's requests sent again.",
    ),
    ("scheduling", "The scheduler: profiles, policies, live scheduler, simulator, traces, metrics."),
]


def _first_paragraph(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    para = doc.split("\n\n", 1)[0].strip()
    return " ".join(para.split())


def _annotation(annotation: object) -> str:
    """An annotation as written: strings unquoted, ``ForwardRef('int')`` (NamedTuple fields) as ``int``."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, typing.ForwardRef):
        return annotation.__forward_arg__
    return inspect.formatannotation(annotation)


def _default(value: object) -> str:
    """A default as a reader would write it: functions and classes by qualified name, not ``<function ... at 0x>``."""
    if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.isclass(value):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def _signature(obj: object) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    # Annotations are strings here (``from __future__ import annotations``): show them without quotes.
    params = []
    for p in sig.parameters.values():
        text = (
            p.name
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            else ("*" if p.kind == p.VAR_POSITIONAL else "**") + p.name
        )
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {_default(p.default)}"
        params.append(text)
    kw_only = [i for i, p in enumerate(sig.parameters.values()) if p.kind == p.KEYWORD_ONLY]
    if kw_only and not any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()):
        params.insert(kw_only[0], "*")
    ret = sig.return_annotation
    tail = "" if ret is sig.empty else f" -> {_annotation(ret)}"
    return f"({', '.join(params)}){tail}"


def _line(head: str, doc: str) -> str:
    return f"{head}: {doc}" if doc else head


def _public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", "") == module.__name__
        ]
    return sorted(names)


def render() -> str:
    out = [
        "# API reference",
        "",
        "Generated from the docstrings by `python scripts/gen_api_docs.py`; the docstrings have the details (argument",
        "meanings, shapes, errors, examples). Concepts: [concepts.md](concepts.md); how-to: [guide.md](guide.md),",
        "[serving.md](serving.md), [scheduling.md](scheduling.md).",
        "",
    ]
    for module_name, blurb in MODULES:
        module = importlib.import_module(module_name)
        out += [f"## `{module_name}`", "", blurb, ""]
        for name in _public_names(module):
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                out.append(_line(f"- **`{module_name}.{name}`** (module)", _first_paragraph(obj)))
                continue
            if name == "__version__":  # the installed distribution's, so not a constant worth printing
                out.append(
                    "- **`__version__`**: the installed version, read from the package metadata (`pyproject.toml`)"
                )
                continue
            if not (inspect.isclass(obj) or callable(obj)):
                out.append(f"- **`{name}`**: `{obj!r}`" if len(repr(obj)) < 60 else f"- **`{name}`**")
                continue
            kind = "class" if inspect.isclass(obj) else "function"
            sig = _signature(obj) if kind == "function" or not issubclass(obj, BaseException) else ""
            out.append(_line(f"- **`{name}{sig}`** ({kind})", _first_paragraph(obj)))
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for attr, value in sorted(vars(obj).items()):
                    if attr.startswith("_") or attr in ("forward", "extra_repr"):
                        continue
                    if isinstance(value, property):
                        out.append(_line(f"  - `.{attr}` (property)", _first_paragraph(value)))
                    elif inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod)):
                        fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                        out.append(_line(f"  - `.{attr}{_signature(fn)}`", _first_paragraph(fn)))
        out.append("")
    return "\n".join(out)


def main() -> None:
    path = ROOT / "docs" / "api.md"
    path.write_text(render())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
