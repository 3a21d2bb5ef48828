"""The package's layout holds its architecture: no import cycle, the layering rules kept.

The import graph is read from the source with ``ast``: module-level and function-level
imports alike, ``TYPE_CHECKING`` imports too (a cycle hidden from the interpreter is still
a cycle for a reader), ``importlib.import_module("...")`` and ``"package.module:attr"``
import strings, and the ``__init__`` of every subpackage a module's import runs. The
root ``gym_harness/__init__.py`` is the public surface: it imports every part, and is
counted only where a module names it.

A part is a subpackage or a top-level module. The rules between parts: their import graph
is a DAG; each part sits on a floor (:data:`FLOORS`) and imports nothing from a floor
above its own; no module writes the attributes of an object of another part that it did
not construct; a module over :data:`LONG_MODULE` lines is named in its part's docstring
with the reason it is one job.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gym_harness"
_IMPORT_STRING = re.compile(r"(gym_harness(?:\.\w+)*):[\w.]+")

#: The parts from the ground up. A part imports only from its own floor and the floors
#: below (the cycle test keeps a floor's parts apart). ``agents/`` is the harness side, run
#: as a process of its own: it imports nothing above the ground, and the registration
#: names it as the reference agent's command. The root ``__init__`` is the public surface,
#: on the top floor with the parts that load it (the CLI reads its version, a Ray worker
#: imports it to register the env ids). ``usercode.py`` guards user code (reward,
#: callbacks) for the modes' recorder, so it sits below ``modes/``.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "outcome", "utils", "config", "lifecycle", "tasks", "records", "agents"),
    ("loopback", "process"),
    ("bridge", "capture", "model", "harnesses"),
    ("turn", "readiness", "usercode"),
    ("modes",),
    ("fork",),
    ("env", "spaces"),
    (
        "vector",
        "rollout",
        "training",
        "verl",
        "registration",
        "openenv",
        "policies",
        "suites",
        "",
        "__main__",
    ),
)
#: A module longer than this is named in its part's docstring with why it is one job.
LONG_MODULE = 600
#: Writes to an object of another part that its owner hands out to be written, by
#: ``(module, "name.attribute")``: the loopback connection's ``owner`` (the app names the
#: authenticated holder), OpenEnv's rollout result (the adapter fills it in), the env's
#: public ``on_event`` callback.
HANDED_OUT_FOR_WRITING: frozenset[tuple[str, str]] = frozenset(
    {
        ("gym_harness.model.endpoint", "conn.owner"),
        ("gym_harness.openenv.adapter", "result.done"),
        ("gym_harness.openenv.adapter", "result.messages"),
        ("gym_harness.rollout.cli", "harness_env.on_event"),
    }
)

#: Where model mode's step runs (the env hands its mode an ``Episode`` at each reset).
MODEL_MODE = ("gym_harness.model", "gym_harness.modes")
#: Parts above the env: the only importers of ``gym_harness.env``, with the public surface
#: (the root package, and the registration that names the env as gymnasium's entry point).
#: ``suites/`` builds envs of real benchmarks on it.
ABOVE_ENV = (
    "gym_harness.rollout",
    "gym_harness.suites",
    "gym_harness.vector",
    "gym_harness.registration",
    "gym_harness.openenv",
    "gym_harness.verl",
)
#: The optional OpenEnv bridge (the extra ``gym_harness[openenv]``): the only importer of
#: ``openenv``, and imported by nothing of the package (``import gym_harness`` never loads it).
OPENENV_PART = "gym_harness.openenv"
#: verl's agent loop (the extra ``gym_harness[verl]``): the same rule for ``verl``.
VERL_PART = "gym_harness.verl"
#: What the records part (what leaves an episode) may import of the package: the vocabulary.
RECORDS_MAY_IMPORT = (
    "gym_harness.records",
    "gym_harness.config",
    "gym_harness.errors",
    "gym_harness.outcome",
    "gym_harness.utils",
)
#: Libraries the records part never imports: trainers read records, not the other way.
TRAINER_LIBRARIES = ("openenv", "trl", "torch", "transformers", "verl", "skyrl")
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


def part_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """part -> the other parts its modules import."""
    parts: dict[str, set[str]] = {}
    for name, targets in graph.items():
        edges = parts.setdefault(_part(name), set())
        edges.update(_part(t) for t in targets)
        edges.discard(_part(name))
    return parts


def upward_imports(
    graph: Mapping[str, set[str]],
    floors: tuple[tuple[str, ...], ...] = FLOORS,
) -> list[str]:
    """``"module -> target"`` for each import of a part on a higher floor, and
    ``"module: part on no floor"`` for a module whose part no floor lists."""
    floor_of = {
        ".".join(["gym_harness", p] if p else ["gym_harness"]): i
        for i, ps in enumerate(floors)
        for p in ps
    }
    found = []
    for name, targets in sorted(graph.items()):
        here = floor_of.get(_part(name))
        if here is None:
            found.append(f"{name}: part {_part(name)} on no floor")
            continue
        found.extend(
            f"{name} -> {target}"
            for target in sorted(targets)
            if floor_of.get(_part(target), -1) > here
        )
    return found


def _describes_others(node: ast.ClassDef) -> bool:
    """A frozen dataclass, a Protocol, a TypedDict or a NamedTuple: its fields are not
    attributes its part writes (a Protocol describes an object of another part)."""
    bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
    frozen = any(
        isinstance(d, ast.Call)
        and any(k.arg == "frozen" and getattr(k.value, "value", False) for k in d.keywords)
        for d in node.decorator_list
    )
    return frozen or bool(bases & {"Protocol", "TypedDict", "NamedTuple"})


def _writable_attributes(tree: ast.AST) -> set[str]:
    """The attributes a module's classes own and may change: those stored through ``self``
    or ``cls``, and the fields of its mutable classes."""
    names = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef) and not _describes_others(node):
            names.update(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            )
    return names


def _constructed(scope: ast.AST) -> set[str]:
    """The names a scope binds only to objects it constructs (a call of a class)."""
    built: dict[str, bool] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            value, targets = node.value, node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            value, targets = node.value, [node.target]
        else:
            continue
        constructor = False
        if isinstance(value, ast.Call):
            func = value.func
            callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            constructor = callee[:1].isupper()
        for target in targets:
            for bound in ast.walk(target):
                if isinstance(bound, ast.Name):
                    built[bound.id] = built.get(bound.id, True) and constructor
    return {name for name, only in built.items() if only}


def foreign_writes(root: Path = PACKAGE) -> set[tuple[str, str]]:
    """``(module, "name.attribute")`` for each store to an attribute of an object that is
    neither ``self``/``cls`` nor constructed in that scope, where the attribute is not one
    the module's own part owns: a write into another part's object."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules(root).items()}
    owned: dict[str, set[str]] = {}
    for name, tree in trees.items():
        owned.setdefault(_part(name), set()).update(_writable_attributes(tree))
    found = set()
    for name, tree in trees.items():
        scopes = [
            tree,
            *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)),
        ]
        for scope in scopes:
            built = _constructed(scope) | {"self", "cls"}
            for node in ast.walk(scope):
                if not (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                ):
                    continue
                if node.value.id in built or node.attr.startswith("__"):
                    continue
                if node.attr not in owned[_part(name)]:
                    found.add((name, f"{node.value.id}.{node.attr}"))
    return found


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


