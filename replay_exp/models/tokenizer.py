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
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


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
