"""Synthetic Qwen3.5 models: random weights of a real shape, built directly on the device.

    src = open_synthetic("synthetic:qwen3.5-9b?quant=q4_k", torch.float16, "cuda")   # the loader protocol
    weights = synthetic_weights(shape_config("qwen3.5-9b"), quant="q4_k", device="cuda")

They live in the engine because tensor-parallel workers load them by source name
("synthetic:SHAPE"); g906.bench.synthetic builds whole LoadedModels of them for benchmarks.

Shapes are data (g906/data/models.toml [shapes.*]); `overrides` changes any field (tests use
tiny ones). Every tensor is drawn on the target device from its own seeded generator (seed +
crc32 of its name), one tensor at a time, so no multi-GB CPU tensor ever exists and the same
(shape, seed) gives the same weights on the same device kind.

quant:
- "f16" / "bf16" / "f32" (or "dense"): dense weights in the compute dtype.
- "q8_0": every 2-D matrix (embedding and LM head included) as Q8_0 blocks, like llama.cpp's
  Q8_0 files.
- "q4_k": llama.cpp's Q4_K_M mix (models.toml [quant_mix.q4_k_m]): Q4_K, with Q6_K for the
  output matrix and for attn_v / ffn_down on the layers use_more_bits picks, Q5_K for the
  linear-attention QKV projection.
Quantized blocks are random but valid: every f16 scale is finite and chosen so that the
dequantized weights have mean ~0 and standard deviation ~1/sqrt(in_features) (like the dense
ones); 6-bit sub-block scales are drawn from [16, 63] and the K-quant mins are set to centre
each sub-block. A matrix whose rows are not whole 256-element super-blocks falls back to Q8_0
(32-element blocks), and to dense when not even that fits (as llama-quantize does)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from typing import Any

import torch

from g906 import data as _data
from g906.arch.config import ModelConfig
from g906.engine.weights import QuantizedExperts, QuantizedTensor
from g906.errors import G906Error, UsageError

QUANTS = ("f16", "bf16", "f32", "q8_0", "q4_k")
DENSE_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
SEED = 906
SOURCE_PREFIX = "synthetic:"


# ---------------------------------------------------------------------------------------------
# shapes


def shape_names() -> list[str]:
    return list(_data.load("models").get("shapes", {}))


def shape_config(name: str, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """ModelConfig of a named real shape (models.toml), with optional field overrides."""
    shapes = _data.load("models").get("shapes", {})
    key = name.strip().lower()
    if key not in shapes:
        raise UsageError(f"unknown model shape {name!r}",
                         hint="available: " + ", ".join(shapes))
    fields = dict(shapes[key])
    fields.update(overrides or {})
    layers = int(fields["num_hidden_layers"])
    fields.setdefault("layer_types", ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                      for i in range(layers)])
    if len(fields["layer_types"]) != layers:
        fields["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                 for i in range(layers)]
    fields.setdefault("max_position_embeddings", 262_144)
    fields.setdefault("rope_theta", 10_000_000.0)
    fields.setdefault("mrope_section", [11, 11, 10])
    fields.setdefault("eos_token_ids", [])
    fields["architecture"] = "qwen35moe" if fields.get("num_experts") else "qwen35"
    if fields.get("num_experts"):
        fields.setdefault("moe_intermediate_size", fields["intermediate_size"])
        fields.setdefault("shared_expert_intermediate_size", fields["moe_intermediate_size"])
    try:
        return ModelConfig(**fields)
    except TypeError as exc:
        raise UsageError(f"bad shape override for {name}: {exc}") from None


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """KEY=VALUE strings (ints, floats, true/false) -> dict."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad --shape-override {item!r}", hint="use KEY=VALUE, e.g. num_hidden_layers=4")
        raw = raw.strip()
        val: Any
        if raw.lower() in ("true", "false"):
            val = raw.lower() == "true"
        else:
            try:
                val = int(raw)
            except ValueError:
                try:
                    val = float(raw)
                except ValueError:
                    val = raw
        out[key.strip()] = val
    return out


def normalize_quant(quant: str) -> str:
    """One of QUANTS ("dense" is f16, "q4_k_m" is q4_k); anything else is a usage error."""
    q = str(quant).lower().replace("-", "_")
    q = {"dense": "f16", "q4_k_m": "q4_k"}.get(q, q)
    if q not in QUANTS:
        raise UsageError(f"unknown --quant {quant!r}", hint="use one of " + ", ".join(QUANTS))
    return q


