"""Hugging Face transformers on the same random model, for the side-by-side ratio.

    hf = build_hf_model(config, device="cuda", dtype=torch.float16, seed=906)   # synthetic weights
    figures = hf_generate_bench(hf, prompt_len=512, new_tokens=32)

The weights are the synthetic builder's (same names, same seed, same device kind, so the same
values as the g906 model); transformers' own Qwen3_5ForCausalLM computes with them (its fast path
uses flash-linear-attention's kernels when that package is installed; `fast_path` says whether).
Dense weights only: transformers cannot run GGUF-quantized blocks."""

from __future__ import annotations

import time

import torch

from g906.arch.config import ModelConfig


def hf_text_config(config: ModelConfig):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim, linear_num_key_heads=config.linear_num_key_heads,
        linear_num_value_heads=config.linear_num_value_heads, linear_key_head_dim=config.linear_key_head_dim,
        linear_value_head_dim=config.linear_value_head_dim, linear_conv_kernel_dim=config.linear_conv_kernel_dim,
        layer_types=list(config.layer_types),
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta,
                         "partial_rotary_factor": config.partial_rotary_factor},
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings, eos_token_id=None, bos_token_id=None, pad_token_id=0,
    )


def fast_path_available() -> bool:
    try:
        import fla  # noqa: F401
    except Exception:
        return False
    return True


@torch.no_grad()
def build_hf_model(config: ModelConfig, *, device="cuda", dtype: torch.dtype = torch.float16, seed: int = 906):
    """transformers' Qwen3_5ForCausalLM with the synthetic builder's dense weights."""
    from transformers import Qwen3_5ForCausalLM

    from g906.engine.synthetic import synthetic_weights

    dev = torch.device(device)
    cfg = hf_text_config(config)
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(cfg)
    model = model.to_empty(device=dev).to(dtype)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    for name, t in synthetic_weights(config, quant="f16", dtype=dtype, device=dev, seed=seed):
        target = params.get(name)
        if target is None:
            target = buffers.get(name)
        if target is None:
            continue
        target.copy_(t.reshape(target.shape).to(target.dtype))
        del t
    # non-persistent buffers (the rotary inv_freq) were left empty by to_empty: rebuild them
    for parent in model.modules():
        for child_name, child in list(parent.named_children()):
            if hasattr(child, "inv_freq"):
                with torch.device(dev):
                    setattr(parent, child_name, type(child)(config=cfg))
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@torch.no_grad()
def hf_generate_bench(model, *, prompt_len: int, new_tokens: int, batch: int = 1, seed: int = 0) -> dict:
    """Prefill tok/s (prompt over the time to the first token) and decode tok/s (per sequence)
    of model.generate, greedy, no early stop."""
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(vocab // 8, vocab, (batch, prompt_len), generator=g).to(dev)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def timed(n: int) -> float:
        _sync(dev)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        _sync(dev)
        return time.perf_counter() - t0

    timed(2)                                   # warm-up (kernel compilation, caches)
    t1 = timed(1)
    tn = timed(new_tokens)
    decode = (new_tokens - 1) / max(tn - t1, 1e-9)
    return {"prefill_tok_s": round(batch * prompt_len / t1, 2), "decode_tok_s": round(decode, 2),
            "output_tok_s": round(batch * decode, 2), "prompt_len": prompt_len, "new_tokens": new_tokens,
            "batch": batch, "fast_path": fast_path_available()}
