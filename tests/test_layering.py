"""The package's structure (issue 23): no import cycle inside ``subnetact``, and no module of it importing another
module's underscore names. Read from the source with ``ast`` (nothing is imported), counting lazy imports inside
functions too: a cycle that only a lazy import closes is still a cycle of ideas."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "subnetact"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name of a ``from ... import`` in ``module`` (a file at ``path``)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """``module -> subnetact modules it imports`` and the underscore names imported across modules."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    private: list[str] = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(module, path, node)
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.append((submodule, None) if submodule in modules else (source, alias.name))
            for target, name in targets:
                if target not in modules or target == module:
                    continue
                if not target.startswith("subnetact"):
                    continue
                graph[module].add(target)
                if name is not None and name.startswith("_") and not name.startswith("__"):
                    private.append(f"{module} imports {target}.{name}")
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's __init__ importing its own submodules (and they it, for shared names) is how a package is built;
    # only edges between modules count, with ``pkg/__init__`` standing for nothing but itself.
    return {
        m: {t for t in targets if not (m.startswith(t + ".") or t.startswith(m + "."))} for m, targets in graph.items()
    }


def test_the_checker_finds_a_cycle_and_a_private_import():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    node = ast.parse("from ..state import _x, y").body[0]
    assert _resolve("subnetact.hf.adapter", ROOT / "hf" / "adapter.py", node) == "subnetact.state"


def test_no_import_cycle_inside_subnetact():
    graph, _ = _imports(_modules())
    assert _cycles(_package_edges(graph)) == []


def test_no_module_imports_another_modules_underscore_names():
    _, private = _imports(_modules())
    assert private == []


# The layers of docs/design.md's diagram, top to bottom (keep the two in step): a module may import modules of its own
# layer or below only. A module not named here sits with its package.
LAYERS = [
    "__main__ cli serving.__main__ serving.ray_serve",
    "demo digits demo_load zoo zoo._superserve_data serving serving.app serving.server serving.backend serving.runner "
    "serving.codec serving.metrics serving.digits",
    "search search.run search.evolution search.cost search.accuracy search.pareto profiler train calibrate importance "
    "cuda_graphs",
    "io",
    "builtins",
    "hf hf.adapter hf.families hf.verify hf.reorder hf.unregistered ofa ofa.resnet ofa.mbv3 ofa.proxyless ofa.mbconv "
    "ofa.config ofa.checkpoint ofa._common rules.timm_vit rules.torchvision_resnet",
    "extend",
    "convert graph trace rules verify examples",
    "plan",
    "supernet export",
    "weight_slice subnet_norm slimmable_norm layer_select attention mha head_count",
    "state weight_cache operator space",
    "handlers config tree checks ops errors _registry _progress _imports data",
]


def test_every_import_points_down_the_documented_layers():
    graph, _ = _imports(_modules())
    graph = _package_edges(graph)
    height = {f"subnetact.{m}": len(LAYERS) - i for i, layer in enumerate(LAYERS) for m in layer.split()}
    height["subnetact"] = len(LAYERS) + 1  # the package's __init__ imports everything

    def layer(module: str) -> int:
        # A module the table does not name sits with its package (a new subnetact/hf/x.py is interop).
        name = module
        while name not in height:
            if "." not in name:
                raise AssertionError(f"{module} has no place in docs/design.md's layer diagram (LAYERS here)")
            name = name.rpartition(".")[0]
        return height[name]

    upward = [f"{m} -> {t}" for m, targets in graph.items() for t in targets if layer(t) > layer(m)]
    assert upward == []
