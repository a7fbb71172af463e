"""Test helper: a small Qwen-like tokenizer trained in the test (byte-level BPE, Qwen2 or Qwen3.5
pre-tokenizer regex, NFC, Qwen's special tokens appended after the BPE vocabulary), saved as an
HF tokenizer directory with a chat template, plus the multilingual corpus the tests use."""

from __future__ import annotations

from pathlib import Path

import pytest

from g906.engine.tokenizer import QWEN2_PRETOKENIZE_REGEX, QWEN35_PRETOKENIZE_REGEX

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. It's a test; we'll see what they've done.
Machine learning models are trained on large corpora of text and code.
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }
大型语言模型可以理解和生成自然语言。今天天气很好，我们去公园散步吧。
日本語のテキストも少し含めます。こんにちは世界。
Ceci est une phrase en français. Das ist ein deutscher Satz. Это предложение на русском.
Emoji are fun: 😀 😃 🚀 🎉 👍🏽 👨‍👩‍👧 ❤️ and numbers 1234567890 3.14159.
"""

# The corpus the tokenizer tests encode: English, Chinese, code, emoji, whitespace runs, and a
# few traps (combining marks, CRLF, special-token strings, contractions, long digit runs).
CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine; we've seen THEY'RE and I'D.",
    "大型语言模型可以理解和生成自然语言。",
    "混合 text 和中文，with punctuation！？",
    "こんにちは、世界。",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "emoji: 😀🚀🎉 👍🏽 👨‍👩‍👧 ❤️",
    "   leading spaces and trailing spaces   ",
    "tabs\t\tand\nnewlines\n\n\nand\r\nCRLF\r\n",
    "          ",
    "\n\n\n",
    "numbers 1234567890 and 3.14159 and 1,000,000",
    "combining: e\u0301 cafe\u0301 n\u0303 (NFC matters)",
    "Ünïcödé wörds: naïve façade coöperate",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nhello<|im_end|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "Ελληνικά και العربية و עברית",
    "",
]

# A Qwen3-style template written for these tests (system, tools, reasoning, enable_thinking).
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'system' %}{%- continue %}{%- endif %}
{%- if m.role == 'user' %}
{{- '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}
{%- elif m.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if m.reasoning_content and loop.index0 > ns.last_user %}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}
{{- m.content or '' }}
{%- for tc in m.tool_calls or [] %}
{{- '\\n<tool_call>\\n' + {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson + '\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif m.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- raise_exception('Unexpected role: ' + m.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""


def train_backend(pre: str = "qwen35", vocab_size: int = 440):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    regex = {"qwen2": QWEN2_PRETOKENIZE_REGEX, "qwen35": QWEN35_PRETOKENIZE_REGEX}[pre]
    tk = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                       byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([TRAIN_TEXT] * 3, trainer=trainer)
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED])
    return tk


def save_hf_tokenizer(directory: Path, pre: str = "qwen35") -> Path:
    from transformers import PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=train_backend(pre), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token=None, bos_token=None)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory) -> Path:
    return save_hf_tokenizer(tmp_path_factory.mktemp("qwen35-tokenizer"), "qwen35")


@pytest.fixture(scope="session")
def qwen2_tokenizer_dir(tmp_path_factory) -> Path:
    return save_hf_tokenizer(tmp_path_factory.mktemp("qwen2-tokenizer"), "qwen2")
