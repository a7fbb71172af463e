"""Test helper: write GGUF files from a tiny Hugging Face Qwen3.5 model the way llama.cpp's
convert_hf_to_gguf.py does (conventions documented in docs/engine-gguf.md), then quantize
2-D weights to any g906-supported type.

    paths = write_gguf(hf_dir_or_model, tmp_path / "m.gguf", qtype="Q4_K", tokenizer_dir=tok_dir,
                       mtp_layers=1, split_max_tensors=20)

What the converter does and this helper reproduces:
- HF names -> GGUF names with gguf-py's tensor map for arch qwen35 (model.language_model.* read as
  model.*, vision tensors dropped);
- every "*norm.weight" gets +1 except linear_attn.norm.weight; A_log -> ssm_a = -exp(A_log);
  dt_bias -> ssm_dt.bias; conv1d squeezed to [C, K];
- V heads reordered grouped -> tiled (value heads > key heads) in in_proj_qkv (V rows), in_proj_z,
  in_proj_a, in_proj_b, A_log, dt_bias, conv1d (V channels), out_proj (columns);
- MTP: HF mtp.* (the source's, else random_mtp_tensors) appended as blocks L.. (mtp.fc -> nextn.eh_proj, pre_fc_norm_embedding -> enorm,
  pre_fc_norm_hidden -> hnorm, norm -> shared_head_norm; renamed BEFORE the +1 rule, so those
  norms get +1 too), block_count includes them and nextn_predict_layers is written;
- 1-D tensors, *_norm.weight and ssm_conv1d stay F32; other tensors take the requested type,
  falling back (F16 for non-quantizable rows, like the converter; Q8_0 like llama-quantize when a
  row is not a whole number of 256-element super-blocks) unless strict=True;
- vocab like get_vocab_base(): tokens padded to vocab_size with [PADi] (UNUSED), added tokens
  CONTROL (special) or USER_DEFINED, merges/special ids/chat template via gguf.SpecialVocab.

The K-quant and IQ4 quantizers here are simple but valid (checked against gguf.quants.dequantize
in tests/engine/test_quant_dequant.py); the gguf package quantizes Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/BF16.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

QK_K = 256
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# quantizers (numpy, [rows, cols] float32 -> [rows, row_bytes] uint8)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _f16_round(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0.0, a / np.where(b == 0, 1.0, b)).astype(np.float32)


def _pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[n, 8] 6-bit scales and mins -> [n, 12] bytes (Q4_K/Q5_K layout)."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return out


def _affine_k(blocks: np.ndarray, n_sub: int, qmax: int, scale_bits: int):
    """Shared Q2_K/Q4_K/Q5_K step: x ~ d*sc*q - dmin*m with q in [0, qmax]."""
    n = blocks.shape[0]
    x = blocks.reshape(n, n_sub, -1)
    mn = np.minimum(x.min(axis=-1), 0.0)
    mx = x.max(axis=-1)
    scale = (mx - mn) / qmax
    mins = -mn
    smax = (1 << scale_bits) - 1
    d = _f16_round(scale.max(axis=-1) / smax)
    dmin = _f16_round(mins.max(axis=-1) / smax)
    sc = np.clip(np.round(_safe_div(scale, d[:, None])), 0, smax)
    mq = np.clip(np.round(_safe_div(mins, dmin[:, None])), 0, smax)
    eff_d = (d[:, None] * sc)[..., None]
    eff_m = (dmin[:, None] * mq)[..., None]
    q = np.clip(np.round(_safe_div(x + eff_m, np.broadcast_to(eff_d, x.shape))), 0, qmax).astype(np.uint8)
    return d, dmin, sc, mq, q


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin, sc, mq, q = _affine_k(blocks, 8, 15, 6)  # q [n, 8, 32]
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(sc, mq), qs], axis=1)


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin, sc, mq, q = _affine_k(blocks, 8, 31, 6)
    lo = q & 0x0F
    qs = (lo[:, 0::2, :] | (lo[:, 1::2, :] << 4)).reshape(n, 128)
    hi = (q >> 4) & 1  # [n, 8, 32]
    qh = np.zeros((n, 32), dtype=np.uint8)
    for s in range(8):
        qh |= (hi[:, s, :] << s).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(sc, mq), qh, qs], axis=1)


def _pack_2bit_256(q: np.ndarray) -> np.ndarray:
    """[n, 256] values 0..3 -> [n, 64] bytes: element h*128 + s*32 + j in byte h*32 + j, bits 2s."""
    n = q.shape[0]
    q = q.reshape(n, 2, 4, 32).astype(np.uint8)
    out = np.zeros((n, 2, 32), dtype=np.uint8)
    for s in range(4):
        out |= q[:, :, s, :] << (2 * s)
    return out.reshape(n, 64)


def quantize_q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin, sc, mq, q = _affine_k(blocks, 16, 3, 4)
    scales = (sc.astype(np.uint8) & 0x0F) | (mq.astype(np.uint8) << 4)
    return np.concatenate([scales, _pack_2bit_256(q.reshape(n, 256)), _f16_bytes(d), _f16_bytes(dmin)], axis=1)


def quantize_q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    x = blocks.reshape(n, 16, 16)
    scale = np.abs(x).max(axis=-1) / 4.0
    d = _f16_round(scale.max(axis=-1) / 31.0)
    sc = np.clip(np.round(_safe_div(scale, d[:, None])), -32, 31)
    eff = (d[:, None] * sc)[..., None]
    q = np.clip(np.round(_safe_div(x, np.broadcast_to(eff, x.shape))), -4, 3).astype(np.int16)
    u = (q + 4).astype(np.uint8).reshape(n, 256)
    qs = _pack_2bit_256(u & 3)
    hbit = (u >> 2).reshape(n, 8, 32)
    hmask = np.zeros((n, 32), dtype=np.uint8)
    for b in range(8):
        hmask |= hbit[:, b, :] << b
    s6 = (sc + 32).astype(np.uint8)  # [n, 16]
    scales = np.zeros((n, 12), dtype=np.uint8)
    scales[:, 0:8] = (s6[:, 0:8] & 0x0F) | ((s6[:, 8:16] & 0x0F) << 4)
    for i in range(16):
        scales[:, 8 + (i % 4)] |= ((s6[:, i] >> 4) & 0x03) << (2 * (i // 4))
    return np.concatenate([hmask, qs, scales, _f16_bytes(d)], axis=1)


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    x = blocks.reshape(n, 16, 16)
    scale = np.abs(x).max(axis=-1) / 31.0
    d = _f16_round(scale.max(axis=-1) / 127.0)
    sc = np.clip(np.round(_safe_div(scale, d[:, None])), -128, 127)
    eff = (d[:, None] * sc)[..., None]
    q = (np.clip(np.round(_safe_div(x, np.broadcast_to(eff, x.shape))), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(n, 2, 128)
    ql = np.zeros((n, 2, 64), dtype=np.uint8)
    qh = np.zeros((n, 2, 32), dtype=np.uint8)
    for k in range(2):
        ql |= (q[:, :, k * 64:(k + 1) * 64] & 0x0F) << (4 * k)
    for s in range(4):
        qh |= ((q[:, :, s * 32:(s + 1) * 32] >> 4) & 0x03) << (2 * s)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.astype(np.int8).view(np.uint8),
                           _f16_bytes(d)], axis=1)


def _nearest_iq4(v: np.ndarray) -> np.ndarray:
    return np.abs(v[..., None] - IQ4NL_VALUES).argmin(axis=-1).astype(np.uint8)


def quantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    imax = np.abs(blocks).argmax(axis=-1)[:, None]
    d = _f16_round(np.take_along_axis(blocks, imax, axis=-1)[:, 0] / -127.0)
    idx = _nearest_iq4(_safe_div(blocks, d[:, None]))
    qs = idx[:, :16] | (idx[:, 16:] << 4)
    return np.concatenate([_f16_bytes(d), qs], axis=1)


def quantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    x = blocks.reshape(n, 8, 32)
    imax = np.abs(x).argmax(axis=-1)[..., None]
    s = np.take_along_axis(x, imax, axis=-1)[..., 0] / -127.0   # [n, 8]
    d = _f16_round(np.abs(s).max(axis=-1) / 31.0)
    ls = np.clip(np.round(_safe_div(s, d[:, None])), -32, 31)
    eff = (d[:, None] * ls)[..., None]
    idx = _nearest_iq4(_safe_div(x, np.broadcast_to(eff, x.shape)))  # [n, 8, 32]
    qs = (idx[:, :, :16] | (idx[:, :, 16:] << 4)).reshape(n, 128)
    l6 = (ls + 32).astype(np.uint16)
    scales_l = ((l6[:, 0::2] & 0x0F) | ((l6[:, 1::2] & 0x0F) << 4)).astype(np.uint8)
    sh = np.zeros(n, dtype=np.uint16)
    for j in range(8):
        sh |= ((l6[:, j] >> 4) & 0x03) << (2 * j)
    return np.concatenate([_f16_bytes(d), sh.reshape(n, 1).view(np.uint8), scales_l, qs], axis=1)


_OWN_QUANTIZERS = {
    "Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k,
    "Q6_K": quantize_q6_k, "IQ4_NL": quantize_iq4_nl, "IQ4_XS": quantize_iq4_xs,
}


def quantize(data: np.ndarray, qtype: str) -> np.ndarray:
    """[..., cols] float32 -> raw uint8 [..., row_bytes] (or float arrays for F32/F16)."""
    import gguf

    qt = gguf.GGMLQuantizationType[qtype]
    if qtype in _OWN_QUANTIZERS:
        block, type_size = gguf.GGML_QUANT_SIZES[qt]
        x = np.ascontiguousarray(data, dtype=np.float32)
        assert x.shape[-1] % block == 0, (x.shape, qtype)
        out = _OWN_QUANTIZERS[qtype](x.reshape(-1, block))
        assert out.dtype == np.uint8 and out.shape[1] == type_size, (out.shape, qtype)
        return out.reshape(*x.shape[:-1], x.shape[-1] // block * type_size)
    return gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), qt)


# ---------------------------------------------------------------------------------------------
# converter conventions


def load_hf(source: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state dict, config dict) of an HF directory or an in-memory transformers model."""
    if isinstance(source, (str, Path)):
        from safetensors.torch import load_file

        d = Path(source)
        cfg = json.loads((d / "config.json").read_text())
        sd: dict[str, torch.Tensor] = {}
        for f in sorted(d.glob("*.safetensors")):
            sd.update(load_file(str(f)))
        return sd, cfg
    return {k: v.detach() for k, v in source.state_dict().items()}, source.config.to_dict()


