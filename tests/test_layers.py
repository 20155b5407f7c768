"""The package's layers import downward only, and no module imports another that imports it back
(docs/design.md, "How the package is laid out"). Read from the source (every import, also inside functions):
no torch or Triton needed."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "portable_softmax"

# Lowest first. A module may import its own layer and those below it.
LAYERS = [
    ("records", {"record"}),
    ("device and backends", {"backend", "vendors", "device", "profiles", "amdgcn", "compat"}),
    ("planning", {"tuning", "planner", "plan_grid", "split_planner", "strided_planner", "loss_planner", "targets",
                  "kernel_resources"}),
    ("runtime", {"variants", "kernels", "interpreter", "launch_plan", "launch_compile", "launch", "loss_launch"}),
    ("public API and torch integration", {"ops", "op_arguments", "row_layout", "op_calls", "op_autograd", "torch_ops",
                                          "distributed", "distributed_loss", "distributed_dtensor", "distributed_head", "fused", "enable",
                                          "__init__", "loss", "loss_arguments", "loss_rows", "loss_reduction", "loss_ops", "nn", "head", "head_chunks",
                                          "head_ops"}),
    ("tools", {"cli", "__main__", "arguments", "bench", "bench_cases", "host_time", "validate", "selfcheck", "crosscompile",
               "machine_code", "bench_loss", "bench_head", "warmup"}),
]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "portable_softmax":
            parts = node.module.split(".")
            found |= {alias.name for alias in node.names} if len(parts) == 1 else {parts[1]}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("portable_softmax.")}
            found |= {"__init__" for a in node.names if a.name == "portable_softmax"}
    return found


def _sources() -> dict[str, list[Path]]:
    """Each module of the package and its files: a subpackage (``kernels/``) is one module."""
    found = {p.stem: [p] for p in PACKAGE.glob("*.py")}
    found.update({p.parent.name: sorted(p.parent.glob("*.py")) for p in PACKAGE.glob("*/__init__.py")})
    return found


def _modules() -> dict[str, set[str]]:
    sources = _sources()
    return {name: {m for p in paths for m in _imports(p) if m in sources and m != name}
            for name, paths in sources.items()}


def test_every_module_has_a_layer():
    placed = set().union(*(modules for _, modules in LAYERS))
    assert set(_modules()) == placed


def test_layers_import_downward_only():
    level = {module: i for i, (_, modules) in enumerate(LAYERS) for module in modules}
    upward = [(m, dep) for m, deps in _modules().items() for dep in deps if level[dep] > level[m]]
    # The package's __init__ re-exports the public API; importing a submodule runs it first, which
    # is Python's doing, not an import of the module's own.
    assert not upward, f"imports of a higher layer: {upward}"


def test_no_import_cycles():
    graph = _modules()
    seen: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        if seen.get(module) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(path + [module])}")
        if seen.get(module) == 2:
            return
        seen[module] = 1
        for dep in sorted(graph[module] - {"__init__"}):
            visit(dep, path + [module])
        seen[module] = 2

    for module in sorted(graph):
        visit(module, [])
