"""Tiny models for speculative-decoding tests, saved with an MTP block.

markov_mtp_dir(): a tiny Qwen3.5 whose next token depends mostly on the current one (every
mixer, MLP and MTP-layer output projection scaled by 0.1, so the context still matters a
little and the linear-attention state still feeds the logits) with an MTP block built to
predict the token after next: fc passes the embedding half through, its pre-fc embedding norm is
a plain RMSNorm and its final norm is the target's, so MTP(x_{i+1}) ~ target(x_{i+1}) ~ x_{i+2}.
Drafts are then often, not always, right: every acceptance length shows up. The directory
carries the test tokenizer; write_gguf(dir, ..., mtp_layers=1) converts it with that MTP block."""

from __future__ import annotations

from pathlib import Path

import torch

from .conftest import build_tiny_qwen35, tiny_text_config_kwargs
from .gguf_writer import random_mtp_tensors
from .qwen_tokenizer import save_hf_tokenizer

MARKOV_EOS = 442          # the test tokenizer's <|im_end|>
_SCALED = ("o_proj.weight", "out_proj.weight", "down_proj.weight")


def markov_mtp_dir(d: Path, *, seed: int = 3, scale: float = 0.1, eos_token_id: int | None = None) -> Path:
    """eos_token_id: the model's end token (default: the tiny models' last id, which the test
    tokenizer lacks; structured outputs need one it has, e.g. MARKOV_EOS)."""
    from safetensors.torch import load_file, save_file

    extra = {} if eos_token_id is None else {"eos_token_id": eos_token_id}
    m = build_tiny_qwen35(seed=seed, mtp_num_hidden_layers=1, **extra)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(_SCALED):
                p.mul_(scale)
    m.save_pretrained(d)
    save_hf_tokenizer(d)
    hp = tiny_text_config_kwargs()
    H = hp["hidden_size"]
    mtp = random_mtp_tensors(hp, 1, seed=seed + 11)
    mtp["mtp.fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1)
    mtp["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(H)          # zero-centred: weight 1
    mtp["mtp.norm.weight"] = m.model.norm.weight.detach().clone()
    for k in list(mtp):
        if k.endswith(_SCALED):
            mtp[k] = mtp[k] * scale
    f = d / "model.safetensors"
    sd = load_file(str(f))
    sd.update({k: v.contiguous() for k, v in mtp.items()})
    save_file(sd, str(f), metadata={"format": "pt"})
    return d
