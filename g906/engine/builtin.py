"""Builtin synthetic models: `builtin:tiny-qwen35`.

A deterministic, random-weight Qwen3.5 text model (4 layers: 3 Gated DeltaNet + 1 full
attention, more value heads than key heads), a small byte-level BPE tokenizer trained here on an
embedded corpus, and a ChatML chat template in the Qwen3 style whose generation prompt opens
`<think>\\n`. It needs no download and runs in milliseconds on a CPU: smoke tests, the demo recipe
and `g906 generate --model builtin:tiny-qwen35`. Its output is meaningless, and it says so when
loaded.

    config, weights, tokenizer, template = load_builtin("builtin:tiny-qwen35")
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import torch

from g906.arch.config import ModelConfig
from g906.engine.tokenizer import QWEN35_PRETOKENIZE_REGEX, Tokenizer, byte_encoder
from g906.errors import G906Error

log = logging.getLogger(__name__)

PREFIX = "builtin:"
TINY_QWEN35 = "tiny-qwen35"
SEED = 906
NUM_MERGES = 320

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# added but not special (as in Qwen3.5's tokenizer): they stay in decoded text
PLAIN_ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# Training text for the builtin tokenizer (written for g906; any text would do).
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model is a good model for a test.
g906 serves language models on Radeon VII, Radeon Pro VII, Instinct MI50 and MI60 cards.
The doctor checks the driver, the runtime, PyTorch, Triton, rocBLAS and RCCL, one by one,
and it tells you how to fix what it finds. Write a recipe, validate it, then bring it up.
Hello! How are you today? I am fine, thank you. What would you like to talk about?
Let me think about this step by step. First, we read the question. Then we answer it.
The answer is 42. The sum of 17 and 25 is 42, and 6 times 7 is also 42.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.71 -1 +1 = == != <= >= ( ) [ ] { }
def generate(prompt, max_tokens=32):
    tokens = tokenizer.encode(prompt)
    for step in range(max_tokens):
        logits = model(tokens)
        tokens.append(int(logits.argmax()))
    return tokenizer.decode(tokens)

class Recipe:
    model: str
    quant: str = "Q4_K"
    devices: list[int]

{"role": "user", "content": "hi"} {"name": "get_weather", "arguments": {"city": "Paris"}}
The weather in Paris is sunny. The weather in Berlin is cloudy. It is raining in London.
你好，世界！今天天气很好。我们一起学习。模型很小，但是可以测试。
Bonjour le monde. Hola, ¿cómo estás? Grüße aus München. Привет, мир.
Emoji: 🙂 🚀 ✅ — dashes, “quotes”, and ellipses…
"""


