"""The package's layers (docs/layout.md draws them): each module belongs to one layer and imports
nothing from a layer above its own. The modules import each other without a cycle, counting
imports inside functions too (a function-level import can hide a cycle that only bites at call
time), the leaf modules import nothing of the package, the top level holds only the entry, loop
and run files, no function is over 80 lines where a newcomer reads first, and reading a sweep
(``replay_exp.analysis``) never loads torch, transformers or the generation stack."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "replay_exp"
LEAVES = (
    "replay_exp.config.errors",
    "replay_exp.config.schemas",
    "replay_exp.compute.costmodel",
    "replay_exp.eval.estimators",
)
# The layers, lowest first: a module imports only from its own layer or those below. A module
# belongs to the layer of its longest matching prefix; a package's (empty) __init__ belongs to
# the leaves. docs/layout.md draws the same table.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("replay_exp", "replay_exp.config", "replay_exp.config.errors",
                "replay_exp.config.schemas", "replay_exp.config.seeding",
                "replay_exp.compute.costmodel", "replay_exp.eval.estimators", "replay_exp.types")),
    ("parts", ("replay_exp.algo", "replay_exp.buffer", "replay_exp.tasks", "replay_exp.models",
               "replay_exp.rollout", "replay_exp.compute", "replay_exp.eval", "replay_exp.theory",
               "replay_exp.runlog", "replay_exp.checkpoint", "replay_exp.control")),
    ("config", ("replay_exp.config.checks", "replay_exp.config.derive", "replay_exp.config.probe",
                "replay_exp.config.composition", "replay_exp.config.naming")),
    ("run", ("replay_exp.update", "replay_exp.rundir", "replay_exp.runtime", "replay_exp.loop",
             "replay_exp.train")),
    ("tools", ("replay_exp.analysis", "replay_exp.eval.final", "replay_exp.theory.measure",
               "replay_exp.theory.cli", "replay_exp.models.ship_warm_start",
               "replay_exp.config.sweep")),
]  # fmt: skip
# The only modules at the package's top level: the entry, the loop and the run's files.
TOP_LEVEL = {"__init__", "train", "loop", "update", "rundir", "checkpoint", "runlog", "types"}
# Where no function may be longer than this many lines (the issue-42 rule: readable in one go).
SHORT_FUNCTIONS = ("config", "update.py", "runtime/generator.py")
MAX_FUNCTION_LINES = 80
# What the analysis must not pull in, directly or through the package.
HEAVY = (
    "torch",
    "transformers",
    "replay_exp.rollout",
    "replay_exp.eval.evaluate",
    "replay_exp.models",
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _nearest(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its body (an import of a
    submodule also imports the packages above it)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".")[: len(mod.split(".")) - node.level + is_pkg]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for t in targets:
                if not t.startswith("replay_exp"):
                    continue
                target = _nearest(t, modules)
                parts = target.split(".") if target else []
                for i in range(1, len(parts) + 1):
                    up = ".".join(parts[:i])
                    if up in modules and up != mod and not mod.startswith(up + "."):
                        graph[mod].add(up)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(mod: str) -> int | None:
    """Index in LAYERS of the longest prefix of ``mod`` (None: in no layer)."""
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return best[0] if best else None


def test_every_module_imports_only_its_layer_or_below():
    graph = import_graph()
    unlayered = sorted(m for m in graph if layer_of(m) is None)
    assert not unlayered, unlayered
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if layer_of(d) > layer_of(m)
    ]
    assert not upward, upward


def test_the_layer_check_sees_an_upward_import():
    assert layer_of("replay_exp.buffer.fifo") < layer_of("replay_exp.loop")
    assert layer_of("replay_exp.eval.final") > layer_of("replay_exp.eval.evaluate")


def test_top_level_holds_only_the_entry_loop_and_run_files():
    names = {p.stem for p in PACKAGE.glob("*.py")}
    assert names <= TOP_LEVEL, sorted(names - TOP_LEVEL)


def test_no_long_function_where_a_newcomer_reads_first():
    long = []
    for where in SHORT_FUNCTIONS:
        target = PACKAGE / where
        for path in sorted(target.rglob("*.py") if target.is_dir() else [target]):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({n} lines)")
    assert not long, long


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_leaves_import_nothing_of_the_package():
    graph = import_graph()
    for leaf in LEAVES:
        assert graph[leaf] <= {"replay_exp"}, (leaf, graph[leaf])


def test_generation_does_not_import_the_trainer():
    graph = import_graph()
    for mod in ("replay_exp.rollout.collect", "replay_exp.eval.evaluate", "replay_exp.rollout.hf"):
        assert "replay_exp.update" not in graph[mod] and "replay_exp.train" not in graph[mod]


def test_estimators_import_only_numpy_and_math():
    tree = ast.parse((PACKAGE / "eval" / "estimators.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}  # fmt: skip
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}  # fmt: skip
    assert names <= {"__future__", "math", "numpy"}, names


def test_the_analysis_does_not_import_the_generation_stack():
    """Statically: no analysis module imports (through any chain of the package's modules)
    the evaluation, generation or model code. Then for real, in a fresh interpreter:
    importing the analysis and its report leaves torch and transformers unloaded."""
    graph = import_graph()

    def reach(mod: str) -> set[str]:
        seen, todo = set(), [mod]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    for mod in graph:
        if mod.startswith("replay_exp.analysis"):
            bad = {m for m in reach(mod) if m.startswith(HEAVY)}
            assert not bad, (mod, bad)
    code = (
        "import sys, replay_exp.analysis, replay_exp.analysis.report, replay_exp.analysis.stats\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r}"
        " or m.startswith(('replay_exp.rollout', 'replay_exp.models'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
