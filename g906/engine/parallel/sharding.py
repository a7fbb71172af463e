"""Sharding rules: which rows/columns of each weight a rank holds, and the rank's local config.

Rank r of tp holds (contiguous unless said otherwise):
  full attention   q heads [r*H/tp, (r+1)*H/tp) — q_proj rows come as [q | gate] per head (2*D
                   rows a head); KV heads [r*Hkv/tp, ...) (GQA groups stay whole); o_proj columns
                   of its q heads (row-parallel: partial sums, all-reduced).
  linear attention key heads K_r = [r*m, (r+1)*m), m = Hk/tp, and the value heads that use them:
                     grouped (HF): v head j uses k head j // (Hv/Hk) -> contiguous [r*m*R, (r+1)*m*R)
                     tiled (GGUF): v head j uses k head j % Hk -> {c*Hk + r*m + i : c < R, i < m},
                       taken c-major so that local head c*m + i uses local k head i = (c*m+i) % m:
                       the rank's tensors are again "tiled" for its local counts.
                   in_proj_qkv rows [q(K_r) | k(K_r) | v(V_r)], conv1d channels alike, in_proj_z
                   rows of V_r (Dv each), in_proj_b/a rows, A_log and dt_bias entries of V_r;
                   out_proj columns of V_r (row-parallel). The gated norm (per head) is replicated.
  MLP              gate/up rows [r*I/tp, ...), down_proj columns alike (row-parallel).
  MoE MLP          every expert's features alike: stacked gate/up [E, I, H] rows [r*I/tp, ...) of
                   each expert (fused gate_up_proj: those of gate and of up), down_proj [E, H, I]
                   columns alike; the shared expert as the MLP; the router and the shared
                   expert's gate replicated. The block all-reduces its sum once (layers/moe.py).
  vocabulary       rows [r*P, min(V, (r+1)*P)), P = ceil(V/tp), of the embedding and the LM head.
  everything else  (norms, q_norm/k_norm) replicated.

A QuantizedTensor is split along rows with select_rows (whole rows are whole blocks); a
row-parallel split along its columns must take whole quant blocks, else G906Error. A
GroupQuantWeight (GPTQ / AWQ / compressed-tensors) likewise: any rows; columns only in whole
quantization groups (any cut for a per-channel weight, none for an act-order one; the recipe
refuses such a split before loading, g906.arch.hf_quant.tp_split_problems). Int4 MoE
checkpoints store one module per expert: each expert's gate/up rows and down_proj columns are
taken before the experts are stacked (the same group rule for down_proj, named per expert)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from g906.arch.config import ModelConfig
from g906.arch.tp import check_tp_size
from g906.engine.weights import GroupQuantExperts, QuantizedExperts, QuantizedTensor
from g906.kernels.int4.weight import GroupQuantWeight
from g906.errors import G906Error


@dataclass(frozen=True)
class RankInfo:
    rank: int
    size: int


def local_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The config of one rank's share: head counts and intermediate size divided by tp (vocab,
    hidden size, head dims and everything else unchanged)."""
    check_tp_size(config, tp)
    if tp == 1:
        return config
    return dataclasses.replace(
        config,
        num_attention_heads=config.num_attention_heads // tp,
        num_key_value_heads=config.num_key_value_heads // tp,
        linear_num_key_heads=config.linear_num_key_heads // tp,
        linear_num_value_heads=config.linear_num_value_heads // tp,
        intermediate_size=config.intermediate_size // tp,
        moe_intermediate_size=config.moe_intermediate_size // tp,
        shared_expert_intermediate_size=config.shared_expert_intermediate_size // tp,
        layer_types=list(config.layer_types),
    )