# ---------------------------------------------------------------------------------------------
# which type each matrix gets


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _category(name: str) -> str:
    if name == "lm_head.weight":
        return "output"
    if name.endswith("embed_tokens.weight"):
        return "token_embd"
    if name.endswith("self_attn.v_proj.weight"):
        return "attn_v"
    if name.endswith(("mlp.down_proj.weight", "mlp.experts.down_proj")):
        return "ffn_down"
    if name.endswith("linear_attn.in_proj_qkv.weight"):
        return "attn_qkv"
    return "other"


class QuantPlan:
    """Assigns a GGUF type (or None = dense) to each 2-D matrix, by name and position."""

    def __init__(self, quant: str, config: ModelConfig):
        self.quant = quant
        mix = _data.load("models").get("quant_mix", {}).get("q4_k_m", {})
        self.mix = mix
        self.n = {"attn_v": len(config.full_attention_layers), "ffn_down": config.num_hidden_layers}
        self.i = {"attn_v": 0, "ffn_down": 0}

    def qtype(self, name: str, in_features: int) -> str | None:
        if self.quant in DENSE_DTYPES:
            return None
        if self.quant == "q8_0":
            want = "Q8_0"
        else:
            cat = _category(name)
            want = self.mix.get("base", "Q4_K")
            if cat == "output":
                want = self.mix.get("output", "Q6_K")
            elif cat == "attn_qkv":
                want = self.mix.get("attn_qkv", want)
            elif cat in self.mix.get("more_bits_tensors", []):
                i = self.i[cat]
                self.i[cat] += 1
                if _use_more_bits(i, self.n[cat]):
                    want = self.mix.get("more_bits", "Q6_K")
        if want != "Q8_0" and in_features % 256:
            want = "Q8_0"
        if in_features % 32:
            return None
        return want


# ---------------------------------------------------------------------------------------------
# random valid blocks (uint8 [rows, row_bytes] on the device)


def _f16_field(rows_blocks: tuple[int, int], value: float, g, device) -> torch.Tensor:
    """[rows, nb, 2] bytes of f16 values near `value` (x U[0.75, 1.25])."""
    v = (torch.rand(rows_blocks, generator=g, device=device) * 0.5 + 0.75) * value
    return v.to(torch.float16).view(torch.uint8).reshape(*rows_blocks, 2)


def _randbytes(shape, g, device, lo: int = 0, hi: int = 256) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=g, device=device, dtype=torch.int16).to(torch.uint8)


