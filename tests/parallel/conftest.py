"""Tensor-parallel fixtures: one tiny random Qwen3.5 (transformers, fp32) saved as an HF
directory and converted to GGUF F32 and Q8_0 the way llama.cpp's converter does (tiled V heads).

The tiny model is tests/engine's with linear_value_head_dim = 32, so that a rank's share of
out_proj's input features (whole value heads) falls on whole Q8_0 blocks (32 values)."""

from __future__ import annotations

import pytest

from tests.engine.conftest import (TinyRunner, build_tiny_qwen35, hf_greedy, hf_logits, random_prompt, rel_err,
                                   torch_one_thread)  # noqa: F401 - fixture

TINY_OVERRIDES = dict(linear_value_head_dim=32)


def assert_tp_matches_tp1_and_hf(ref, tp, hf) -> None:
    """The TP=2 model's logits equal one device's (1e-5) and transformers' (1e-4) for a one-token
    and a 27-token prompt, and its greedy continuation is transformers'."""
    r1, r2 = TinyRunner(ref.model, max_seqs=1, max_len=96), TinyRunner(tp.model, max_seqs=1, max_len=96)
    for n, seed in ((1, 5), (27, 6)):
        p = random_prompt(n, seed)
        r1.release(0)
        r2.release(0)
        a, b = r1.step([0], [p]), r2.step([0], [p])
        assert rel_err(b, a) < 1e-5
        assert rel_err(b[0], hf_logits(hf, p)[-1]) < 1e-4
    p = random_prompt(11, 7)
    assert r2.greedy(0, p, 8) == hf_greedy(hf, p, 8)


@pytest.fixture(autouse=True, scope="module")
def _one_thread(request):
    """Tiny tensors: one intra-op thread per process (the workers copy rank 0's count)."""
    request.getfixturevalue("torch_one_thread")


@pytest.fixture(scope="session")
def tp_hf_model():
    return build_tiny_qwen35(seed=3, **TINY_OVERRIDES)


@pytest.fixture(scope="session")
def tp_sources(tp_hf_model, tmp_path_factory):
    """{"hf": dir, "gguf-f32": file, "gguf-q8_0": file} of the same weights, and "hf-tied-509":
    a model with a tied LM head and a vocabulary of 509 (odd: the ranks' shares differ)."""
    from tests.engine.gguf_writer import write_gguf

    d = tmp_path_factory.mktemp("tp-models")
    tp_hf_model.save_pretrained(d / "hf")
    build_tiny_qwen35(seed=4, tie_word_embeddings=True, vocab_size=509, eos_token_id=508).save_pretrained(d / "tied")
    return {
        "hf": str(d / "hf"),
        "hf-tied-509": str(d / "tied"),
        "gguf-f32": str(write_gguf(tp_hf_model, d / "tiny-F32.gguf", qtype="F32")[0]),
        "gguf-q8_0": str(write_gguf(tp_hf_model, d / "tiny-Q8_0.gguf", qtype="Q8_0", strict=True)[0]),
    }
