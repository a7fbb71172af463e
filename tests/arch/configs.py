"""A small ModelConfig for the registry's tests (no torch)."""

from __future__ import annotations

from g906.arch.config import ModelConfig


def tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
    base.update(kw)
    return ModelConfig(**base)