def vocab_range(vocab_size: int, rank: int, tp: int) -> tuple[int, int]:
    """[start, end) of the vocabulary rows rank holds; every rank reserves P = ceil(V/tp) rows."""
    per = -(-vocab_size // tp)
    return min(vocab_size, rank * per), min(vocab_size, (rank + 1) * per)


def vocab_per_rank(vocab_size: int, tp: int) -> int:
    return -(-vocab_size // tp)


def linear_k_heads(config: ModelConfig, rank: int, tp: int) -> list[int]:
    m = config.linear_num_key_heads // tp
    return list(range(rank * m, (rank + 1) * m))


def linear_v_heads(config: ModelConfig, rank: int, tp: int) -> list[int]:
    """Global value-head indices rank holds, in the rank's local order (see the module doc)."""
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    m, ratio = nk // tp, nv // nk
    if config.linear_v_head_order == "grouped":
        return list(range(rank * m * ratio, (rank + 1) * m * ratio))
    if config.linear_v_head_order == "tiled":
        return [c * nk + rank * m + i for c in range(ratio) for i in range(m)]
    raise G906Error(f"unknown linear-attention value-head order {config.linear_v_head_order!r}")


def _expand(heads: list[int], width: int, offset: int = 0) -> list[int]:
    return [offset + h * width + e for h in heads for e in range(width)]


def linear_qkv_rows(config: ModelConfig, rank: int, tp: int) -> list[int]:
    """Rows of in_proj_qkv (= conv1d channels) rank holds: [q(K_r) | k(K_r) | v(V_r)]."""
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    key_dim = config.linear_num_key_heads * dk
    k_heads = linear_k_heads(config, rank, tp)
    v_heads = linear_v_heads(config, rank, tp)
    return _expand(k_heads, dk) + _expand(k_heads, dk, key_dim) + _expand(v_heads, dv, 2 * key_dim)


# How each weight is split: (kind, index function) where kind is "rows" (dim 0), "cols" (dim 1,
# row-parallel), "vocab" (rows, vocab range) or "replicate".
def _span(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def shard_plan(name: str, config: ModelConfig, rank: int, tp: int) -> tuple[str, list[int] | None]:
    """(kind, indices) for an HF-named tensor: kind in rows | cols | replicate."""
    c = config
    m = re.search(r"(?:^|\.)layers\.\d+\.(self_attn|linear_attn|mlp)\.([\w.]+)$", name)
    if m is None:
        if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
            s, e = vocab_range(c.vocab_size, rank, tp)
            return "rows", list(range(s, e))
        return "replicate", None
    block, tail = m.groups()
    if block == "self_attn":
        h, hkv, d = c.num_attention_heads // tp, c.num_key_value_heads // tp, c.head_dim
        if tail == "q_proj.weight":
            return "rows", _span(rank * h * 2 * d, h * 2 * d)
        if tail in ("k_proj.weight", "v_proj.weight"):
            return "rows", _span(rank * hkv * d, hkv * d)
        if tail == "o_proj.weight":
            return "cols", _span(rank * h * d, h * d)
        if tail.startswith(("q_norm.", "k_norm.")):
            return "replicate", None
    elif block == "linear_attn":
        dv = c.linear_value_head_dim
        v_heads = linear_v_heads(c, rank, tp)
        if tail in ("in_proj_qkv.weight", "conv1d.weight"):
            return "rows", linear_qkv_rows(c, rank, tp)
        if tail == "in_proj_z.weight":
            return "rows", _expand(v_heads, dv)
        if tail in ("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
            return "rows", v_heads
        if tail == "out_proj.weight":
            return "cols", _expand(v_heads, dv)
        if tail.startswith("norm."):
            return "replicate", None
    elif c.is_moe:
        return _moe_plan(tail, c, rank, tp)
    else:
        inter = c.intermediate_size // tp
        if tail in ("gate_proj.weight", "up_proj.weight"):
            return "rows", _span(rank * inter, inter)
        if tail == "down_proj.weight":
            return "cols", _span(rank * inter, inter)
    raise G906Error(f"tensor {name}: no tensor-parallel sharding rule for it",
                    hint="this checkpoint has a tensor the tensor-parallel engine does not know")


_PER_EXPERT = re.compile(r"^experts\.\d+\.(gate|up|down)_proj\.weight$")


def _moe_plan(tail: str, c: ModelConfig, rank: int, tp: int) -> tuple[str, list[int] | None]:
    inter = c.moe_intermediate_size // tp
    shared = c.shared_expert_intermediate_size // tp
    mine = _span(rank * inter, inter)
    if tail in ("gate.weight", "shared_expert_gate.weight"):
        return "replicate", None
    if tail in ("shared_expert.gate_proj.weight", "shared_expert.up_proj.weight"):
        return "rows", _span(rank * shared, shared)
    if tail == "shared_expert.down_proj.weight":
        return "cols", _span(rank * shared, shared)
    if tail in ("experts.gate_proj", "experts.up_proj"):
        return "expert_rows", mine
    if tail == "experts.gate_up_proj":
        return "expert_rows", mine + [c.moe_intermediate_size + i for i in mine]
    if tail == "experts.down_proj":
        return "expert_cols", mine
    m = _PER_EXPERT.match(tail)
    if m:
        return ("cols" if m.group(1) == "down" else "rows"), mine
    raise G906Error(f"tensor mlp.{tail}: no tensor-parallel sharding rule for it",
                    hint="this checkpoint has a tensor the tensor-parallel engine does not know")


def _contiguous(idx: list[int]) -> bool:
    return bool(idx) and idx[-1] - idx[0] + 1 == len(idx) and all(b == a + 1 for a, b in zip(idx, idx[1:]))


def quant_block_size(qtype: str) -> tuple[int, int]:
    """(elements, bytes) of one block of a GGUF type (g906/data/quant_types.toml)."""
    from g906.engine.quant.dequant import block_geometry

    return block_geometry(qtype)


def take(name: str, t, kind: str, idx: list[int] | None, tp: int):
    """Apply one shard plan to a dense tensor or a QuantizedTensor."""
    if kind == "replicate" or idx is None:
        return t
    if kind.startswith("expert_"):
        return _take_experts(name, t, kind, idx, tp)
    if isinstance(t, GroupQuantWeight):
        if kind == "rows":
            return t.select_rows(torch.as_tensor(idx, dtype=torch.long))
        return _group_quant_columns(name, t, idx, tp)
    if isinstance(t, QuantizedTensor):
        if kind == "rows":
            return t.select_rows(torch.as_tensor(idx, dtype=torch.long))
        return _quant_columns(name, t, idx, tp)
    dim = 0 if kind == "rows" else 1
    if t.dim() <= dim:
        raise G906Error(f"tensor {name} has shape {list(t.shape)}; cannot split it along dim {dim}")
    if max(idx) >= t.shape[dim]:
        raise G906Error(f"tensor {name} has shape {list(t.shape)}, too small for its tensor-parallel share "
                        f"(index {max(idx)} along dim {dim})",
                        hint="the weights do not match the model config")
    if _contiguous(idx):
        return t.narrow(dim, idx[0], len(idx))
    return t.index_select(dim, torch.as_tensor(idx, dtype=torch.long, device=t.device))


def _take_experts(name: str, t, kind: str, idx: list[int], tp: int):
    """Rows (dim 1) or input features (dim 2) of every expert of a stacked [E, N, K] weight."""
    if isinstance(t, QuantizedExperts):
        if kind == "expert_rows":
            return t.select_rows(torch.as_tensor(idx, dtype=torch.long))
        return t.select_row_bytes(_block_bytes(name, t.qtype, t.shape[2], idx, tp), len(idx))
    if isinstance(t, GroupQuantExperts):
        if kind == "expert_rows":
            return t.select_rows(torch.as_tensor(idx, dtype=torch.long))
        return _group_quant_columns(name, t, idx, tp)
    dim = 1 if kind == "expert_rows" else 2
    if t.dim() != 3 or max(idx) >= t.shape[dim]:
        raise G906Error(f"tensor {name} has shape {list(t.shape)}, not the stacked experts [E, N, K] "
                        "its tensor-parallel share is taken from", hint="the weights do not match the model config")
    if _contiguous(idx):
        return t.narrow(dim, idx[0], len(idx))
    return t.index_select(dim, torch.as_tensor(idx, dtype=torch.long, device=t.device))


def _quant_columns(name: str, t: QuantizedTensor, idx: list[int], tp: int) -> QuantizedTensor:
    """Columns (input features) of a quantized row-parallel weight: whole blocks only."""
    rows, cols = t.shape
    data = t.data.index_select(1, _block_bytes(name, t.qtype, cols, idx, tp).to(t.data.device))
    return QuantizedTensor(data, t.qtype, (rows, len(idx)))


def _block_bytes(name: str, qtype: str, cols: int, idx: list[int], tp: int) -> torch.Tensor:
    """The bytes of a row holding input features idx, which must be whole quant blocks."""
    block, nbytes = quant_block_size(qtype)
    ok = len(idx) % block == 0 and all(
        idx[i] % block == 0 and idx[i + block - 1] == idx[i] + block - 1 and _contiguous(idx[i:i + block])
        for i in range(0, len(idx), block)
    )
    if not ok:
        runs = _runs(idx)
        bad = next((r for r in runs if r[0] % block or (r[1] - r[0]) % block), runs[0])
        raise G906Error(
            f"tensor {name} ({qtype}, {block} values per block) cannot be split across {tp} ranks: "
            f"a rank's input features {bad[0]}..{bad[1] - 1} of {cols} do not fall on whole {qtype} blocks",
            hint=f"each rank's share of this tensor's input features must be whole {block}-value blocks: use "
                 "another tensor_parallel_size, or a GGUF file that stores this tensor in a type with smaller "
                 "blocks",
        )
    blocks = [i // block for i in idx[::block]]
    return torch.as_tensor([b * nbytes + j for b in blocks for j in range(nbytes)], dtype=torch.long)


def _group_quant_columns(name: str, t, idx: list[int], tp: int):
    """Input features of a group-quantized row-parallel weight: one contiguous run of whole
    groups (and words)."""
    problem = (t.column_split_problem(idx[0], len(idx)) if _contiguous(idx)
               else "a rank's input features are not one contiguous run")
    if problem:
        raise G906Error(
            f"tensor {name} ({t.scheme}) cannot be split across {tp} ranks: {problem}",
            hint="use another tensor_parallel_size (g906 validate lists the ones this checkpoint allows), "
                 "or a checkpoint quantized with a group size that divides each rank's share")
    return t.select_cols(idx[0], len(idx))


def _runs(idx: list[int]) -> list[tuple[int, int]]:
    runs = []
    start = prev = idx[0]
    for i in idx[1:]:
        if i != prev + 1:
            runs.append((start, prev + 1))
            start = i
        prev = i
    runs.append((start, prev + 1))
    return runs


def shard_weights(weights: Iterable, config: ModelConfig, rank: int, tp: int) -> Iterator:
    """(name, tensor) pairs with HF names -> the same names with rank's share of each tensor.
    Multi-token-prediction (mtp.*) and vision tensors pass through untouched (the text model
    does not run them)."""
    for name, t in weights:
        if name.startswith("mtp.") or ".visual." in f".{name}" or "vision_tower" in name:
            yield name, t
            continue
        kind, idx = shard_plan(name, config, rank, tp)
        yield name, take(name, t, kind, idx, tp)
