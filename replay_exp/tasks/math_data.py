r"""Math word-problem datasets as :class:`~replay_exp.tasks.base.Problem` lists.

Datasets (``name``), their hub defaults and how each row becomes ``Problem(prompt, answer)``:

- ``gsm8k`` (``openai/gsm8k``, config ``main``): fields ``question``, ``answer``. The prompt is
  ``question``; the reference is the text after the last ``####`` of ``answer`` with commas
  removed (``#### 1,250`` -> ``1250``).
- ``math`` (``EleutherAI/hendrycks_math``; with no ``config`` all seven subject configs are
  loaded and concatenated; MATH-500 files have the same fields): fields ``problem``,
  ``solution``, optional ``answer``. The prompt is ``problem``; the reference is ``answer`` when
  the row has a non-empty one (MATH-500), else the content of the last ``\boxed{}`` of
  ``solution``.
- ``openr1_math`` (``open-r1/OpenR1-Math-220k``, config ``default``): fields ``problem``,
  ``answer`` (other columns are ignored). The reference is ``answer``; rows whose answer is
  empty, ``proof`` or ``notfound`` (NuminaMath-1.5 markers, any case) are not verifiable.

Rows whose reference cannot be extracted are skipped, with one :class:`MathDataWarning` giving
the count. ``Problem.prompt`` is the bare question: the task wiring applies
:func:`render_prompt` (and then the tokenizer's chat template, if any). Local files
(``.jsonl``, ``.json``, ``.parquet``, or a directory of files of one of these formats) are read
with ``datasets.load_dataset("json" | "parquet", data_files=...)`` and always read whole
(``split`` and ``config`` only apply to hub loads).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replay_exp.tasks.base import Problem
from replay_exp.tasks.math_reward import after_hashes, last_boxed

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_HUB",
    "MATH_SUBJECTS",
    "PROMPT_TEMPLATES",
    "REQUIRED_FIELDS",
    "MathDataWarning",
    "load_math_problems",
    "render_prompt",
    "split_problems",
]

DEFAULT_HUB = {
    "gsm8k": "openai/gsm8k",
    "math": "EleutherAI/hendrycks_math",
    "openr1_math": "open-r1/OpenR1-Math-220k",
}
DEFAULT_CONFIG: dict[str, str | None] = {"gsm8k": "main", "math": None, "openr1_math": "default"}
MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
REQUIRED_FIELDS = {
    "gsm8k": ("question", "answer"),
    "math": ("problem", "solution"),
    "openr1_math": ("problem", "answer"),
}
_OPTIONAL_FIELDS = {"gsm8k": (), "math": ("answer",), "openr1_math": ()}
_UNVERIFIABLE = {"", "proof", "notfound"}

PROMPT_TEMPLATES = {
    "default": (
        "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
    ),
    "plain": "{question}",
}

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class MathDataWarning(UserWarning):
    """Rows skipped while loading a math dataset."""


def render_prompt(question: str, template: str = "default") -> str:
    """``template`` (a :data:`PROMPT_TEMPLATES` key, or a string containing ``{question}``)
    with ``{question}`` replaced; other braces, like ``\\boxed{}``, are kept as they are."""
    text = PROMPT_TEMPLATES.get(template, template)
    if "{question}" not in text:
        raise ValueError(
            f"prompt template {template!r} is neither one of {sorted(PROMPT_TEMPLATES)} "
            "nor a string containing '{question}'"
        )
    return text.replace("{question}", question)


def _reference(name: str, row: dict[str, Any]) -> str | None:
    if name == "gsm8k":
        found = after_hashes(str(row["answer"] or ""))
        return found.replace(",", "").strip() if found else None
    if name == "math":
        answer = row.get("answer")
        if answer is not None and str(answer).strip():
            return str(answer).strip()
        return last_boxed(str(row["solution"] or ""))
    answer = "" if row["answer"] is None else str(row["answer"]).strip()
    return None if answer.lower() in _UNVERIFIABLE else answer


def _prompt(name: str, row: dict[str, Any]) -> str:
    return str(row["question" if name == "gsm8k" else "problem"] or "").strip()


def _root_message(e: BaseException) -> str:
    for _ in range(32):  # the innermost cause usually says what went wrong
        inner = e.__cause__ or e.__context__
        if inner is None:
            break
        e = inner
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"


def _is_empty(path: Path, builder: str) -> bool:
    """A json file of whitespace or a parquet file of 0 rows (datasets fails on both with
    unhelpful errors: StopIteration, ArrowInvalid)."""
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows == 0
        except Exception:
            return False  # not readable as parquet: datasets reports it
    with path.open("rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return False
    return True


def _local_files(path: Path) -> tuple[str, list[str]]:
    """(datasets builder name, files) for a file or a directory of files of one format."""
    if not path.exists():
        raise FileNotFoundError(f"math dataset path not found: {path}")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _FORMATS)
        if not files:
            raise FileNotFoundError(f"no .jsonl/.json/.parquet files in directory {path}")
    elif path.suffix in _FORMATS:
        files = [path]
    else:
        raise ValueError(
            f"unsupported math dataset file {path}: expected .jsonl, .json or .parquet"
        )
    formats = {_FORMATS[p.suffix] for p in files}
    if len(formats) > 1:
        raise ValueError(f"directory {path} mixes json and parquet files; use one format")
    for p in files:
        if _is_empty(p, _FORMATS[p.suffix]):
            raise ValueError(f"empty math dataset file: {p}")
    return formats.pop(), [str(p) for p in files]


def _load_local(path: Path, cache_dir: str | None) -> Any:
    import datasets

    builder, files = _local_files(path)
    try:
        return datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache_dir)
    except Exception as e:
        raise ValueError(f"could not read {path} as {builder}: {_root_message(e)}") from e


def _load_hub(name: str, hub_id: str, config: str | None, split: str, cache_dir: str | None):
    import datasets

    configs: Sequence[str | None] = [config]
    if name == "math" and hub_id == DEFAULT_HUB["math"] and config is None:
        configs = MATH_SUBJECTS
    try:
        parts = [
            datasets.load_dataset(hub_id, c, split=split, cache_dir=cache_dir) for c in configs
        ]
    except Exception as e:
        raise RuntimeError(
            f"could not load {hub_id} (config {config}, split {split}) from the hub "
            f"(offline? {_root_message(e)}); pass task.path=<local .jsonl/.json/.parquet file "
            "in the same format>"
        ) from e
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def load_math_problems(
    name: str,
    path: str | Path | None = None,
    hub_id: str | None = None,
    split: str = "train",
    config: str | None = None,
    limit: int | None = None,
    cache_dir: str | None = None,
) -> list[Problem]:
    """Problems of dataset ``name`` from a local ``path`` or, without one, from the hub.

    ``config`` defaults to :data:`DEFAULT_CONFIG` for hub loads; ``limit`` keeps the first
    ``limit`` usable problems in file order; ``cache_dir`` is passed to ``datasets``.
    """
    if name not in REQUIRED_FIELDS:
        raise ValueError(
            f"unknown math dataset {name!r}; expected one of {sorted(REQUIRED_FIELDS)}"
        )
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit} must be >= 1 (or None for all rows)")
    if path is not None:
        source = str(path)
        ds = _load_local(Path(path), cache_dir)
    else:
        hub_id = hub_id or DEFAULT_HUB[name]
        config = config if config is not None else DEFAULT_CONFIG[name]
        source = f"{hub_id} ({config}, {split})"
        ds = _load_hub(name, hub_id, config, split, cache_dir)
    found = list(ds.column_names)
    missing = [f for f in REQUIRED_FIELDS[name] if f not in found]
    if missing:
        raise ValueError(
            f"{source} is not in the {name} format: missing field(s) {missing} "
            f"(expected {list(REQUIRED_FIELDS[name])}; found {found})"
        )
    if len(ds) == 0:
        raise ValueError(f"{source} has no rows")
    fields = [f for f in REQUIRED_FIELDS[name] + _OPTIONAL_FIELDS[name] if f in found]
    columns = ds.select_columns(fields).to_dict()
    problems: list[Problem] = []
    skipped = 0
    for values in zip(*(columns[f] for f in fields), strict=True):
        row = dict(zip(fields, values, strict=True))
        prompt, answer = _prompt(name, row), _reference(name, row)
        if not prompt or not answer:
            skipped += 1
            continue
        problems.append(Problem(prompt=prompt, answer=answer))
        if limit is not None and len(problems) == limit:
            break
    if skipped:
        warnings.warn(
            f"{source}: skipped {skipped} row(s) without a usable question or reference answer",
            MathDataWarning,
            stacklevel=2,
        )
    if not problems:
        raise ValueError(f"{source}: no row has a usable question and reference answer")
    return problems


def _split_key(seed: int, prompt: str) -> bytes:
    return hashlib.blake2b(f"{seed}\0{prompt}".encode(), digest_size=8).digest()


def split_problems(
    problems: Sequence[Problem], n_eval: int, seed: int = 0
) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out): the ``n_eval`` distinct prompts with the smallest seeded hash are
    held out (their first occurrence, in input order); every copy of them leaves ``train``.

    The split depends only on the set of prompts and ``seed``, not on the row order, so the
    same file always gives the same held-out set.
    """
    prompts = list(dict.fromkeys(p.prompt for p in problems))
    if not 0 <= n_eval < len(prompts):
        raise ValueError(
            f"n_eval={n_eval} must be in [0, {len(prompts) - 1}] "
            f"({len(prompts)} distinct prompts; at least one must stay for training)"
        )
    held = set(sorted(prompts, key=lambda q: _split_key(seed, q))[:n_eval])
    train = [p for p in problems if p.prompt not in held]
    held_out: list[Problem] = []
    for p in problems:
        if p.prompt in held:
            held_out.append(p)
            held.discard(p.prompt)
    return train, held_out
