"""The package's shape: its parts import each other without circles.

A *part* is a subpackage of ``evalsuite`` (``cli``, ``runs``, ``tasks``, ...) or a module at the package root. The
graph of imports between parts must have no cycle, so the parts stack into floors where each imports only from
the floors below it; within a part, modules must not import each other in a circle either.
"""

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "evalsuite"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (a ``from pkg import submodule`` names the submodule alone)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    stem = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(stem + ([node.module] if node.module else []))
                submodules = [f"{base}.{alias.name}" for alias in node.names]
                targets = submodules if all(s in modules for s in submodules) else [base]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def part_of(module: str) -> str:
    """``evalsuite.runs.store`` -> ``evalsuite.runs``; a root module is its own part."""
    return ".".join(module.split(".")[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_parts_import_each_other_without_circles():
    graph = import_graph()
    parts: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        parts[part_of(module)].update(part_of(t) for t in targets if part_of(t) != part_of(module))
    assert cycles(parts) == []


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# The floors of docs/architecture.md: a part imports only from its own floor and the floors below.
FLOORS = (
    ("errors", "registry", "resources", "tokenizers", "openai_client"),
    ("runs", "runtime", "kernels"),
    ("models", "cards", "data", "generation"),
    ("adapters", "metrics", "training"),
    ("tasks",),
    ("report", "bench", "serve"),
    ("papers",),
    ("cli", "lm_eval_main", "__main__"),
)


def test_parts_import_only_from_their_floor_and_below():
    floor_of = {f"evalsuite.{part}": level for level, parts in enumerate(FLOORS) for part in parts}
    floor_of["evalsuite"] = 0  # the package's __init__: its version
    graph = import_graph()
    assert set(floor_of) == {part_of(m) for m in graph}, "a part is missing from FLOORS (and docs/architecture.md)"
    upward = sorted(
        f"{m} -> {t}" for m, targets in graph.items() for t in targets if floor_of[part_of(t)] > floor_of[part_of(m)]
    )
    assert upward == []


def test_floors_match_the_architecture_page():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for level, parts in enumerate(FLOORS):
        row = next(line for line in page.splitlines() if line.startswith(f"| {level} |"))
        named = {name.strip().strip("`/") for name in row.split("|")[2].split(",")}
        assert named == set(parts), f"floor {level}: docs/architecture.md names {sorted(named)}"


def test_package_root_holds_few_modules():
    """The root keeps the package's small shared pieces; everything else lives in a part of its own."""
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_modules) <= 10, root_modules


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def test_modules_and_functions_stay_small():
    """No module over 450 lines; no function over 80, decorators counted, but for Triton kernels (``@triton.jit``),
    whose bodies are one program each."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(PACKAGE.parent)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any("jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                too_long.append(f"{where}:{start} {node.name}: {node.end_lineno - start + 1} lines")
    assert too_long == []
