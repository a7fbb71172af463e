"""PyTorch reference of the routed experts (g906.kernels.moe).

Expert weights are stacked along a leading expert axis in one of these forms:
- a dense tensor [E, N, K] (fp16 / bf16 / fp32);
- GGUF blocks: an object with data (uint8 [E, N, row_bytes]), qtype and shape (E, N, K), such
  as g906.engine.weights.QuantizedExperts;
- any other container with `dequantize_experts(ids) -> float32 [len(ids), N, K]`: how another
  weight format plugs in (the Triton kernels take the call only for the first two forms).
w_gate_up is [gate; up] per expert ([E, 2I, H]) or a pair (gate, up) of [E, I, H] weights that
could not be stacked (two storage types)."""

from __future__ import annotations

import torch

from ..linear.gguf_blocks import dequantize


def dequantize_experts(w, ids: torch.Tensor) -> torch.Tensor:
    """float32 [len(ids), N, K]: the weights of experts ids, decoded (only those)."""
    if isinstance(w, torch.Tensor):
        return w.index_select(0, ids.to(w.device)).float()
    own = getattr(w, "dequantize_experts", None)
    if own is not None:
        return own(ids)
    _, n, k = w.shape
    rows = w.data.index_select(0, ids.to(w.data.device))
    return dequantize(rows.reshape(-1, rows.shape[-1]), w.qtype, (ids.numel() * n, k)).reshape(-1, n, k)


def _expert(w, e: int) -> torch.Tensor:
    """float32 [N, K] of expert e: a view of a dense fp32 weight (nothing copied), else decoded."""
    if isinstance(w, tuple):
        return torch.cat([_expert(p, e) for p in w], dim=0)
    if isinstance(w, torch.Tensor):
        return w[e].float()
    return dequantize_experts(w, torch.tensor([e]))[0]


def moe_experts(x, w_gate_up, w_down, topk_ids, topk_weights):
    """y [T, H] (x's dtype): sum over j of topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))
    with e = topk_ids[t, j]; fp32 math. x [T, H]; topk_ids int [T, k]; topk_weights [T, k].
    Only the chosen experts' weights are read, one expert at a time."""
    T, k = topk_ids.shape
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    if T == 0:
        return out.to(x.dtype)
    flat = topk_ids.reshape(-1).long()
    xf = x.float()
    wf = topk_weights.reshape(-1).float()
    if T == 1:   # decode: the k chosen experts one after the other, few ops each
        for e, w in zip(flat.tolist(), wf.tolist()):
            gu = _expert(w_gate_up, e)
            inter = gu.shape[0] // 2
            h = xf @ gu.t()
            h = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
            out += (h @ _expert(w_down, e).t()) * w
        return out.to(x.dtype)
    for e in torch.unique(flat).tolist():
        pairs = torch.nonzero(flat == e).squeeze(1)
        gu = _expert(w_gate_up, e)
        inter = gu.shape[0] // 2
        tok = pairs // k
        h = xf[tok] @ gu.t()
        h = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        out.index_add_(0, tok, (h @ _expert(w_down, e).t()) * wf[pairs, None])
    return out.to(x.dtype)


def route(router_logits, top_k: int, renormalize: bool):
    """(weights fp32 [T, k], ids int32 [T, k]): softmax over the experts (fp32), the top k, their
    weights renormalised to sum 1 when asked (transformers' qwen3_5_moe router)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids.to(torch.int32)