def reorder_v_heads(t: torch.Tensor, dim: int, nk: int, nv_per_k: int, head_dim: int) -> torch.Tensor:
    """Grouped (by K head) -> tiled V-head order along `dim` (the converter's reordering)."""
    shape = list(t.shape)
    dim = dim % len(shape)
    t = t.reshape(*shape[:dim], nk, nv_per_k, head_dim, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape)


def convert_tensor(name: str, t: torch.Tensor, hp: Mapping[str, Any]) -> tuple[str, torch.Tensor]:
    """One HF tensor -> (renamed HF-ish name, converted data), as the qwen35 converter does."""
    t = t.to(torch.float32)
    nk, nv = hp["linear_num_key_heads"], hp["linear_num_value_heads"]
    dk, dv = hp["linear_key_head_dim"], hp["linear_value_head_dim"]
    if nk != nv and "linear_attn." in name:
        r = nv // nk
        if ".in_proj_qkv." in name:
            qk = 2 * nk * dk
            t = torch.cat([t[:qk], reorder_v_heads(t[qk:], 0, nk, r, dv)], dim=0)
        elif ".in_proj_z." in name:
            t = reorder_v_heads(t, 0, nk, r, dv)
        elif ".in_proj_b." in name or ".in_proj_a." in name:
            t = reorder_v_heads(t, 0, nk, r, 1)
        elif ".A_log" in name or ".dt_bias" in name:
            t = reorder_v_heads(t.unsqueeze(-1), 0, nk, r, 1).squeeze(-1)
        elif ".conv1d" in name:
            x = t.squeeze()
            qk = 2 * nk * dk
            t = torch.cat([x[:qk], reorder_v_heads(x[qk:], 0, nk, r, dv)], dim=0)
        elif ".out_proj." in name:
            t = reorder_v_heads(t, 1, nk, r, dv)
    if name.endswith(".A_log"):
        t = -torch.exp(t)
    elif name.endswith(".dt_bias"):
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    elif "conv1d" in name:
        t = t.squeeze()
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        t = t + 1
    return name, t


