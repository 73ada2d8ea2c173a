"""The package's modules import each other without a cycle, counting imports inside functions
too (a function-level import can hide a cycle that only bites at call time), the leaf
modules import nothing of the package, and reading a sweep (``replay_exp.analysis``) never
loads torch, transformers or the generation stack."""

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
