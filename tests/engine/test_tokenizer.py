"""Tokenizer: ids identical to transformers' tokenizer on a multilingual corpus, from
tokenizer.json and rebuilt from GGUF metadata (Qwen2 and Qwen3.5 pre-tokenizers); incremental
detokenization never shows U+FFFD mid-stream and adds up to decode()."""

from __future__ import annotations

import pytest

from g906.engine.loaders.gguf import GGUFModelFile
from g906.engine.sources import load_tokenizer
from g906.engine.tokenizer import IncrementalDetokenizer, Tokenizer
from g906.errors import G906Error

from .gguf_writer import write_gguf
from .qwen_tokenizer import CORPUS, qwen2_tokenizer_dir, qwen_tokenizer_dir  # noqa: F401 - fixtures

PRES = ["qwen35", "qwen2"]


@pytest.fixture(scope="module")
def tok_dirs(qwen_tokenizer_dir, qwen2_tokenizer_dir):  # noqa: F811
    return {"qwen35": qwen_tokenizer_dir, "qwen2": qwen2_tokenizer_dir}


@pytest.fixture(scope="module")
def hf_toks(tok_dirs):
    from transformers import AutoTokenizer

    return {k: AutoTokenizer.from_pretrained(str(d)) for k, d in tok_dirs.items()}


@pytest.fixture(scope="module")
def gguf_toks(tok_dirs, tiny_qwen35_hf_model, tmp_path_factory):
    out = {}
    for pre, d in tok_dirs.items():
        path = tmp_path_factory.mktemp(f"tok-gguf-{pre}") / "t.gguf"
        write_gguf(tiny_qwen35_hf_model, path, tokenizer_dir=d, tokenizer_pre=pre)
        out[pre] = GGUFModelFile.open(path)
    return out


def _pairs(text: str) -> list[str]:
    return [text, text.upper(), " " + text, text + "\n"]


def _assert_encodes_and_decodes_like(ours, ref):
    """Every corpus text (and its pairs): the same ids as transformers, and the same text back."""
    for text in CORPUS:
        for t in _pairs(text):
            assert ours.encode(t) == ref.encode(t, add_special_tokens=False), repr(t)
            ids = ours.encode(t)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("pre", PRES)
def test_tokenizer_json_ids_match_transformers(tok_dirs, hf_toks, pre):
    ours = Tokenizer.from_hf_dir(tok_dirs[pre])
    ref = hf_toks[pre]
    _assert_encodes_and_decodes_like(ours, ref)
    assert ours.vocab_size == len(ref)


@pytest.mark.parametrize("pre", PRES)
def test_gguf_rebuilt_ids_match_transformers(gguf_toks, hf_toks, pre):
    f = gguf_toks[pre]
    assert f.metadata["tokenizer.ggml.pre"] == pre
    ours = f.tokenizer()
    ref = hf_toks[pre]
    _assert_encodes_and_decodes_like(ours, ref)


def test_the_two_regexes_differ_on_combining_marks(gguf_toks, hf_toks):
    # "\u0301" alone (no precomposed form after NFC) is a letter mark: Qwen3.5 keeps it in the word
    t = "x\u0301y\u0327z"
    for pre in PRES:
        assert gguf_toks[pre].tokenizer().encode(t) == hf_toks[pre].encode(t, add_special_tokens=False)