def test_the_parts_import_one_way() -> None:
    graph = import_graph()
    cycle = find_cycle(part_graph(graph))
    assert cycle is None, "part cycle: " + " -> ".join(cycle or [])
    assert upward_imports(graph) == []


def _plant(root: Path, files: Mapping[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_planted_part_cycle_fails_the_check(tmp_path: Path) -> None:
    """Two parts that import each other through different modules: no module cycle, and
    a function-level import under ``TYPE_CHECKING`` makes the loop: the part check fails."""
    root = tmp_path / "gym_harness"
    _plant(
        root,
        {
            "__init__.py": "",
            "low/__init__.py": '"""The lower part."""\n',
            "low/a.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    def f():\n        from gym_harness.high.b import B\n"
            ),
            "low/c.py": "C = 1\n",
            "high/__init__.py": '"""The higher part."""\n',
            "high/b.py": "from gym_harness.low.c import C\nB = C\n",
            "top.py": "from gym_harness.high import b\n",
        },
    )
    floors = (("low",), ("high",), ("top", ""))
    graph = import_graph(root)
    assert find_cycle(graph) is None  # no module cycle: only the parts loop
    assert find_cycle(part_graph(graph)) == [
        "gym_harness.high",
        "gym_harness.low",
        "gym_harness.high",
    ]
    assert upward_imports(graph, floors) == [
        "gym_harness.low.a -> gym_harness.high",  # the __init__ the import runs
        "gym_harness.low.a -> gym_harness.high.b",
    ]
    # The same tree without the upward import passes both checks.
    _plant(root, {"low/a.py": "from gym_harness.low.c import C\n"})
    graph = import_graph(root)
    assert find_cycle(part_graph(graph)) is None
    assert upward_imports(graph, floors) == []
    # A part no floor lists is reported, so a new part must be placed.
    assert upward_imports(graph, (("low",), ("high",), ("",))) == [
        "gym_harness.top: part gym_harness.top on no floor"
    ]


def test_no_module_writes_another_parts_objects() -> None:
    """A part hands what a new object inherits to its constructor, and asks an object it
    did not construct to change itself; it never assigns that object's attributes."""
    found = foreign_writes() - HANDED_OUT_FOR_WRITING
    assert found == set()


def test_a_planted_foreign_write_is_found(tmp_path: Path) -> None:
    root = tmp_path / "gym_harness"
    _plant(
        root,
        {
            "__init__.py": "",
            "env.py": ("class Env:\n    def __init__(self):\n        self.trajectory = []\n"),
            "fork/__init__.py": '"""Forks."""\n',
            "fork/replay.py": (
                "from dataclasses import dataclass\n\n"
                "@dataclass(frozen=True)\nclass Parent:\n    trajectory: list\n\n"
                "class Own:\n    def __init__(self):\n        self.steps = 0\n\n"
                "def fork(parent, spawn):\n"
                "    child = spawn()\n"
                "    child.trajectory = list(parent.trajectory)\n"  # into the env: found
                "    mine = Own()\n    mine.steps = 1\n"  # constructed here
                "    other = spawn()\n    other.steps = 2\n"  # an attribute its part owns
                "    return child\n"
            ),
        },
    )
    assert foreign_writes(root) == {("gym_harness.fork.replay", "child.trajectory")}


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


@pytest.mark.parametrize(("part", "library"), [(OPENENV_PART, "openenv"), (VERL_PART, "verl")])
def test_nothing_imports_an_optional_part_and_only_it_imports_its_library(
    part: str, library: str
) -> None:
    importers = sorted(
        name
        for name, targets in import_graph().items()
        if not _within(name, (part,)) and any(_within(t, (part,)) for t in targets)
    )
    assert importers == []
    found = []
    for name, path in modules().items():
        if _within(name, (part,)):
            continue
        for target, _, line in _imported(name, path, ast.parse(path.read_text())):
            if _within(target, (library,)):
                found.append(f"{name}:{line} imports {target}")
    assert found == []


def test_the_records_part_imports_only_the_vocabulary() -> None:
    """What leaves an episode is at the ground: every part may import it, so it imports
    none of them (nor a trainer library: trainers read records)."""
    found = []
    for name, path in modules().items():
        if not _within(name, ("gym_harness.records",)):
            continue
        for target, _, line in _imported(name, path, ast.parse(path.read_text())):
            ours = _within(target, ("gym_harness",))
            if (ours and not _within(target, RECORDS_MAY_IMPORT)) or _within(
                target, TRAINER_LIBRARIES
            ):
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


def long_modules_without_a_reason(root: Path = PACKAGE, limit: int = LONG_MODULE) -> list[str]:
    """The modules over ``limit`` lines whose part's docstring (a top-level module's own)
    has no line naming the module as one job: ``<file name> ... one job ...``."""
    found = []
    for name, path in modules(root).items():
        if len(path.read_text().splitlines()) <= limit:
            continue
        part = root.parent.joinpath(*_part(name).split("."))
        home = part / "__init__.py" if part.is_dir() else path
        doc = ast.get_docstring(ast.parse(home.read_text())) or ""
        if not any(path.name in line and "one job" in line for line in doc.splitlines()):
            found.append(name)
    return found


def test_a_long_module_says_why_it_is_one_job(tmp_path: Path) -> None:
    assert long_modules_without_a_reason() == []
    root = tmp_path / "gym_harness"
    _plant(root, {"__init__.py": "", "part/__init__.py": '"""A part."""\n'})
    _plant(root, {"part/big.py": "X = 1\n" * 11})
    assert long_modules_without_a_reason(root, limit=10) == ["gym_harness.part.big"]
    _plant(root, {"part/__init__.py": '"""A part.\n\nbig.py is one job: the table.\n"""\n'})
    assert long_modules_without_a_reason(root, limit=10) == []


def test_every_part_says_what_it_owns() -> None:
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc, f"{folder.name}/__init__.py says what the part owns"
