"""Tiny models for speculative-decoding tests, saved with an MTP block.

markov_mtp_dir(): a tiny Qwen3.5 whose next token depends mostly on the current one (every
mixer, MLP and MTP-layer output projection scaled by 0.1, so the context still matters a
little and the linear-attention state still feeds the logits) with an MTP block built to
predict the token after next: fc passes the embedding half through, its pre-fc embedding norm is
a plain RMSNorm and its final norm is the target's, so MTP(x_{i+1}) ~ target(x_{i+1}) ~ x_{i+2}.
Drafts are then often, not always, right: every acceptance length shows up. The directory
carries the test tokenizer; write_gguf(dir, ..., mtp_layers=1) converts it with that MTP block.

load_random_tiny(): a fully random tiny model (no MTP). run() / drive(): the speculative tests'
engine runs, token ids per prompt, with no KV block or state slot left behind. chi_square() /
chi2_sf(): the sampling tests' goodness of fit against an exact distribution."""

from __future__ import annotations

from pathlib import Path

import torch

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.loader import load_model

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


def load_mtp(d: Path):
    """The model of d in float32 on the CPU with its MTP block."""
    return load_model(str(d), dtype="float32", device="cpu", progress=False, keep_mtp=True)


def load_random_tiny(d: Path):
    """A fully random model (no MTP), saved in d and loaded: every layer's state matters for
    every logit."""
    build_tiny_qwen35(seed=0).save_pretrained(d)
    save_hf_tokenizer(d)
    return load_model(str(d), dtype="float32", device="cpu", progress=False)


def drive(eng, prompts, params) -> list[list[int]]:
    """Token ids per prompt, all requests in eng at once (params: one for all, or one each)."""
    ps = params if isinstance(params, list) else [params] * len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, ps)):
        eng.add_request(f"r{i}", p, sp)
    out = {f"r{i}": [] for i in range(len(prompts))}
    while eng.has_unfinished_requests():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
    assert eng.cache.blocks.num_used_blocks == 0 and eng.cache.slots.num_used == 0
    return [out[f"r{i}"] for i in range(len(prompts))]


def run(loaded, prompts, params, spec=None, **cfg):
    """Token ids per prompt (all requests in one engine, batched), and the engine."""
    kw = dict(num_kv_blocks=96, max_model_len=512, max_num_batched_tokens=16)
    kw.update(cfg)
    eng = LLMEngine(loaded, EngineConfig(speculative=spec, **kw))
    return drive(eng, prompts, params), eng


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with dof degrees of freedom."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(x / 2.0, dtype=torch.float64)))


def chi_square(got: list[list[int]], exact: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic of the n outputs got against exact (token tuple -> probability), and
    its number of cells: outputs expected fewer than 5 times are pooled into one cell (the
    chi-square approximation needs 5 expected). Every output must be one exact gives."""
    counts: dict = {}
    for toks in got:
        counts[tuple(toks)] = counts.get(tuple(toks), 0) + 1
    assert set(counts) <= set(exact), set(counts) - set(exact)
    small = [c for c in exact if exact[c] * n < 5]
    cells = [[c] for c in exact if c not in small] + ([small] if small else [])
    stat = 0.0
    for cell in cells:
        e = n * sum(exact[c] for c in cell)
        o = sum(counts.get(c, 0) for c in cell)
        stat += (o - e) ** 2 / e
    return stat, len(cells)