def test_special_tokens_and_ids(tok_dirs, gguf_toks):
    for tok in (Tokenizer.from_hf_dir(tok_dirs["qwen35"]), gguf_toks["qwen35"].tokenizer()):
        im_end = tok.token_to_id("<|im_end|>")
        assert tok.eos_token_ids[0] == im_end
        assert tok.pad_token_id == tok.token_to_id("<|endoftext|>")
        assert tok.is_special(im_end) and tok.is_special(tok.token_to_id("<|im_start|>"))
        assert not tok.is_special(tok.token_to_id("<think>"))  # added, not special (as in Qwen3.5)
        ids = tok.encode("<|im_start|>assistant\n<think>\nhm</think>ok<|im_end|>")
        assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == im_end
        assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhm</think>ok"
        assert tok.special_tokens_map["eos_token"] == "<|im_end|>"
    g = gguf_toks["qwen35"]
    tok = g.tokenizer()
    assert tok.eos_token_ids == [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    assert g.config().eos_token_ids == tok.eos_token_ids
    types = g.metadata["tokenizer.ggml.token_type"]
    tokens = g.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == 512 and tokens[-1] == "[PAD511]" and types[-1] == 5
    assert types[tokens.index("<|im_end|>")] == 3 and types[tokens.index("<think>")] == 4


# ------------------------------------------------------------------------------------------ streaming

STREAM_TEXTS = [
    "emoji 😀🚀🎉 and 👨‍👩‍👧 family",
    "中文流式输出测试，没有乱码。",
    "mixed Ünïcödé e\u0301 and 日本語 🙂!",
    "<|im_start|>assistant\n<think>\n推理</think>答案 🚀<|im_end|>",
]


def _stream(tok: Tokenizer, ids: list[int], skip: bool) -> list[str]:
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    parts = [d.add(i) for i in ids]
    parts.append(d.finish())
    return parts


@pytest.mark.parametrize("source", ["hf", "gguf", "builtin"])
@pytest.mark.parametrize("skip", [True, False])
def test_incremental_detokenizer(tok_dirs, gguf_toks, source, skip):
    from g906.engine.builtin import build_tokenizer

    tok = {"hf": lambda: Tokenizer.from_hf_dir(tok_dirs["qwen35"]), "gguf": lambda: gguf_toks["qwen35"].tokenizer(),
           "builtin": build_tokenizer}[source]()
    split_seen = False
    for text in STREAM_TEXTS:
        ids = tok.encode(text)
        parts = _stream(tok, ids, skip)
        assert "".join(parts) == tok.decode(ids, skip_special_tokens=skip)
        assert not any("\ufffd" in p for p in parts), parts
        split_seen |= any(p == "" for p in parts[:-1])
    assert split_seen  # some characters really were split across tokens


def test_incremental_detokenizer_single_bytes(tok_dirs):
    """Byte-by-byte tokens (the worst case for multi-byte characters), and invalid bytes that
    only become U+FFFD once it is certain they never complete a character."""
    from g906.engine.tokenizer import byte_encoder

    tok = Tokenizer.from_hf_dir(tok_dirs["qwen35"])
    enc = byte_encoder()
    text = "ab😀中é"
    ids = [tok.token_to_id(enc[b]) for b in text.encode("utf-8")]
    parts = _stream(tok, ids, True)
    assert "".join(parts) == text and not any("\ufffd" in p for p in parts)
    bad = [tok.token_to_id(enc[b]) for b in b"x\xf0\x9f"]  # a truncated 4-byte sequence at the end
    parts = _stream(tok, bad, True)
    assert parts[:-1] == ["x", "", ""] and parts[-1] == "\ufffd"
    assert "".join(parts) == tok.decode(bad)


def test_generic_detokenizer_mode(tok_dirs):
    tok = Tokenizer.from_hf_dir(tok_dirs["qwen35"])
    tok.byte_level = False  # the fallback used for tokenizers that are not byte-level BPE
    for text in STREAM_TEXTS:
        ids = tok.encode(text)
        parts = _stream(tok, ids, True)
        assert "".join(parts) == tok.decode(ids, skip_special_tokens=True)
        assert not any("\ufffd" in p for p in parts)


# ------------------------------------------------------------------------------------------ errors


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(G906Error, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    with pytest.raises(G906Error, match="not supported"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(G906Error, match="pre-tokenizer 'falcon'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "falcon",
                                      "tokenizer.ggml.tokens": ["a"]})
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(G906Error, match="cannot load"):
        load_tokenizer(bad)
