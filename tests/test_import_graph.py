"""The package's import graph: no circles, no upward imports, every lazy import says why.

Every module under hookgraph/ is parsed (ast, nothing is imported) and its imports of other
hookgraph modules become edges: ``import hookgraph.a.b`` and ``from hookgraph.a import b``
(``b`` a submodule) point at ``hookgraph.a.b``; ``from hookgraph.a import name`` points at the
package ``hookgraph.a``. Importing ``hookgraph.a.b`` also runs ``hookgraph/a/__init__.py``;
that implicit edge is left out, as import linters do (a package that re-exports its
submodules would otherwise be a circle with each of them).

The layers, lowest first; a module may import its own layer and the ones below it:

1. errors: ``hookgraph.errors``, ``hookgraph.version`` (the typed errors and the version);
2. config: ``hookgraph.config`` (the door: schema, typed settings, bounded YAML reading, resolvers,
   instantiate, hook sets; the only owner of OmegaConf with cli/, tests/test_config_door.py);
3. core basics: ``core.tree``, ``core.dtypes``, ``core.gcpause``, ``core.transfer``,
   ``core.torch_internals``, ``core.dtensors``, ``core.html_tables`` (helpers with no notion of a spec);
4. runs: ``hookgraph.runs`` (the run folder: its layout, writer and reader);
5. engine: the rest of ``hookgraph.core`` (spec, points, resolve, registry, compiler, graph,
   store, discovery, hooks/): what an action is, and how it is resolved and bound, is the
   engine's; it never imports an action;
6. actions: ``hookgraph.actions``, the built-in actions, registered into the engine's registry;
7. inputs: ``hookgraph.data`` and ``hookgraph.models``;
8. report: ``hookgraph.report`` (pages and figures of finished runs);
9. runner: ``hookgraph.runner`` (a config in, a run folder out);
10. integrations: ``hookgraph.integrations`` (callbacks of other trainers driving a run folder);
11. cli: ``hookgraph.cli``;
12. top: ``hookgraph`` itself and ``hookgraph.__main__``.

Circles are looked for over every import, at module level and inside functions alike (an
import inside a function hides a circle from Python, not from the reader); imports under
``if TYPE_CHECKING:`` never run and are left out of circles, not of the layer check.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hookgraph"

# Lowest first: (layer name, module prefixes). A module belongs to the longest prefix that matches.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("errors", ("hookgraph.errors", "hookgraph.version")),
    ("config", ("hookgraph.config",)),
    (
        "core basics",
        (
            "hookgraph.core.tree",
            "hookgraph.core.dtypes",
            "hookgraph.core.gcpause",
            "hookgraph.core.transfer",
            "hookgraph.core.torch_internals",
            "hookgraph.core.dtensors",
            "hookgraph.core.sequence",
            "hookgraph.core.fingerprint",
            "hookgraph.core.html_tables",
        ),
    ),
    ("runs", ("hookgraph.runs",)),
    ("engine", ("hookgraph.core",)),
    ("actions", ("hookgraph.actions",)),
    ("inputs", ("hookgraph.data", "hookgraph.models")),
    ("report", ("hookgraph.report",)),
    ("runner", ("hookgraph.runner",)),
    ("integrations", ("hookgraph.integrations",)),
    ("cli", ("hookgraph.cli",)),
    ("top", ("hookgraph", "hookgraph.__main__")),
)


@dataclass(frozen=True)
class Import:
    """One import of a hookgraph module by another."""

    source: str  # the importing module
    target: str  # the imported module (a package stands for its __init__)
    path: Path
    line: int
    in_function: bool
    type_checking: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS"
    return best


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _targets(source: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "hookgraph"]
    module = _absolute(source, path.name == "__init__.py", node)
    if module.split(".")[0] != "hookgraph":
        return []
    out = []
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        out.append(sub if sub in MODULES else module)
    return out


def _imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _targets(module, path, node):
                found.append(Import(module, target, path, node.lineno, in_function, type_checking))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, in_function, True)
            for child in node.orelse:
                visit(child, in_function, type_checking)
            return
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner, type_checking)

    visit(tree, False, False)
    return found


IMPORTS: list[Import] = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; the graph is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
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
            if len(component) > 1 or v in edges.get(v, ()):
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return [_one_circle(c, edges) for c in components]


def _one_circle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A path start -> ... -> start inside the component, for the message."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges.get(v, ())):
            if w == start:
                return [*paths[v], start]
            if w in members and w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return component


def test_every_module_is_in_a_layer():
    assert "hookgraph.core.compiler" in MODULES and len(MODULES) > 40
    unplaced = []
    for module in MODULES:
        try:
            _layer(module)
        except AssertionError:
            unplaced.append(module)
    assert unplaced == []


def test_the_import_graph_has_no_circles():
    edges: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for imp in IMPORTS:
        if imp.type_checking or imp.target == imp.source:
            continue
        edges.setdefault(imp.source, set()).add(imp.target)
        where.setdefault((imp.source, imp.target), imp.where)
    circles = _cycles(edges)
    shown = [
        " -> ".join(c) + "\n    " + ", ".join(where[(a, b)] for a, b in zip(c, c[1:], strict=False) if (a, b) in where)
        for c in circles
    ]
    assert circles == [], "import circles:\n  " + "\n  ".join(shown)


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{imp.where}: {imp.source} ({LAYERS[_layer(imp.source)][0]}) imports {imp.target} "
        f"({LAYERS[_layer(imp.target)][0]})"
        for imp in IMPORTS
        if imp.target in MODULES and _layer(imp.target) > _layer(imp.source)
    ]
    assert upward == [], "upward imports:\n  " + "\n  ".join(upward)


def _function_level_imports() -> list[tuple[Path, int, str]]:
    """Every import statement inside a function of the package, hookgraph's or another's."""
    out = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        out.append((path, node.lineno, ast.unparse(node)))
    return sorted(set(out))


def test_every_function_level_import_says_why_it_is_lazy():
    found = _function_level_imports()
    assert found, "the walk found no function-level import at all: it is broken"
    bare = []
    for path, line, code in found:
        lines = path.read_text(encoding="utf-8").splitlines()
        # The comment sits on the import's line or above its block of consecutive imports.
        first = line - 1
        while first > 0 and lines[first - 1].lstrip().startswith(("import ", "from ")):
            first -= 1
        here, above = lines[line - 1], lines[first - 1] if first >= 1 else ""
        if "# lazy:" not in here and not above.strip().startswith("# lazy:"):
            bare.append(f"{path.relative_to(ROOT)}:{line}: {code}")
    assert bare == [], "function-level imports without a '# lazy: why' comment:\n  " + "\n  ".join(bare)


def test_the_graph_walk_sees_what_it_should():
    # The walk itself: a submodule named in `from package import name` is an edge to it.
    targets = {(i.source, i.target) for i in IMPORTS}
    assert ("hookgraph.data.build", "hookgraph.data.kinds") in targets
    assert ("hookgraph.runner.parts", "hookgraph.core.compiler") in targets
    assert _layer("hookgraph.core.tree") < _layer("hookgraph.core.compiler") < _layer("hookgraph.runner.parts")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


MAX_LINES = 800  # one job a room: a module past this holds several (issue 35)


def test_no_module_is_over_800_lines():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()}
    long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by what they do): {long}"