def random_mtp_tensors(hp: Mapping[str, Any], n_layers: int = 1, seed: int = 5) -> dict[str, torch.Tensor]:
    """Synthetic HF-named MTP weights (transformers' Qwen3.5 classes drop mtp.* on load)."""
    g = torch.Generator().manual_seed(seed)
    H, I = hp["hidden_size"], hp.get("moe_intermediate_size") or hp["intermediate_size"]
    nh, nkv = hp["num_attention_heads"], hp["num_key_value_heads"]
    hd = hp.get("head_dim") or H // nh
    out = {
        "mtp.fc.weight": torch.randn(H, 2 * H, generator=g) / (2 * H) ** 0.5,
        "mtp.pre_fc_norm_embedding.weight": 0.3 * torch.randn(H, generator=g),
        "mtp.pre_fc_norm_hidden.weight": 0.3 * torch.randn(H, generator=g),
        "mtp.norm.weight": 0.3 * torch.randn(H, generator=g),
    }
    for j in range(n_layers):
        p = f"mtp.layers.{j}."
        out.update({
            p + "input_layernorm.weight": 0.3 * torch.randn(H, generator=g),
            p + "post_attention_layernorm.weight": 0.3 * torch.randn(H, generator=g),
            p + "self_attn.q_proj.weight": torch.randn(2 * nh * hd, H, generator=g) / H ** 0.5,
            p + "self_attn.k_proj.weight": torch.randn(nkv * hd, H, generator=g) / H ** 0.5,
            p + "self_attn.v_proj.weight": torch.randn(nkv * hd, H, generator=g) / H ** 0.5,
            p + "self_attn.o_proj.weight": torch.randn(H, nh * hd, generator=g) / (nh * hd) ** 0.5,
            p + "self_attn.q_norm.weight": 0.3 * torch.randn(hd, generator=g),
            p + "self_attn.k_norm.weight": 0.3 * torch.randn(hd, generator=g),
        })
        if hp.get("num_experts"):
            E, S = hp["num_experts"], hp["shared_expert_intermediate_size"]
            out.update({
                p + "mlp.gate.weight": torch.randn(E, H, generator=g) / H ** 0.5,
                p + "mlp.experts.gate_up_proj": torch.randn(E, 2 * I, H, generator=g) / H ** 0.5,
                p + "mlp.experts.down_proj": torch.randn(E, H, I, generator=g) / I ** 0.5,
                p + "mlp.shared_expert.gate_proj.weight": torch.randn(S, H, generator=g) / H ** 0.5,
                p + "mlp.shared_expert.up_proj.weight": torch.randn(S, H, generator=g) / H ** 0.5,
                p + "mlp.shared_expert.down_proj.weight": torch.randn(H, S, generator=g) / S ** 0.5,
                p + "mlp.shared_expert_gate.weight": torch.randn(1, H, generator=g) / H ** 0.5,
            })
        else:
            out.update({
                p + "mlp.gate_proj.weight": torch.randn(I, H, generator=g) / H ** 0.5,
                p + "mlp.up_proj.weight": torch.randn(I, H, generator=g) / H ** 0.5,
                p + "mlp.down_proj.weight": torch.randn(H, I, generator=g) / I ** 0.5,
            })
    return out


