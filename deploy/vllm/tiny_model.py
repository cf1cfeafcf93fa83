"""Build the tiny Llama that the real-vLLM tests serve: `python tiny_model.py OUT_DIR` (scripts/vllm runs it).

No weights can be fetched, and none are needed: a random-weight model writes nonsense, but vLLM's timings,
queue, KV cache, prefix cache, spans and metrics are as real as with any other model. It is built with the
vLLM environment's own tokenizers, transformers and torch, so vLLM reads exactly what they write.

- tokenizer: a byte-level BPE (4096 tokens) trained on this Python's standard-library sources (text that
  every machine has), with <s>, </s>, <pad> and a small chat template;
- model: LlamaForCausalLM, hidden 256, 2 layers, 4 heads, weights drawn from a fixed seed, saved as bf16
  safetensors; 4096 positions, so that one generation can run for the whole of a test phase (a few
  thousand tokens: seconds on two cores) while other requests come and go.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCABULARY = 4096
SPECIAL = ("<s>", "</s>", "<pad>")
SEED = 20261127
# Enough text for a 4096-token vocabulary in a few seconds: the top-level modules, not the packages.
TEXT_BYTES = 8 * 1024 * 1024
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def training_text() -> Iterator[str]:
    """The standard library's top-level sources in name order, up to TEXT_BYTES: the same on every build."""
    left = TEXT_BYTES
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text[:left]
        left -= len(text)
        if left <= 0:
            return


def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCABULARY,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(training_text(), trainer=trainer)
    bos, eos, pad = SPECIAL
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=bos, eos_token=eos, pad_token=pad, chat_template=CHAT_TEMPLATE
    )


def model(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main(out: Path) -> None:
    tok = tokenizer()
    tok.save_pretrained(out)
    model(tok).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tiny_model.py OUT_DIR")
    main(Path(sys.argv[1]))
