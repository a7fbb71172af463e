"""Sparse MoE MLP of Qwen3.5 MoE (transformers' Qwen3_5MoeSparseMoeBlock): router softmax over
the experts, top-k (renormalised), the chosen experts' SwiGLU (g906.kernels.moe: only their
weights are read), plus a shared expert scaled by sigmoid(shared_expert_gate(x)).

Expert weights are stacked [E, N, K]: dense tensors, QuantizedExperts (GGUF blocks kept
quantized) or GroupQuantExperts (GPTQ / AWQ / compressed-tensors int4 / int8, kept packed).
gate and up are stacked into one [E, 2I, H] weight after loading where their storage agrees
(the SwiGLU is then fused into the kernel that computes them)."""

from __future__ import annotations

import torch
from torch import nn

from g906.engine.layers import ops
from g906.engine.layers.base import WeightHolder, WeightSpec
from g906.engine.layers.linear import Linear, plain
from g906.engine.layers.mlp import MLP
from g906.engine.weights import GroupQuantExperts, QuantizedExperts


class Experts(WeightHolder):
    """The routed experts: gate_proj, up_proj [E, I, H] and down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_proj = self.up_proj = self.down_proj = None
        self.gate_up = None          # [E, 2I, H], or (gate, up) when they do not stack

    def weight_specs(self) -> dict[str, WeightSpec]:
        E, H, inter = self.num_experts, self.hidden_size, self.intermediate_size
        return {"gate_proj": WeightSpec((E, inter, H), quantizable=True),
                "up_proj": WeightSpec((E, inter, H), quantizable=True),
                "down_proj": WeightSpec((E, H, inter), quantizable=True)}

    def set_weight(self, attr, value) -> None:
        if isinstance(value, (QuantizedExperts, GroupQuantExperts)):
            self._parameters.pop(attr, None)
            object.__setattr__(self, attr, value)
            return
        super().set_weight(attr, value)

    def post_load(self) -> None:
        g, u = self.gate_proj, self.up_proj
        if isinstance(g, torch.Tensor) and isinstance(u, torch.Tensor) and g.dtype == u.dtype:
            self.gate_up = torch.cat([g, u], dim=1)
        elif (isinstance(g, QuantizedExperts) and isinstance(u, QuantizedExperts) and g.qtype == u.qtype
              and g.data.shape[2] == u.data.shape[2]):
            self.gate_up = QuantizedExperts.cat_rows([g, u])
        elif (isinstance(g, GroupQuantExperts) and isinstance(u, GroupQuantExperts) and g.cat_key() == u.cat_key()
              and (g.perm is None or g.perm.shape[1] == 1) and (u.perm is None or u.perm.shape[1] == 1)):
            self.gate_up = GroupQuantExperts.cat_rows([g, u])
        else:
            self.gate_up = (g, u)
            return
        self.set_weight("gate_proj", None)
        self.set_weight("up_proj", None)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        return ops.moe_experts(x, self.gate_up, self.down_proj, topk_ids, topk_weights)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.hidden_size}, intermediate={self.intermediate_size}"


class GateVector(Linear):
    """The shared expert's gate: one output (HF [1, H]; GGUF may store it as [H])."""

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec((1, self.in_features), alt_shapes=((self.in_features,),))}


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, top_k: int, moe_intermediate_size: int,
                 shared_intermediate_size: int, norm_topk_prob: bool = True):
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = Linear(hidden_size, num_experts)            # the router
        self.experts = Experts(num_experts, hidden_size, moe_intermediate_size)
        self.shared_expert = MLP(hidden_size, shared_intermediate_size)
        self.shared_expert_gate = GateVector(hidden_size, 1)
        # tensor parallelism: each rank holds a slice of every expert's (and the shared
        # expert's) features; their partial sums are all-reduced once here
        self.comm = None

    def forward(self, x, then=None) -> torch.Tensor:
        """x: a tensor or a NormedInput (its norm is computed: the router, the experts and the
        shared expert all read it). Returns the block's output (then is left to the caller)."""
        x = plain(x)
        weights, ids = ops.moe_route(ops.linear(x, self.gate.weight), self.top_k, self.norm_topk_prob)
        routed = self.experts(x, ids, weights)
        shared = self.shared_expert(x)
        gate = torch.sigmoid(ops.linear(x, self.shared_expert_gate.weight).float())
        y = (routed.float() + gate * shared.float()).to(x.dtype)
        if self.comm is not None:
            y = self.comm.all_reduce(y)
        return y
