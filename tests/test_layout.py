"""The package's layout holds its architecture: no import cycle, the layering rules kept.

The import graph is read from the source with ``ast``: module-level and function-level
imports alike, ``TYPE_CHECKING`` imports too (a cycle hidden from the interpreter is still
a cycle for a reader), ``importlib.import_module("...")`` and ``"package.module:attr"``
import strings, and the ``__init__`` of every subpackage a module's import runs. The
root ``gym_harness/__init__.py`` is the public surface: it imports every part, and is
counted only where a module names it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gym_harness"
_IMPORT_STRING = re.compile(r"(gym_harness(?:\.\w+)*):[\w.]+")

#: Where model mode's step runs (the env hands its mode an ``Episode`` at each reset).
MODEL_MODE = ("gym_harness.model", "gym_harness.modes")
#: Parts above the env: the only importers of ``gym_harness.env``, with the public surface
#: (the root package, and the registration that names the env as gymnasium's entry point).
ABOVE_ENV = (
    "gym_harness.rollout",
    "gym_harness.vector",
    "gym_harness.registration",
    "gym_harness.openenv",
)
#: The optional OpenEnv bridge (the extra ``gym_harness[openenv]``): the only importer of
#: ``openenv``, and imported by nothing of the package (``import gym_harness`` never loads it).
OPENENV_PART = "gym_harness.openenv"
#: What the traces part (records in, a plain trace out) never imports.
TRACES_MUST_NOT_IMPORT = (
    "gym_harness.env",
    "gym_harness.process",
    "gym_harness.loopback",
    "gym_harness.bridge",
    "gym_harness.capture.proxy",
    "gym_harness.model",
    OPENENV_PART,
    "openenv",
)
#: What the fork part must not import: it reaches the env and its processes through the
#: ``spawn`` and the parts ``HarnessEnv.fork`` hands it.
FORK_MUST_NOT_IMPORT = ("gym_harness.env", "gym_harness.process", "gym_harness.loopback")
#: What the process layer may import: it knows nothing of episodes, tools or models.
PROCESS_MAY_IMPORT = (
    "gym_harness.process",
    "gym_harness.config",
    "gym_harness.errors",
    "gym_harness.lifecycle",
    "gym_harness.tasks",
    "gym_harness.utils",
)
#: What no adapter imports: processes and sockets are the layers below's.
ADAPTERS_MUST_NOT_IMPORT = (
    "psutil",
    "socket",
    "socketserver",
    "selectors",
    "ssl",
    "asyncio",
    "http",
    "uvicorn",
    "httpx",
    "httpx2",
    "h11",
    "gym_harness.process",
    "gym_harness.loopback",
    "gym_harness.bridge.server",
    "gym_harness.capture.proxy",
    "gym_harness.model.endpoint",
)
#: Calls that run an event loop; only the loopback layer makes them.
_LOOP_RUNNERS = frozenset({"run", "new_event_loop", "run_until_complete", "run_forever"})
#: The agent that ships with the package runs as the harness, in a process of its own:
#: its MCP client's loop is the harness's, not the env's.
HARNESS_SIDE = "gym_harness.agents"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _owners(target: str, importer: str, known: Mapping[str, Path]) -> Iterator[str]:
    """The modules an import of ``target`` from ``importer`` runs: it (or the module that
    holds the name), and each subpackage ``__init__`` above it that has not already run
    (the importer's own ancestors ran before it; the root's is the public surface)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    while target.count(".") >= 1 and not importer.startswith(target + "."):
        yield target
        target = target.rpartition(".")[0]


