"""partir's modules import one way, layer by layer, with no cycle.

`LAYERS` is the order, lowest first (DESIGN and STYLE: front end -> planning
-> cost -> driver -> report -> api -> interop). A module may import from its
own layer or a lower one; the layer it is in is the one `LAYERS` names. The
checks read the source (`ast`), so they see every import, run or not:

- no import cycle among partir's modules (module-level imports; importing
  `partir.a.b` also runs `partir/a/__init__.py`, so that counts as an import
  of `partir.a`, except from inside `partir.a`, which Python has already
  started), nor once the imports under `if TYPE_CHECKING:` and inside
  functions count too (a type that names its user, or a lazy import back,
  is a cycle in the design even when Python never runs it);
- every import, wherever it is (module level, `if TYPE_CHECKING:`, a
  function), follows `LAYERS` (but for the annotations `TYPE_ONLY_UPWARD`
  lists); nothing in partir imports the package root `partir` (the facade:
  it is above everything);
- an import inside a function is of an optional dependency (the extras in
  pyproject.toml: onnx, matplotlib), or of a partir module built on one; or of
  JAX in a module the compiler tools load (`TOOLS` start without JAX, and
  `partir-opt --check-numerics` imports it on use). Everywhere else JAX is
  imported at module level;
- `dialects`, `rewrites` and `lowering` never import `partir`.

The slow test imports each module first, in a fresh interpreter: an import
order that only works when another module came first shows there.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "front end",  # names, values, the mesh, the import from JAX, the layer loops
        (
            "partir.annotations",
            "partir.annotation_conflicts",
            "partir.cli_errors",
            "partir.devices",
            "partir.generated_files",
            "partir.importer",
            "partir.keys",
            "partir.mesh",
            "partir.mlir_bridge",
            "partir.roles",
            "partir.selections",
            "partir.selectors",
            "partir.spmd_form",
            "partir.values",
            "partir.pipeline",
            "partir.pipeline.layer_loops",
        ),
    ),
    (
        "planning",  # tactics as plans, plans as tiles and seeds on the module
        (
            "partir.blocks",
            "partir.plan",
            "partir.tactics",
            "partir.tiling",
            "partir.pipeline.schedule",
            "partir.pipeline.tactic",
        ),
    ),
    (
        "cost",  # the cost model: the SPMD program on a machine profile
        (
            "partir.cost",
            "partir.cost.calibrate",
            "partir.cost.collective_costs",
            "partir.cost.estimate",
            "partir.cost.machine",
            "partir.cost.memory",
            "partir.cost.op_costs",
            "partir.cost.plot",
            "partir.cost.profile",
        ),
    ),
    (
        "driver",  # the passes, the search, partition, and checking their stages
        (
            "partir.partition",
            "partir.passes",
            "partir.pipeline.builder",
            "partir.pipeline.program",
            "partir.pipeline.stage_loops",
            "partir.plan_passes",
            "partir.search",
            "partir.simulation",
            "partir.validation",
        ),
    ),
    (
        "report",  # what a partitioning did, as data and tables
        (
            "partir.report",
            "partir.report.build",
            "partir.report.diff",
            "partir.report.memory",
            "partir.report.model",
            "partir.report.names",
            "partir.report.pipeline",
            "partir.report.render",
            "partir.report.replicated",
            "partir.report.rows",
            "partir.onnx_interop",
            "partir.onnx_interop.export",
            "partir.onnx_interop.sharding",
            "partir.onnx_interop.to_onnx_ops",
        ),
    ),
    (
        "api",  # `Lowered`, `partir.jit`, and the pipeline's cost, report and ONNX files
        (
            "partir.api",
            "partir.lowered",
            "partir.onnx_interop.pipeline",
        ),
    ),
    (
        "interop",  # ONNX in, and the command-line tools
        (
            "partir.inspect",
            "partir.onnx_interop.cli",
            "partir.onnx_interop.from_onnx_ops",
            "partir.onnx_interop.importer",
            "partir.opt",
        ),
    ),
    ("facade", ("partir",)),
)

TYPE_ONLY_UPWARD = {
    ("partir.tactics", "partir.cost.profile"): "`Automatic` carries the profile its search uses",
}
"""The imports against `LAYERS` allowed, each only under `if TYPE_CHECKING:`
(for an annotation: nothing runs): importer, imported, why."""

TOOLS = ("partir.opt", "partir.inspect")
"""The compiler tools: they (and the package root) load without JAX."""

LOWER_PACKAGES = ("dialects", "rewrites", "lowering")


def _optional_dependencies() -> set[str]:
    """The import names of pyproject's extras other than `test`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    found = set()
    for extra, requirements in extras.items():
        if extra != "test":
            found |= {re.split(r"[<>=~!\[ ;]", r, maxsplit=1)[0] for r in requirements}
    return found


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    where: str  # "module", "type", "function"


def _modules(package: str) -> dict[str, Path]:
    modules = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules("partir")


