"""No import circles among qdc's modules: each layer imports only the layers below it.

The graph is read from the source (the AST of every module of the package), imports inside
functions included: a circle closed by a lazy import is still a circle, one that only moved
from import time to call time. Relative imports are resolved, and `from pkg import name` is an
edge to the submodule when `name` is one, else to `pkg`. A package's `__init__` that Python
runs on the way to a submodule is not an edge of its own (every module would otherwise reach
the package root).
"""
from __future__ import annotations

import ast
import collections
import os

from conftest import REPO_ROOT as ROOT
PACKAGE = "qdc"
FOLDERS = ("compiler", "runtime", "cli")  # the package's folders (pyproject's package-dir)


def _module_files() -> dict[str, str]:
    """Module name -> source path, for the package root and every module under FOLDERS."""
    modules = {PACKAGE: os.path.join(ROOT, "__init__.py")}
    for folder in FOLDERS:
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for f in files:
                if not f.endswith(".py"):
                    continue
                parts = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules[".".join([PACKAGE, *parts])] = os.path.join(dirpath, f)
    return modules


def _imports(module: str, path: str, modules: dict) -> list[tuple[str, int]]:
    """(imported qdc module, line) for every import statement of `module`, wherever it stands."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append((submodule if submodule in modules else source, node.lineno))
    return [(m, line) for m, line in found if m in modules and m != module]


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {imported module: line of its first import}."""
    modules = _module_files()
    graph = {}
    for module, path in modules.items():
        edges: dict = {}
        for imported, line in _imports(module, path, modules):
            edges.setdefault(imported, line)
        graph[module] = edges
    return graph


def circles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
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


def one_cycle(graph: dict, component: list[str]) -> list[str]:
    """A shortest import chain from the component's first module back to itself, each step
    written `module:line -> imported`."""
    members, start = set(component), component[0]
    came_from: dict = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for succ in sorted(graph[node]):
            if succ not in members or succ in came_from:
                continue
            came_from[succ] = node
            if succ == start:
                queue.clear()
                break
            queue.append(succ)
    steps, node = [], start
    while True:
        prev = came_from[node]
        steps.append(f"{prev}:{graph[prev][node]} -> {node}")
        node = prev
        if node == start:
            return steps[::-1]


def test_the_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    # compiler/driver/options.py reads the targets' declared options with a lazy relative import
    assert "qdc.compiler.targets" in graph["qdc.compiler.driver.options"]
    # the package root imports qdc.runtime.fields by name at module level
    assert "qdc.runtime.fields" in graph[PACKAGE]


def test_no_import_circles():
    graph = import_graph()
    found = circles(graph)
    report = [f"{len(c)} modules: {', '.join(c)}\n    " + "\n    ".join(one_cycle(graph, c)) for c in found]
    assert not found, "import circles (each with one chain that closes it):\n" + "\n".join(report)


# The compiler's floors, lowest first: the language's vocabulary (types, fields, vectors, math,
# what the front end resolves), the front end, the driver (compiling and caching), the
# kernel manifests (compiler/manifest: recording what a run instantiates, the manifest file), the
# user-facing kernel objects and decorators (compiler/jit), and what drives the compiler from
# outside a program and takes user kernels as they are (compiler/commands: `qdc build`, kernel_ir).
FLOORS = ("language", "frontend", "driver", "manifest", "jit", "commands")


def _floor(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != [PACKAGE, "compiler"] or len(parts) < 3 or parts[2] not in FLOORS:
        return None
    return FLOORS.index(parts[2])


def test_each_floor_imports_only_the_floors_below():
    upward = [f"{module}:{line} imports {imported} ({FLOORS[_floor(imported)]})"
              for module, edges in sorted(import_graph().items()) if _floor(module) is not None
              for imported, line in sorted(edges.items())
              if _floor(imported) is not None and _floor(imported) > _floor(module)]
    assert upward == []


def test_circles_are_found():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}, "e": {"e": 5}}
    assert circles(graph) == [["a", "b", "c"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a:1 -> b", "b:2 -> c", "c:3 -> a"]
