"""builtin:tiny-qwen35: deterministic, shaped like transformers' Qwen3_5ForCausalLM, says it is
synthetic, and its tokenizer / template have what the server relies on."""

from __future__ import annotations

import logging

import pytest
import torch

from g906.engine.builtin import CHAT_TEMPLATE, builtin_info, build_tokenizer, load_builtin, open_builtin
from g906.engine.chat_template import ChatTemplate
from g906.engine.tokenizer import IncrementalDetokenizer
from g906.errors import G906Error


def test_deterministic_and_synthetic(caplog):
    with caplog.at_level(logging.WARNING, logger="g906.engine.builtin"):
        cfg, weights, tok, template = load_builtin("builtin:tiny-qwen35")
    assert "SYNTHETIC" in caplog.text
    a = dict(weights)
    b = dict(load_builtin("tiny-qwen35")[1])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert builtin_info("builtin:tiny-qwen35")["synthetic"] is True
    assert open_builtin("builtin:tiny-qwen35").info["synthetic"] is True
    assert template == CHAT_TEMPLATE
    assert build_tokenizer().encode("Hello world") == tok.encode("Hello world")


def test_config_shape():
    cfg = load_builtin("builtin:tiny-qwen35")[0]
    assert cfg.num_hidden_layers == 4
    assert cfg.layer_types.count("linear_attention") == 3 and cfg.layer_types[3] == "full_attention"
    assert cfg.linear_num_value_heads > cfg.linear_num_key_heads
    assert sum(cfg.mrope_section) == cfg.rotary_dim // 2


def test_weights_match_transformers_state_dict():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg, weights, _, _ = load_builtin("builtin:tiny-qwen35")
    hf_cfg = Qwen3_5TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        linear_num_key_heads=cfg.linear_num_key_heads, linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim, linear_value_head_dim=cfg.linear_value_head_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel_dim, layer_types=cfg.layer_types,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    hf = Qwen3_5ForCausalLM(hf_cfg)
    ref = {k: v.shape for k, v in hf.state_dict().items()}
    got = {k: v.shape for k, v in weights}
    assert got == ref
    hf.load_state_dict(dict(load_builtin("builtin:tiny-qwen35")[1]))  # loads cleanly


def test_tokenizer_and_template():
    tok = build_tokenizer()
    for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        assert tok.token_to_id(t) is not None, t
    assert tok.eos_token_ids[0] == tok.token_to_id("<|im_end|>")
    assert tok.vocab_size <= load_builtin("builtin:tiny-qwen35")[0].vocab_size
    text = "Hello, 世界! 🙂 def f(x): return x"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    d = IncrementalDetokenizer(tok)
    assert d.add_many(ids) + d.finish() == text
    prompt = ChatTemplate(CHAT_TEMPLATE, special_tokens=tok.special_tokens_map).render(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    ids = tok.encode(prompt)
    assert tok.token_to_id("<think>") == ids[-2]  # "<think>" then "\n"


def test_unknown_builtin():
    with pytest.raises(G906Error, match="unknown builtin model"):
        load_builtin("builtin:huge-qwen")


def test_runs_through_the_engine_loader():
    from g906.engine.loader import load_model

    lm = load_model("builtin:tiny-qwen35", device="cpu", dtype="float32", progress=False)
    assert lm.info.get("synthetic") is True
    assert lm.tokenizer is not None and lm.chat_template == CHAT_TEMPLATE