def _targets(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    # `from partir.cost import estimate` imports the module when there is one
    return [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
        for alias in node.names
    ]


def _imports(module: str, path: Path) -> Iterator[Import]:
    def walk(node: ast.AST, where: str) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                inner = "function"
            elif (
                isinstance(child, ast.If)
                and where == "module"
                and "TYPE_CHECKING" in ast.unparse(child.test)
            ):
                yield from walk(ast.Module(body=child.body, type_ignores=[]), "type")
                yield from walk(ast.Module(body=child.orelse, type_ignores=[]), where)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                for target in _targets(child, module):
                    yield Import(module, target, child.lineno, inner)
            yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text(), str(path)), "module")


IMPORTS = [i for module, path in MODULES.items() for i in _imports(module, path)]


def _is_partir(name: str) -> bool:
    return name == "partir" or name.startswith("partir.")


def _runs(target: str, importer: str) -> list[str]:
    """The partir modules importing `target` from `importer` runs: it, and
    the packages above it that `importer` is not inside (root excluded)."""
    parts = target.split(".")
    packages = [".".join(parts[:n]) for n in range(2, len(parts))]
    outside = [p for p in packages if not (importer == p or importer.startswith(p + "."))]
    return [*outside, target]


def _edges(kinds: set[str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if i.where in kinds and _is_partir(i.target):
            for target in _runs(i.target, i.importer) if i.where == "module" else [i.target]:
                if target != i.importer:
                    graph[i.importer].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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


def _layer_of() -> dict[str, int]:
    return {m: n for n, (_, modules) in enumerate(LAYERS) for m in modules}


def _tool_closure() -> set[str]:
    """The partir modules the compiler tools load (with the package root)."""
    graph = _edges({"module"})
    seen: set[str] = set()
    todo = ["partir", *TOOLS]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def _where(i: Import) -> str:
    return f"{MODULES[i.importer].relative_to(ROOT)}:{i.line} imports {i.target}"


def test_every_module_has_a_layer() -> None:
    layer = _layer_of()
    assert sorted(set(MODULES) - set(layer)) == [], "add these modules to LAYERS"
    assert sorted(set(layer) - set(MODULES)) == [], "LAYERS names modules that do not exist"


def test_no_import_cycle() -> None:
    cycles = _cycles(_edges({"module"}))
    assert cycles == [], "import cycles among partir's modules:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_no_import_cycle_counting_every_import() -> None:
    cycles = _cycles(_edges({i.where for i in IMPORTS}))
    assert cycles == [], "import cycles among partir's modules (any import):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_imports_follow_the_layers() -> None:
    layer = _layer_of()
    names = [name for name, _ in LAYERS]
    wrong = []
    used = set()
    for i in IMPORTS:
        if not _is_partir(i.target) or i.target not in layer:
            continue
        if i.where == "type" and (i.importer, i.target) in TYPE_ONLY_UPWARD:
            used.add((i.importer, i.target))
            continue
        targets = _runs(i.target, i.importer) if i.where == "module" else [i.target]
        for target in targets:
            if layer[target] > layer[i.importer]:
                wrong.append(
                    f"{_where(i)} ({i.where}): layer {names[layer[i.importer]]!r} "
                    f"below {names[layer[target]]!r}"
                )
    assert wrong == [], "imports against LAYERS:\n" + "\n".join(dict.fromkeys(wrong))
    assert used == set(TYPE_ONLY_UPWARD), "TYPE_ONLY_UPWARD names imports no module makes"


def test_imports_inside_functions_are_of_optional_dependencies() -> None:
    optional = _optional_dependencies()
    assert {"onnx", "matplotlib"} <= optional
    built_on_optional = {
        i.importer
        for i in IMPORTS
        if i.where == "module" and i.target.split(".")[0] in optional
    }
    loaded_by_tools = _tool_closure()
    wrong = []
    for i in IMPORTS:
        if i.where != "function":
            continue
        top = i.target.split(".")[0]
        if top in optional or i.target in built_on_optional:
            continue
        if top == "jax" and i.importer in loaded_by_tools:
            continue
        wrong.append(_where(i))
    assert wrong == [], "imports inside functions (move them to the module's top):\n" + "\n".join(
        dict.fromkeys(wrong)
    )


def test_jax_at_module_level_outside_the_tools() -> None:
    loaded_by_tools = _tool_closure()
    wrong = [
        _where(i)
        for i in IMPORTS
        if i.where == "module" and i.target.split(".")[0] == "jax" and i.importer in loaded_by_tools
    ]
    assert wrong == [], "the compiler tools load these modules: import JAX on use:\n" + "\n".join(
        wrong
    )


def test_lower_packages_do_not_import_partir() -> None:
    wrong = []
    for package in LOWER_PACKAGES:
        for module, path in _modules(package).items():
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    names = (
                        [a.name for a in node.names]
                        if isinstance(node, ast.Import)
                        else [node.module or ""]
                    )
                    wrong += [f"{module}:{node.lineno} imports {n}" for n in names if _is_partir(n)]
    assert wrong == []


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_tools_start_without_jax() -> None:
    imports = "; ".join(f"import {m}" for m in ("partir", *TOOLS))
    done = _python(f"import sys; {imports}; print('jax' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_first(module: str) -> None:
    done = _python(f"import {module}")
    assert done.returncode == 0, done.stderr[-3000:]