_MTP_REMAP = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
              "norm": "shared_head.norm"}
_NEXTN_GGUF = {"eh_proj": "nextn.eh_proj", "enorm": "nextn.enorm", "hnorm": "nextn.hnorm",
               "shared_head.norm": "nextn.shared_head_norm"}


def mtp_remap(name: str, num_layers: int) -> str:
    """The converter's filter step: mtp.layers.J.* -> model.layers.(L+J).*, mtp.fc/norms ->
    model.layers.L.{eh_proj, enorm, hnorm, shared_head.norm} (so the +1 norm rule sees
    "...enorm.weight" etc.)."""
    if not name.startswith("mtp."):
        return name
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[1] == "layers" and parts[2].isdecimal():
        return f"model.layers.{num_layers + int(parts[2])}.{parts[3]}"
    if len(parts) == 3 and parts[1] in _MTP_REMAP:
        return f"model.layers.{num_layers}.{_MTP_REMAP[parts[1]]}.{parts[2]}"
    return name


def gguf_name(name: str, hp: Mapping[str, Any], tensor_map: Any) -> str | None:
    """Converter-side name (after mtp_remap / convert_tensor) -> GGUF name."""
    L = hp["num_hidden_layers"]
    for hf, gg in _NEXTN_GGUF.items():
        prefix = f"model.layers.{L}.{hf}."
        if name.startswith(prefix):
            return f"blk.{L}.{gg}.{name[len(prefix):]}"
    return tensor_map.get_name(name, try_suffixes=(".weight", ".bias"))