def _train_merges(corpus: str, num_merges: int) -> list[tuple[str, str]]:
    """Deterministic byte-level BPE training (most frequent pair; ties -> smallest pair)."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    text = normalizers.NFC().normalize_str(corpus)
    counts: dict[tuple[str, ...], int] = {}
    for piece, _ in pre.pre_tokenize_str(text):
        word = tuple(piece)
        counts[word] = counts.get(word, 0) + 1
    words = [[list(w), c] for w, c in sorted(counts.items())]
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: dict[tuple[str, str], int] = {}
        for syms, c in words:
            for a, b in zip(syms, syms[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        for entry in words:
            syms = entry[0]
            i, out = 0, []
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == best[0] and syms[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            entry[0] = out
    return merges


@lru_cache(maxsize=1)
def _tokenizer_spec() -> tuple[dict[str, int], list[tuple[str, str]]]:
    enc = byte_encoder()
    vocab: dict[str, int] = {enc[b]: b for b in range(256)}
    merges = _train_merges(_CORPUS, NUM_MERGES)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return vocab, merges


def build_tokenizer() -> Tokenizer:
    """The builtin byte-level BPE tokenizer (Qwen3.5 pre-tokenizer, NFC, Qwen special tokens)."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as _Backend
    from tokenizers.models import BPE

    vocab, merges = _tokenizer_spec()
    backend = _Backend(BPE(vocab=dict(vocab), merges=list(merges), dropout=None, unk_token=None,
                           continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                           byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    im_end = backend.token_to_id("<|im_end|>")
    eot = backend.token_to_id("<|endoftext|>")
    return Tokenizer(
        backend,
        eos_token_ids=[im_end, eot],
        bos_token_id=None,
        pad_token_id=eot,
        chat_template=CHAT_TEMPLATE,
        special_tokens_map={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        source=PREFIX + TINY_QWEN35,
    )


# A ChatML template in the Qwen3 style, written for g906. The generation prompt opens a think
# block ("<think>\n"), or an empty one when enable_thinking is false. Tool calls are written in
# Qwen3.5's XML format, the one the architecture's tool parser (qwen3_coder) reads.
CHAT_TEMPLATE = """\
{%- macro text_of(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set sys_first = messages and messages[0].role == 'system' -%}
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if sys_first %}{{- text_of(messages[0].content) + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou can call these functions. Their signatures are inside <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nTo call a function, answer with one block per call:\\n<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}
{%- elif sys_first %}
{{- '<|im_start|>system\\n' + text_of(messages[0].content) + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{- '<|im_start|>system\\n' + text_of(message.content) + '<|im_end|>\\n' }}{%- endif %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\\n' + text_of(message.content) + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}{%- endif %}
{{- text_of(message.content) if message.content is not none else '' }}
{%- for call in (message.tool_calls or []) %}
{%- set fn = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n<function=' + fn.name + '>\\n' }}
{%- if fn.arguments is mapping %}{%- for key, value in fn.arguments | items %}
{{- '<parameter=' + key + '>\\n' + (value | tojson if value is mapping or (value is sequence and value is not string) else value | string) + '\\n</parameter>\\n' }}
{%- endfor %}{%- endif %}
{{- '</function>\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + text_of(message.content) + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- raise_exception('unknown message role: ' + message.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}
{%- endif %}
"""


@lru_cache(maxsize=1)
def _shared_tokenizer() -> Tokenizer:
    return build_tokenizer()


def tiny_qwen35_config() -> ModelConfig:
    tok = _shared_tokenizer()
    tok_size = tok.vocab_size
    vocab = 512
    assert tok_size <= vocab, tok_size
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=10_000_000.0,
        partial_rotary_factor=0.25,
        mrope_section=[2, 1, 1],  # sums to rotary_dim / 2 = 4
        mrope_interleaved=True,
        max_position_embeddings=8192,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_v_head_order="grouped",
        tie_word_embeddings=False,
        num_mtp_layers=0,
        bos_token_id=None,
        eos_token_ids=list(tok.eos_token_ids),
        pad_token_id=tok.pad_token_id,
        architecture="qwen35",
    )


def tiny_qwen35_weights(config: ModelConfig, seed: int = SEED) -> Iterator[tuple[str, torch.Tensor]]:
    """Seeded random float32 weights with HF Qwen3_5ForCausalLM names and shapes."""
    g = torch.Generator().manual_seed(seed)
    c = config
    H, I = c.hidden_size, c.intermediate_size

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) / in_f ** 0.5

    def zc_norm(n: int) -> torch.Tensor:  # zero-centred RMSNorm weight (applied as 1 + w)
        return 0.1 * torch.randn(n, generator=g)

    yield "model.embed_tokens.weight", 0.5 * torch.randn(c.vocab_size, H, generator=g)
    nk, nv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    for i, kind in enumerate(c.layer_types):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", zc_norm(H)
        if kind == "linear_attention":
            conv = 2 * nk * dk + nv * dv
            yield p + "linear_attn.in_proj_qkv.weight", lin(conv, H)
            yield p + "linear_attn.in_proj_z.weight", lin(nv * dv, H)
            yield p + "linear_attn.in_proj_b.weight", lin(nv, H)
            yield p + "linear_attn.in_proj_a.weight", lin(nv, H)
            yield p + "linear_attn.conv1d.weight", 0.5 * torch.randn(conv, 1, c.linear_conv_kernel_dim, generator=g)
            yield p + "linear_attn.dt_bias", 1.0 + 0.1 * torch.randn(nv, generator=g)
            yield p + "linear_attn.A_log", torch.log(1.0 + 15.0 * torch.rand(nv, generator=g))
            yield p + "linear_attn.norm.weight", 1.0 + 0.1 * torch.randn(dv, generator=g)
            yield p + "linear_attn.out_proj.weight", lin(H, nv * dv)
        else:
            nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
            yield p + "self_attn.q_proj.weight", lin(2 * nh * hd, H)
            yield p + "self_attn.k_proj.weight", lin(nkv * hd, H)
            yield p + "self_attn.v_proj.weight", lin(nkv * hd, H)
            yield p + "self_attn.o_proj.weight", lin(H, nh * hd)
            yield p + "self_attn.q_norm.weight", zc_norm(hd)
            yield p + "self_attn.k_norm.weight", zc_norm(hd)
        yield p + "post_attention_layernorm.weight", zc_norm(H)
        yield p + "mlp.gate_proj.weight", lin(I, H)
        yield p + "mlp.up_proj.weight", lin(I, H)
        yield p + "mlp.down_proj.weight", lin(H, I)
    yield "model.norm.weight", zc_norm(H)
    yield "lm_head.weight", lin(c.vocab_size, H)


BUILTINS: dict[str, str] = {
    TINY_QWEN35: "deterministic random-weight Qwen3.5 (4 layers) with a small tokenizer, for smoke tests",
}


def is_builtin(source: str) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def builtin_info(name: str) -> dict[str, Any]:
    key = _key(name)
    return {"name": PREFIX + key, "synthetic": True, "description": BUILTINS[key],
            "note": "random weights: the output is meaningless"}


def _key(name: str) -> str:
    key = name[len(PREFIX):] if name.startswith(PREFIX) else name
    if key not in BUILTINS:
        raise G906Error(f"unknown builtin model {name!r}",
                        hint="available: " + ", ".join(PREFIX + k for k in BUILTINS))
    return key


class BuiltinSource:
    """A builtin model with the loader protocol (config / weights / tokenizer / chat_template)."""

    format = "builtin"

    def __init__(self, name: str):
        self.key = _key(name)
        self.name = PREFIX + self.key
        self.info = builtin_info(self.key)
        log.warning("%s is a SYNTHETIC model with random weights (smoke tests only): its output is "
                    "meaningless", self.name)
        self._config = tiny_qwen35_config()

    def config(self) -> ModelConfig:
        return self._config

    def weights(self, *, progress: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        return tiny_qwen35_weights(self._config)

    def tokenizer(self) -> Tokenizer:
        return _shared_tokenizer()

    def chat_template(self) -> str:
        return CHAT_TEMPLATE


def open_builtin(name: str) -> BuiltinSource:
    return BuiltinSource(name)


def load_builtin(name: str) -> tuple[ModelConfig, Iterator[tuple[str, torch.Tensor]], Tokenizer, str]:
    """(config, weights iterator, tokenizer, chat template source) of a builtin synthetic model."""
    src = BuiltinSource(name)
    return src.config(), src.weights(), src.tokenizer(), src.chat_template()


__all__ = ["BUILTINS", "BuiltinSource", "CHAT_TEMPLATE", "open_builtin", "builtin_info", "build_tokenizer", "is_builtin", "load_builtin",
           "tiny_qwen35_config", "tiny_qwen35_weights"]
