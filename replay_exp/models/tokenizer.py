"""A character-level tokenizer wrapped as a transformers tokenizer (one token per character).

Built locally from the ``tokenizers`` library, so the embedded default needs no hub. It saves and
loads with ``save_pretrained`` / ``from_pretrained`` like any hub tokenizer. Load it with
:func:`load_tokenizer` (``PreTrainedTokenizerFast``): ``AutoTokenizer`` on a directory whose model
config says ``qwen2`` returns ``Qwen2Tokenizer``, which drops this tokenizer's space token.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]  # ids 0..3
CHARS = "0123456789+-*/=()<>.,:;?! abcdefghijklmnopqrstuvwxyz"


def build_char_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """Pad 0, BOS 1, EOS 2, UNK 3, then one id per character; BOS is prepended on encode.
    Padding is on the left, as generation needs."""
    vocab = {t: i for i, t in enumerate(SPECIALS + list(dict.fromkeys(chars)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return _wrap(tok)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer saved with ``save_pretrained`` (or a hub id).

    Tokenizers saved from a bare ``tokenizers`` object (like ours) load as
    ``PreTrainedTokenizerFast``; anything else goes through ``AutoTokenizer``."""
    cfg_file = Path(path) / "tokenizer_config.json"
    if cfg_file.is_file():
        cls = json.loads(cfg_file.read_text()).get("tokenizer_class")
        if cls in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            tok = PreTrainedTokenizerFast.from_pretrained(str(path))
            tok.padding_side = "left"
            return tok
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


# Subword tokenizers shipped with the package (``model.tokenizer=<name>``): one
# ``tokenizers`` JSON file each, trained on a task's text by :func:`train_bpe_tokenizer`
# (``python -m replay_exp.models.ship_warm_start --tokenizer <name> ...`` writes it).
TOKENIZER_DIR = Path(__file__).parent / "tokenizers"


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def train_bpe_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 / Qwen style: no unknown characters, spaces kept) trained on
    ``texts``, digits always split one per token (as Llama and Qwen do, so a number's digits
    line up with their place values). Pad 0, BOS 1, EOS 2, UNK 3, then the 256 byte symbols
    and the merges; BOS is prepended on encode; padding on the left."""
    from tokenizers import trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", bos)]
    )
    return _wrap(tok)


def shipped_tokenizers() -> list[str]:
    """Names of the subword tokenizers shipped in :data:`TOKENIZER_DIR`."""
    return sorted(p.stem for p in TOKENIZER_DIR.glob("*.json"))


def build_tokenizer(name: str = "char") -> PreTrainedTokenizerFast:
    """The tokenizer of a from-config model: ``char`` (:func:`build_char_tokenizer`) or a
    subword tokenizer shipped in :data:`TOKENIZER_DIR`."""
    if name == "char":
        return build_char_tokenizer()
    path = TOKENIZER_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"model.tokenizer={name}: no such tokenizer; shipped: {shipped_tokenizers()}"
        )
    return _wrap(Tokenizer.from_file(str(path)))


def tokenizer_sha256(name: str) -> str | None:
    """SHA-256 of a shipped subword tokenizer's file (None for ``char``)."""
    if name == "char":
        return None
    import hashlib

    return hashlib.sha256((TOKENIZER_DIR / f"{name}.json").read_bytes()).hexdigest()