def _interval(layer_types: list[str]) -> int:
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    assert full, "a Qwen3.5 model needs full-attention layers"
    k = full[0] + 1
    assert layer_types == ["full_attention" if (i + 1) % k == 0 else "linear_attention"
                           for i in range(len(layer_types))], f"layer types are not periodic: {layer_types}"
    return k


def write_gguf(
    source: Any,
    path: str | Path,
    *,
    qtype: str = "F32",
    tokenizer_dir: str | Path | None = None,
    tokenizer_pre: str = "qwen35",
    mtp_layers: int = 0,
    split_max_tensors: int = 0,
    type_overrides: Mapping[str, str] | None = None,
    strict: bool = False,
    drop_tensors: tuple[str, ...] = (),
    extra_metadata: Mapping[str, Any] | None = None,
    hp_overrides: Mapping[str, Any] | None = None,
    arch: str | None = None,
    gate_up_stacked: bool = False,
) -> list[Path]:
    """Convert an HF Qwen3.5 (model object or saved directory) to GGUF; returns the file path(s).

    qtype: type of 2-D weights (norms, 1-D tensors and conv1d stay F32).
    type_overrides: GGUF tensor name -> type (wins over qtype), e.g. {"token_embd.weight": "Q6_K"};
        a type neither gguf-py nor this module can quantize gets random bytes of the right size.
    hp_overrides: hyperparameters changed in the METADATA only (to make inconsistent files).
    arch: general.architecture to write (metadata keys use it as their prefix); default qwen35,
        or qwen35moe for a model with experts.
    gate_up_stacked: MoE only: write each layer's experts as one ffn_gate_up_exps [E, 2I, H]
        instead of ffn_gate_exps + ffn_up_exps (llama.cpp's converter writes either).
    MoE (qwen35moe, as the converter writes it): per-expert or fused HF expert tensors become
    stacked ffn_{gate,up,down}_exps [E, N, K]; mlp.gate -> ffn_gate_inp (kept F32, like the
    converter and llama-quantize), shared expert -> ffn_*_shexp, shared_expert_gate ->
    ffn_gate_inp_shexp as a vector [H]; expert_count, expert_used_count,
    expert_feed_forward_length, expert_shared_feed_forward_length in the metadata.
    """
    import gguf

    sd, cfg = load_hf(source)
    hp = {**cfg, **cfg.get("text_config", {})}
    hp.setdefault("head_dim", hp["hidden_size"] // hp["num_attention_heads"])
    tensors: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if "visual." in k:
            continue
        k = k.replace("model.language_model.", "model.", 1)
        tensors[k] = v
    if hp.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)  # tied: the checkpoint carries no separate head
    moe = bool(hp.get("num_experts"))
    arch = arch or ("qwen35moe" if moe else "qwen35")
    if mtp_layers and not any(k.startswith("mtp.") for k in tensors):   # the source's own, else random
        tensors.update(random_mtp_tensors(hp, mtp_layers))
    if moe:
        tensors = stack_experts(tensors, hp["num_experts"], gate_up_stacked)
    L = hp["num_hidden_layers"]
    block_count = L + mtp_layers
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35MOE if moe else gguf.MODEL_ARCH.QWEN35, block_count)

    meta_hp = {**hp, **(hp_overrides or {})}
    w = gguf.GGUFWriter(path=None, arch=arch, split_max_tensors=split_max_tensors)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("tiny-qwen35-test")
    w.add_block_count(meta_hp.get("num_hidden_layers", L) + mtp_layers)
    w.add_context_length(meta_hp.get("max_position_embeddings", 4096))
    w.add_embedding_length(meta_hp["hidden_size"])
    if moe:
        w.add_expert_count(meta_hp["num_experts"])
        w.add_expert_used_count(meta_hp["num_experts_per_tok"])
        w.add_expert_feed_forward_length(meta_hp["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(meta_hp["shared_expert_intermediate_size"])
    else:
        w.add_feed_forward_length(meta_hp["intermediate_size"])
    w.add_head_count(meta_hp["num_attention_heads"])
    w.add_head_count_kv(meta_hp["num_key_value_heads"])
    rope = dict(meta_hp.get("rope_parameters") or meta_hp.get("rope_scaling") or {})
    sections = list(rope.get("mrope_section") or [11, 11, 10])
    while len(sections) < 4:
        sections.append(0)
    w.add_rope_dimension_sections(sections[:4])
    w.add_rope_freq_base(float(rope.get("rope_theta", meta_hp.get("rope_theta", 10_000_000.0))))
    w.add_layer_norm_rms_eps(float(meta_hp.get("rms_norm_eps", 1e-6)))
    w.add_key_length(meta_hp["head_dim"])
    w.add_value_length(meta_hp["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_ssm_conv_kernel(meta_hp["linear_conv_kernel_dim"])
    w.add_ssm_state_size(meta_hp["linear_key_head_dim"])
    w.add_ssm_group_count(meta_hp["linear_num_key_heads"])
    w.add_ssm_time_step_rank(meta_hp["linear_num_value_heads"])
    w.add_ssm_inner_size(meta_hp["linear_value_head_dim"] * meta_hp["linear_num_value_heads"])
    w.add_full_attention_interval(_interval(list(meta_hp["layer_types"])))
    w.add_rope_dimension_count(int(meta_hp["head_dim"] * rope.get("partial_rotary_factor", meta_hp.get("partial_rotary_factor", 0.25))))
    if mtp_layers:
        w.add_nextn_predict_layers(mtp_layers)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if tokenizer_dir is not None:
        _add_vocab(w, Path(tokenizer_dir), hp["vocab_size"], tokenizer_pre)
    for k, v in (extra_metadata or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        else:
            w.add_array(k, list(v))

    overrides = dict(type_overrides or {})
    for name, t in tensors.items():
        new, data = convert_tensor(mtp_remap(name, L), t, hp)
        gname = gguf_name(new, hp, tmap)
        assert gname is not None, f"no GGUF name for {name}"
        if gname in drop_tensors:
            continue
        arr = data.numpy().astype(np.float32)
        if gname.endswith(".ffn_gate_inp_shexp.weight"):
            arr = arr.reshape(-1)
        want = overrides.get(gname)
        if want is None:
            if (arr.ndim <= 1 or gname.endswith("_norm.weight") or ".ssm_conv1d." in gname
                    or gname.endswith(".ffn_gate_inp.weight")):
                want = "F32"
            else:
                want = qtype
        w_type = want
        if want not in ("F32", "F16"):
            block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[want]][0]
            if arr.shape[-1] % block:
                assert not strict, f"{gname}: rows of {arr.shape[-1]} cannot be {want}"
                w_type = "Q8_0" if block == 256 and arr.shape[-1] % 32 == 0 else "F16"
        if w_type == "F32":
            w.add_tensor(gname, arr)
        elif w_type == "F16":
            w.add_tensor(gname, arr.astype(np.float16))
        elif w_type in _OWN_QUANTIZERS or w_type in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16"):
            w.add_tensor(gname, quantize(arr, w_type), raw_dtype=gguf.GGMLQuantizationType[w_type])
        else:  # a type nobody here quantizes (e.g. IQ2_XXS): random blocks of the right size
            qt = gguf.GGMLQuantizationType[w_type]
            block, type_size = gguf.GGML_QUANT_SIZES[qt]
            raw = np.random.default_rng(0).integers(0, 256, (*arr.shape[:-1], arr.shape[-1] // block * type_size),
                                                    dtype=np.uint8)
            w.add_tensor(gname, raw, raw_dtype=qt)
    out = Path(path)
    w.write_header_to_file(path=out)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return sorted(out.parent.glob(f"{out.stem}-*-of-*.gguf"))
    return [out]


def stack_experts(tensors: dict[str, torch.Tensor], num_experts: int, gate_up_stacked: bool) -> dict[str, torch.Tensor]:
    """HF expert tensors (fused gate_up_proj [E, 2I, H] / down_proj, or one per expert) -> the
    converter's stacked mlp.experts.{gate,up,down}_proj.weight [E, N, K] (or gate_up_proj.weight),
    named with ".weight" as the converter names merged experts."""
    out: dict[str, torch.Tensor] = {}
    per: dict[str, dict[int, torch.Tensor]] = {}
    for k, v in tensors.items():
        parts = k.split(".")
        if ".mlp.experts." in k and parts[-2].endswith("_proj") and parts[-3].isdecimal():
            per.setdefault(".".join(parts[:-3] + [parts[-2], "weight"]), {})[int(parts[-3])] = v
        elif k.endswith(".mlp.experts.gate_up_proj"):
            half = v.shape[1] // 2
            out[k.replace("gate_up_proj", "gate_proj.weight")] = v[:, :half]
            out[k.replace("gate_up_proj", "up_proj.weight")] = v[:, half:]
        elif k.endswith(".mlp.experts.down_proj"):
            out[k + ".weight"] = v
        else:
            out[k] = v
    for k, got in per.items():
        assert len(got) == num_experts, (k, len(got))
        out[k] = torch.stack([got[i] for i in range(num_experts)])
    if gate_up_stacked:
        for k in [k for k in out if k.endswith(".mlp.experts.gate_proj.weight")]:
            up = out.pop(k.replace("gate_proj", "up_proj"))
            out[k.replace("gate_proj", "gate_up_proj")] = torch.cat([out.pop(k), up], dim=1)
    return out


def _add_vocab(w: Any, tok_dir: Path, vocab_size: int, pre: str) -> None:
    """Like the converter's _set_vocab_gpt2 / get_vocab_base (pre is given: the converter derives
    it from a hash of known tokenizers, which a test tokenizer cannot match)."""
    import gguf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    vocab = tok.get_vocab()
    assert max(vocab.values()) < vocab_size
    reverse = {i: t for t, i in vocab.items()}
    added = tok.get_added_vocab()
    decoder = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        if t in added:
            looks_special = t.startswith("<|") and t.endswith("|>")
            types.append(gguf.TokenType.CONTROL if decoder[i].special or looks_special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(t)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(tok_dir, load_merges=True).add_to_gguf(w, quiet=True)