def _pack_scale_min_k4(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """[..., 8] 6-bit scales and mins -> [..., 12] bytes (ggml's Q4_K/Q5_K packing)."""
    lo = sc[..., :4] | ((sc[..., 4:] & 0x30) << 2)
    mid = mn[..., :4] | ((mn[..., 4:] & 0x30) << 2)
    hi = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
    return torch.cat([lo, mid, hi], dim=-1)


def random_blocks(qtype: str, rows: int, cols: int, *, g: torch.Generator, device) -> torch.Tensor:
    """Random valid ggml blocks for a [rows, cols] matrix; weights ~ N-ish(0, 1/cols)."""
    std = 1.0 / math.sqrt(cols)
    dev = torch.device(device)
    if qtype == "Q8_0":
        nb = cols // 32
        d = _f16_field((rows, nb), std / 73.9, g, dev)
        q = _randbytes((rows, nb, 32), g, dev)
        return torch.cat([d, q], dim=-1).reshape(rows, nb * 34)
    nb = cols // 256
    if qtype in ("Q4_K", "Q5_K"):
        levels = 16 if qtype == "Q4_K" else 32
        qstd = levels / math.sqrt(12.0)             # std of uniform codes 0..levels-1
        sc = _randbytes((rows, nb, 8), g, dev, 16, 64)
        dval = std / (qstd * 41.0)                  # rms of U[16, 63] ~ 42
        ratio = 8.0 if qtype == "Q4_K" else 16.0    # dmin = ratio * d keeps mins < 64
        mn = torch.clamp(torch.round(sc.float() * ((levels - 1) / 2.0) / ratio), 0, 63).to(torch.uint8)
        d = _f16_field((rows, nb), dval, g, dev)
        dh = d.reshape(rows, nb, 2).view(torch.float16).float() * ratio
        dmin = dh.to(torch.float16).view(torch.uint8).reshape(rows, nb, 2)
        scales = _pack_scale_min_k4(sc, mn)
        if qtype == "Q4_K":
            qs = _randbytes((rows, nb, 128), g, dev)
            blk = torch.cat([d, dmin, scales, qs], dim=-1)
            return blk.reshape(rows, nb * 144)
        qh = _randbytes((rows, nb, 32), g, dev)
        qs = _randbytes((rows, nb, 128), g, dev)
        return torch.cat([d, dmin, scales, qh, qs], dim=-1).reshape(rows, nb * 176)
    if qtype == "Q6_K":
        ql = _randbytes((rows, nb, 128), g, dev)
        qh = _randbytes((rows, nb, 64), g, dev)
        mag = _randbytes((rows, nb, 16), g, dev, 16, 64).to(torch.int16)
        sign = _randbytes((rows, nb, 16), g, dev, 0, 2).to(torch.int16) * 2 - 1
        scales = (mag * sign).to(torch.int8).view(torch.uint8)
        d = _f16_field((rows, nb), std / (18.5 * 41.0), g, dev)
        return torch.cat([ql, qh, scales, d], dim=-1).reshape(rows, nb * 210)
    raise G906Error(f"no random block builder for {qtype}")


# ---------------------------------------------------------------------------------------------
# the weights


def _gen(name: str, seed: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return g


def tensor_specs(config: ModelConfig) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """(HF name, kind, shape) of every tensor of a Qwen3.5 text model, in checkpoint order.

    kind: "mat" (a 2-D matrix, maybe quantized), "experts" (stacked expert matrices [E, N, K],
    maybe quantized), "dense" (a matrix kept dense: the MoE router and shared-expert gate, as
    llama.cpp keeps them), "zc_norm" (zero-centred norm weight), "norm" (plain norm weight, ~1),
    "conv" (conv1d [C, 1, K]), "dt_bias", "A_log"."""
    c = config
    H, I = c.hidden_size, c.intermediate_size
    nk, nv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                      c.linear_value_head_dim)
    yield "model.embed_tokens.weight", "mat", (c.vocab_size, H)
    for i, kind in enumerate(c.layer_types):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", "zc_norm", (H,)
        if kind == "linear_attention":
            conv = 2 * nk * dk + nv * dv
            yield p + "linear_attn.in_proj_qkv.weight", "mat", (conv, H)
            yield p + "linear_attn.in_proj_z.weight", "mat", (nv * dv, H)
            yield p + "linear_attn.in_proj_b.weight", "mat", (nv, H)
            yield p + "linear_attn.in_proj_a.weight", "mat", (nv, H)
            yield p + "linear_attn.conv1d.weight", "conv", (conv, 1, c.linear_conv_kernel_dim)
            yield p + "linear_attn.dt_bias", "dt_bias", (nv,)
            yield p + "linear_attn.A_log", "A_log", (nv,)
            yield p + "linear_attn.norm.weight", "norm", (dv,)
            yield p + "linear_attn.out_proj.weight", "mat", (H, nv * dv)
        else:
            nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
            yield p + "self_attn.q_proj.weight", "mat", (2 * nh * hd, H)
            yield p + "self_attn.k_proj.weight", "mat", (nkv * hd, H)
            yield p + "self_attn.v_proj.weight", "mat", (nkv * hd, H)
            yield p + "self_attn.o_proj.weight", "mat", (H, nh * hd)
            yield p + "self_attn.q_norm.weight", "zc_norm", (hd,)
            yield p + "self_attn.k_norm.weight", "zc_norm", (hd,)
        yield p + "post_attention_layernorm.weight", "zc_norm", (H,)
        if c.is_moe:
            E, M, S = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
            yield p + "mlp.gate.weight", "dense", (E, H)
            yield p + "mlp.experts.gate_proj", "experts", (E, M, H)
            yield p + "mlp.experts.up_proj", "experts", (E, M, H)
            yield p + "mlp.experts.down_proj", "experts", (E, H, M)
            yield p + "mlp.shared_expert.gate_proj.weight", "mat", (S, H)
            yield p + "mlp.shared_expert.up_proj.weight", "mat", (S, H)
            yield p + "mlp.shared_expert.down_proj.weight", "mat", (H, S)
            yield p + "mlp.shared_expert_gate.weight", "dense", (1, H)
            continue
        yield p + "mlp.gate_proj.weight", "mat", (I, H)
        yield p + "mlp.up_proj.weight", "mat", (I, H)
        yield p + "mlp.down_proj.weight", "mat", (H, I)
    yield "model.norm.weight", "zc_norm", (H,)
    if not c.tie_word_embeddings:
        yield "lm_head.weight", "mat", (c.vocab_size, H)


def make_tensor(name: str, kind: str, shape: tuple[int, ...], qtype: str | None, *, dtype: torch.dtype,
                device, seed: int = SEED) -> torch.Tensor | QuantizedTensor | QuantizedExperts:
    """One synthetic tensor (deterministic in name and seed)."""
    dev = torch.device(device)
    g = _gen(name, seed, dev)
    if kind == "dense":
        return torch.randn(shape, generator=g, device=dev, dtype=dtype).mul_(1.0 / math.sqrt(shape[-1]))
    if kind == "experts":
        E, rows, cols = shape
        if qtype is None:
            return torch.randn(shape, generator=g, device=dev, dtype=dtype).mul_(1.0 / math.sqrt(cols))
        blocks = random_blocks(qtype, E * rows, cols, g=g, device=dev)
        return QuantizedExperts(blocks.reshape(E, rows, -1), qtype, (E, rows, cols))
    if kind == "mat":
        rows, cols = shape
        if qtype is None:
            w = torch.randn(rows, cols, generator=g, device=dev, dtype=dtype)
            return w.mul_(1.0 / math.sqrt(cols))
        return QuantizedTensor(random_blocks(qtype, rows, cols, g=g, device=dev), qtype, (rows, cols))
    if kind == "zc_norm":
        return torch.randn(shape, generator=g, device=dev).mul_(0.1)
    if kind == "norm":
        return torch.randn(shape, generator=g, device=dev).mul_(0.1).add_(1.0)
    if kind == "dt_bias":
        return torch.randn(shape, generator=g, device=dev).mul_(0.1).add_(1.0)
    if kind == "A_log":
        return torch.log1p(15.0 * torch.rand(shape, generator=g, device=dev))
    if kind == "conv":
        return (torch.randn(shape, generator=g, device=dev) * 0.5).to(dtype)
    raise G906Error(f"unknown synthetic tensor kind {kind!r}")


def synthetic_weights(config: ModelConfig, *, quant: str = "f16", dtype: torch.dtype = torch.float16,
                      device="cpu", seed: int = SEED) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
    """(HF name, tensor) pairs of a random Qwen3.5 model of this config, made on `device`.

    Dense tensors come in `dtype` (norm weights, A_log, dt_bias in float32 as in checkpoints);
    2-D matrices are QuantizedTensors where the quant plan says so."""
    plan = QuantPlan(quant, config)
    for name, kind, shape in tensor_specs(config):
        qt = plan.qtype(name, shape[-1]) if kind in ("mat", "experts") else None
        yield name, make_tensor(name, kind, shape, qt, dtype=dtype, device=device, seed=seed)


# ---------------------------------------------------------------------------------------------
# a model source (the loader protocol)


class NullTokenizer:
    """Stands in for a tokenizer on synthetic models: token ids only, no text."""

    eos_token_ids: list[int] = []
    bos_token_id = None
    pad_token_id = None
    vocab_size = 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:  # noqa: ARG002
        return ""

    def encode(self, text: str, add_special_tokens: bool = False):  # noqa: ARG002
        raise G906Error("a synthetic model has no tokenizer", hint="send token-id prompts")


class SyntheticSource:
    """"synthetic:SHAPE[?quant=f16&seed=906&FIELD=VALUE...]" with the loader protocol (config /
    weights / tokenizer / chat_template). The weights are drawn on the caller's device from
    per-tensor seeds, so every tensor-parallel rank (and build_synthetic at TP=1) sees the same ones."""

    format = "synthetic"

    def __init__(self, source: str, dtype: torch.dtype, device):
        from urllib.parse import parse_qsl

        shape, _, query = source[len(SOURCE_PREFIX):].partition("?")
        opts = dict(parse_qsl(query))
        self.shape = shape
        self.quant = normalize_quant(opts.pop("quant", "f16"))
        self.seed = int(opts.pop("seed", SEED))
        overrides = parse_overrides([f"{k}={v}" for k, v in opts.items()])
        self._config = shape_config(shape, overrides)
        self.dtype, self.device = dtype, torch.device(device)
        self.info = {"synthetic": True, "shape": shape, "quant": self.quant, "seed": self.seed}

    def config(self) -> ModelConfig:
        return self._config

    def weights(self, progress: bool = False):  # noqa: ARG002
        return synthetic_weights(self._config, quant=self.quant, dtype=self.dtype, device=self.device,
                                 seed=self.seed)

    def tokenizer(self) -> NullTokenizer:
        return NullTokenizer()

    def chat_template(self) -> None:
        return None


def is_synthetic(source) -> bool:
    return str(source).startswith(SOURCE_PREFIX)


def open_synthetic(source: str, dtype: torch.dtype, device) -> SyntheticSource:
    return SyntheticSource(source, dtype, device)