def _imported(name: str, path: Path, tree: ast.AST) -> Iterator[tuple[str, list[str], int]]:
    """``(module, names, line)`` for each import in ``tree`` (names: ``from`` imports)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            yield base, [alias.name for alias in node.names], node.lineno
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == "import_module" and isinstance(node.args[0].value, str):
                yield node.args[0].value, [], node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _IMPORT_STRING.fullmatch(node.value)
            if match:
                yield match.group(1), [], node.lineno


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules its imports run (itself aside)."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges: set[str] = set()
        for target, names, _ in _imported(name, path, ast.parse(path.read_text())):
            if target != root.name and not target.startswith(root.name + "."):
                continue
            if target == root.name:  # ``import gym_harness`` / ``from gym_harness import X``
                edges.add(target)
            edges.update(_owners(target, name, known))
            for alias in names:  # ``from package import module``
                if f"{target}.{alias}" in known:
                    edges.update(_owners(f"{target}.{alias}", name, known))
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _part(name: str) -> str:
    """The part a module belongs to: its subpackage, or itself at the top."""
    parts = name.split(".")
    return ".".join(parts[:2])


# -- the tests ----------------------------------------------------------------------------


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    root = tmp_path / "gym_harness"
    (root / "part").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "part" / "__init__.py").write_text('"""A part."""\n')
    (root / "part" / "a.py").write_text("from gym_harness.part.b import B\n")
    (root / "part" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    def f():\n        from gym_harness.part import a\n"
    )
    (root / "top.py").write_text('LAZY = "gym_harness.part.a:A"\n')
    graph = import_graph(root)
    assert graph["gym_harness.top"] == {"gym_harness.part.a", "gym_harness.part"}
    assert find_cycle(graph) == ["gym_harness.part.a", "gym_harness.part.b", "gym_harness.part.a"]
    (root / "part" / "b.py").write_text("B = 1\n")
    assert find_cycle(import_graph(root)) is None
    # Importing a module runs the __init__ of its package: one that imports the
    # importer back is a cycle too.
    (root / "part" / "__init__.py").write_text("import gym_harness.top\n")
    assert find_cycle(import_graph(root)) == [
        "gym_harness.part",
        "gym_harness.top",
        "gym_harness.part",
    ]


def test_the_process_layer_imports_only_what_is_below_it() -> None:
    wrong = {
        name: sorted(t for t in targets if not _within(t, PROCESS_MAY_IMPORT))
        for name, targets in import_graph().items()
        if _within(name, ("gym_harness.process",))
    }
    assert {name: targets for name, targets in wrong.items() if targets} == {}


def test_adapters_touch_no_process_or_socket_code() -> None:
    found = []
    for name, path in modules().items():
        if not _within(name, ("gym_harness.harnesses",)):
            continue
        for target, _, line in _imported(name, path, ast.parse(path.read_text())):
            if _within(target, ADAPTERS_MUST_NOT_IMPORT):
                found.append(f"{path.name}:{line} imports {target}")
    assert found == []


def test_only_the_loopback_layer_runs_event_loops() -> None:
    found = []
    for name, path in modules().items():
        if _within(name, ("gym_harness.loopback", HARNESS_SIDE)):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LOOP_RUNNERS
                and (
                    node.func.attr != "run" or ast.unparse(node.func.value) in ("asyncio", "anyio")
                )
            ):
                found.append(f"{name}:{node.lineno} {ast.unparse(node.func)}")
    assert found == []


def test_forks_reach_the_env_and_its_processes_only_through_what_they_are_handed() -> None:
    """``fork/`` gets a ``spawn`` and the episode's parts from the env: it imports neither the
    env nor the process layer (children are made and ended through their env)."""
    wrong = {
        name: sorted(t for t in targets if _within(t, FORK_MUST_NOT_IMPORT))
        for name, targets in import_graph().items()
        if _within(name, ("gym_harness.fork",))
    }
    assert {name: targets for name, targets in wrong.items() if targets} == {}


def test_nothing_below_the_env_imports_the_env() -> None:
    importers = sorted(
        name
        for name, targets in import_graph().items()
        if "gym_harness.env" in targets and not _within(name, ABOVE_ENV)
    )
    assert importers == ["gym_harness"]  # the public surface, and the parts above the env


def test_nothing_imports_the_openenv_part_and_only_it_imports_openenv() -> None:
    importers = sorted(
        name
        for name, targets in import_graph().items()
        if not _within(name, (OPENENV_PART,)) and any(_within(t, (OPENENV_PART,)) for t in targets)
    )
    assert importers == []
    found = []
    for name, path in modules().items():
        if _within(name, (OPENENV_PART,)):
            continue
        for target, _, line in _imported(name, path, ast.parse(path.read_text())):
            if _within(target, ("openenv",)):
                found.append(f"{name}:{line} imports {target}")
    assert found == []


def test_the_traces_part_reads_records_only() -> None:
    found = []
    for name, path in modules().items():
        if not _within(name, ("gym_harness.traces",)):
            continue
        for target, _, line in _imported(name, path, ast.parse(path.read_text())):
            if _within(target, TRACES_MUST_NOT_IMPORT):
                found.append(f"{name}:{line} imports {target}")
    assert found == []


def _private_definitions(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, module and self attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_part_reaches_into_another_modules_private_members() -> None:
    """A private name (``_x``) is used only by the module that defines it, or imported
    within its own part; a part hands another what it needs instead."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules().items()}
    defined = {name: _private_definitions(tree) for name, tree in trees.items()}
    elsewhere: dict[str, set[str]] = {}
    for name, names in defined.items():
        for private in names:
            elsewhere.setdefault(private, set()).add(name)
    found = []
    for name, tree in trees.items():
        for target, names, line in _imported(name, modules()[name], tree):
            for alias in names:
                if alias.startswith("_") and _part(target) != _part(name):
                    found.append(f"{name}:{line} imports {alias} from {target}")
            leaf = target.rpartition(".")[2]
            private = leaf.startswith("_") and not leaf.startswith("__")
            if private and target.startswith("gym_harness.") and _part(target) != _part(name):
                found.append(f"{name}:{line} imports the private module {target}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            if node.attr.startswith("__") or node.attr in defined[name]:
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if node.attr in elsewhere:  # someone else's private member
                found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


#: The env's private members; model mode gets what it needs of them handed in.
ENV_PRIVATE = re.compile(r"\._(record|budget|runner|proxy|startup_error|model|proc)\b")


def test_model_mode_reads_nothing_private_of_the_env() -> None:
    found = [
        f"{name}:{number}: {line.strip()}"
        for name, path in modules().items()
        if _within(name, MODEL_MODE)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ENV_PRIVATE.search(line)
    ]
    assert found == []


def test_the_top_level_is_small_and_every_module_is_in_a_part() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 15, top
    long = {
        module: n
        for module, path in modules().items()
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert long == {}
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc, f"{folder.name}/__init__.py says what the part owns"
