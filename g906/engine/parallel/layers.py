"""Parallel layers and one rank's model.

build_rank_model() makes the model (its architecture's class) of the rank's local config (heads and intermediate
size divided by tp: column-parallel projections come out the right size by themselves) and swaps
in, by module name:
  o_proj, linear_attn.out_proj, mlp.down_proj -> RowParallelLinear (partial sums, all-reduced)
  a MoE MLP (SparseMoeBlock)                 -> its comm set: it all-reduces once, after the
                                                routed and shared experts' partial sums
  model.embed_tokens                         -> VocabParallelEmbedding (rows of its vocab range)
  lm_head                                    -> a Linear of the rank's vocab rows
so that the checkpoint's HF names still find their slots, and the model's own load_weights
checks the sharded shapes. rank_logits() computes the rank's [N, P] share of the logits
(P = ceil(V/tp), zero-padded) for the gather on rank 0."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from g906.arch.config import ModelConfig
from g906.engine.layers import ops
from g906.engine.layers.embedding import Embedding
from g906.engine.layers.linear import Linear
from g906.engine.parallel.group import Comm
from g906.engine.parallel.sharding import local_config, vocab_per_rank, vocab_range


class RowParallelLinear(Linear):
    """y = all_reduce(x_r @ W_r^T): the rank holds the input features of its heads/features."""

    def __init__(self, in_features: int, out_features: int, comm: Comm):
        super().__init__(in_features, out_features)
        self.comm = comm

    def finish(self, y: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(y)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", row-parallel over {self.comm.size}"


class VocabParallelEmbedding(Embedding):
    """Rows [start, end) of the table; other ids give zeros here and come from their rank in
    the all-reduce."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, comm: Comm):
        start, end = vocab_range(vocab_size, comm.rank, comm.size)
        super().__init__(end - start, hidden_size, dtype)
        self.full_vocab = vocab_size
        self.start, self.end = start, end
        self.comm = comm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        inside = (input_ids >= self.start) & (input_ids < self.end)
        local = torch.where(inside, input_ids - self.start, torch.zeros_like(input_ids))
        if self.vocab_size == 0:
            out = torch.zeros(input_ids.shape[0], self.hidden_size, dtype=self.dtype, device=input_ids.device)
        else:
            out = super().forward(local)
            out = out * inside.unsqueeze(-1).to(out.dtype)
        return self.comm.all_reduce(out.contiguous())

    def extra_repr(self) -> str:
        return f"rows {self.start}..{self.end} of {self.full_vocab}"


def build_rank_model(config: ModelConfig, comm: Comm, *, dtype: torch.dtype, device, keep_mtp: bool = False):
    """The rank's model (global config in, local shapes out); weights not loaded."""
    from g906.engine.models import model_class

    local = local_config(config, comm.size)
    model = model_class(config)(local, dtype=dtype, device=device,
                              max_positions=config.max_position_embeddings, keep_mtp=keep_mtp)
    for layer in model.model.layers:
        if layer.layer_type == "full_attention":
            mixer, name = layer.self_attn, "o_proj"
        else:
            mixer, name = layer.linear_attn, "out_proj"
        old = getattr(mixer, name)
        setattr(mixer, name, RowParallelLinear(old.in_features, old.out_features, comm))
        if hasattr(layer.mlp, "experts"):
            layer.mlp.comm = comm   # one all-reduce of the routed + shared experts' partial sums
        else:
            old = layer.mlp.down_proj
            layer.mlp.down_proj = RowParallelLinear(old.in_features, old.out_features, comm)
    model.model.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype, comm)
    if model.lm_head is not None:
        s, e = vocab_range(config.vocab_size, comm.rank, comm.size)
        model.lm_head = Linear(config.hidden_size, e - s)
    model.tp_comm = comm
    model.global_config = config
    return model


@torch.inference_mode()
def rank_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """This rank's logits [N, P] (fp32), zero-padded to P = ceil(V/tp) columns."""
    w = model.model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    cfg = model.global_config
    per = vocab_per_rank(cfg.vocab_size, model.tp_comm.size)
    if w is None or (isinstance(w, torch.Tensor) and w.shape[0] == 0):
        return torch.zeros(hidden.shape[0], per, dtype=torch.float32, device=hidden.device)
    rows = w.shape[0]
    out = ops.linear(hidden, w).float()
    if rows < per:
        out = F.pad(out, (0, per - rows))
    return out.contiguous()
