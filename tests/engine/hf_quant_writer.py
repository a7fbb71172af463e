"""Quantized Hugging Face checkpoints of a tiny transformers model, written by the tests' own code
from the formats' specifications (the real tools, gptqmodel / llm-compressor / AutoAWQ, are not
installed here):

  GPTQ    qweight int32 [K / P, N] packed along the input features (value of feature k in bits
          (k % P) * b of word k // P), qzeros int32 [G, N / P] packed along the outputs, scales
          [G, N] fp16, g_idx [K]; v1 stores zero - 1, v2 the zero itself.
  AWQ     (GEMM) qweight int32 [K, N / 8] and qzeros [G, N / 8], packed along the outputs with
          column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i] in slot i of word c; scales [G, N].
  compressed-tensors (pack-quantized) weight_packed int32 [N, K / P] (values + 2^(b-1)),
          weight_scale [N, G], weight_zero_point int32 [N / P, G] (offset, packed along N),
          weight_shape, weight_g_idx.

write_quantized(model, dir, fmt, ...) quantizes every projection the config quantizes, replaces
the model's weights by their dequantized values (the reference transformers then runs), saves
config.json (with its quantization_config) and model.safetensors with the packed tensors.

MoE (qwen3_5_moe): transformers holds the routed experts fused (mlp.experts.gate_up_proj
[E, 2I, H], mlp.experts.down_proj [E, H, I]); the quantizers (gptqmodel, AutoAWQ,
llm-compressor) write them as the Hub checkpoints name them, one module per expert:
mlp.experts.<e>.{gate,up,down}_proj.<part>. The router (mlp.gate) and the shared expert's gate
are not projections of PROJ: they stay 16-bit, as in Qwen's own GPTQ releases."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

PROJ = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|in_proj_qkv|in_proj_z|in_proj_b|in_proj_a|out_proj|"
                  r"gate_proj|up_proj|down_proj)$")


def quantize(w: torch.Tensor, bits: int, gs: int, sym: bool, act_order: bool, seed: int):
    """(q [N, K] ints, scales [N, G] fp16, zeros [N, G] ints, g_idx [K]) of w [N, K], and the
    dequantized weight (q - z) * s. act_order: groups are runs of a random feature order."""
    N, K = w.shape
    gs = K if gs == -1 else gs
    G = K // gs
    order = torch.randperm(K, generator=torch.Generator().manual_seed(seed)) if act_order else torch.arange(K)
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[order] = (torch.arange(K) // gs).to(torch.int32)
    qmax = (1 << bits) - 1
    q = torch.empty(N, K, dtype=torch.int64)
    scales = torch.empty(N, G, dtype=torch.float16)
    zeros = torch.empty(N, G, dtype=torch.int64)
    for g in range(G):
        cols = order[g * gs:(g + 1) * gs]
        blk = w[:, cols].float()
        if sym:
            s = (blk.abs().amax(1) / (qmax / 2)).clamp_min(1e-6).half()
            z = torch.full((N,), 1 << (bits - 1), dtype=torch.int64)
        else:
            lo, hi = blk.amin(1).clamp(max=0), blk.amax(1).clamp(min=0)
            s = ((hi - lo) / qmax).clamp_min(1e-6).half()
            z = torch.round(-lo / s.float()).clamp(0, qmax).to(torch.int64)
        scales[:, g], zeros[:, g] = s, z
        q[:, cols] = torch.round(blk / s.float()[:, None] + z[:, None]).clamp(0, qmax).to(torch.int64)
    deq = (q - zeros[:, g_idx.long()]).float() * scales.float()[:, g_idx.long()]
    return q, scales, zeros, g_idx, deq


def _pack(values: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """Pack along the last dim: slot i of word c holds element c * P + order[i]."""
    per = 32 // bits
    order = list(order or range(per))
    R, C = values.shape
    v = values.to(torch.int64).view(R, C // per, per)
    word = torch.zeros(R, C // per, dtype=torch.int64)
    for i in range(per):
        word |= (v[:, :, order[i]] & ((1 << bits) - 1)) << (i * bits)
    return torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)


def gptq_tensors(q, scales, zeros, g_idx, bits, v2: bool) -> dict[str, torch.Tensor]:
    stored = zeros if v2 else zeros - 1                   # v1 stores zero - 1 (wraps in its word)
    return {"qweight": _pack(q, bits).t().contiguous(),                        # packed along K
            "qzeros": _pack(stored.t().contiguous(), bits),
            "scales": scales.t().contiguous(), "g_idx": g_idx}


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_tensors(q, scales, zeros) -> dict[str, torch.Tensor]:
    return {"qweight": _pack(q.t().contiguous(), 4, AWQ_ORDER),
            "qzeros": _pack(zeros.t().contiguous(), 4, AWQ_ORDER),
            "scales": scales.t().contiguous()}


def ct_tensors(q, scales, zeros, g_idx, bits, sym, act_order) -> dict[str, torch.Tensor]:
    N, K = q.shape
    out = {"weight_packed": _pack(q, bits), "weight_scale": scales.contiguous(),
           "weight_shape": torch.tensor([N, K], dtype=torch.int64)}
    if not sym:
        # signed zero point + offset = the unsigned code, packed along the outputs
        out["weight_zero_point"] = _pack(zeros.t().contiguous(), bits).t().contiguous()
    if act_order:
        out["weight_g_idx"] = g_idx
    return out


def write_quantized(model, d: Path, fmt: str, quant_config: dict, *, scheme_for, seed: int = 0) -> dict:
    """Quantize model in place (its projections replaced by their dequantized values) and write
    d/config.json + d/model.safetensors. scheme_for(module) -> (bits, gs, sym, act_order) or None
    (left in 16 bit). fmt: gptq | gptq_v2 | awq | ct. Returns {module: scheme} of what was
    quantized."""
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d)           # config.json and the fp32 tensors, replaced below
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    done = {}

    def put(module: str, w: torch.Tensor, seed_i: int) -> torch.Tensor:
        """Quantize one module's weight into sd (or store it 16-bit); its dequantized value."""
        sch = scheme_for(module)
        if sch is None:
            sd[f"{module}.weight"] = w.detach().clone().contiguous()
            return w
        bits, gs, sym, act = sch
        q, s, z, g_idx, deq = quantize(w, bits, gs, sym, act, seed_i)
        if fmt in ("gptq", "gptq_v2"):
            parts = gptq_tensors(q, s, z, g_idx, bits, v2=fmt == "gptq_v2")
        elif fmt == "awq":
            parts = awq_tensors(q, s, z if not sym else torch.full_like(z, 8))
        else:
            parts = ct_tensors(q, s, z, g_idx, bits, sym, act)
        for k, v in parts.items():
            sd[f"{module}.{k}"] = v
        done[module] = sch
        return deq

    with torch.no_grad():
        for i, (name, p) in enumerate(list(model.named_parameters())):
            if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                del sd[name]
                base = name.rsplit(".", 1)[0]
                for e in range(p.shape[0]):
                    if name.endswith("down_proj"):
                        p[e] = put(f"{base}.{e}.down_proj", p[e], seed + 7919 * i + e)
                    else:
                        half = p.shape[1] // 2
                        p[e, :half] = put(f"{base}.{e}.gate_proj", p[e, :half], seed + 7919 * i + 2 * e)
                        p[e, half:] = put(f"{base}.{e}.up_proj", p[e, half:], seed + 7919 * i + 2 * e + 1)
                continue
            if not name.endswith(".weight") or not PROJ.search(name[:-7]):
                continue
            module = name[:-7]
            if scheme_for(module) is None:
                continue
            del sd[name]
            p.copy_(put(module, p.data, seed + i))
    for f in d.glob("*.safetensors"):
        f.unlink()
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = quant_config
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return done
