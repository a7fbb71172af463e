"""Gated DeltaNet (Qwen3.5 linear attention).

in_proj_qkv -> causal depthwise conv1d (kernel K) + SiLU -> split q, k, v;
beta = sigmoid(in_proj_b x); g = -exp(A_log) * softplus(in_proj_a x + dt_bias);
gated delta rule on L2-normalised q, k (q scaled 1/sqrt(Dk)), fp32 state;
gated RMSNorm(o) * silu(in_proj_z x); out_proj.

Value heads outnumber key heads. `head_order` says which key head a value head uses:
"grouped" (HF: j // ratio) or "tiled" (llama.cpp GGUF: j % num_k_heads). All v-indexed
tensors are used in the file's order, so either layout computes without re-ordering."""

from __future__ import annotations

import torch

from g906.engine.context import ForwardContext
from g906.engine.layers import ops
from g906.engine.layers.base import WeightHolder, WeightSpec
from g906.engine.layers.linear import FusedProjections, Linear, is_packed
from g906.engine.layers.norms import AddNorm, GatedRMSNorm


# sequences of at most this many tokens take the recurrent form of the delta rule: a chunk would
# be mostly padding (g906/kernels/gdn/recurrent.py)
RECURRENT_MAX_TOKENS = 16


class Conv1dWeight(WeightHolder):
    """Depthwise conv1d weight, kept as [channels, kernel] (HF stores [channels, 1, kernel])."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.channels = channels
        self.kernel = kernel
        self.weight = None

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec((self.channels, self.kernel), alt_shapes=((self.channels, 1, self.kernel),))}


class GatedDeltaNet(WeightHolder):
    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_kernel: int,
        eps: float,
        head_order: str = "grouped",
    ):
        super().__init__()
        self.num_k_heads = num_k_heads
        self.num_v_heads = num_v_heads
        self.head_k_dim = head_k_dim
        self.head_v_dim = head_v_dim
        self.key_dim = num_k_heads * head_k_dim
        self.value_dim = num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.head_order = head_order
        self.in_proj_qkv = Linear(hidden_size, self.conv_dim)
        self.in_proj_z = Linear(hidden_size, self.value_dim)
        self.in_proj_b = Linear(hidden_size, num_v_heads)
        self.in_proj_a = Linear(hidden_size, num_v_heads)
        self.conv1d = Conv1dWeight(self.conv_dim, conv_kernel)
        self.norm = GatedRMSNorm(head_v_dim, eps)
        self.out_proj = Linear(self.value_dim, hidden_size)
        self.in_proj = FusedProjections([self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a])
        self.A_log = None
        self.dt_bias = None
        self.conv_state: torch.Tensor | None = None  # [S, conv_dim, K] rings, set by bind_cache
        self.ssm_state: torch.Tensor | None = None   # [S, Hv, Dk, Dv] fp32
        self._kept = None    # a verify step's states before it and its inputs (_keep, rollback)

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {
            "A_log": WeightSpec((self.num_v_heads,), dtype=torch.float32),
            "dt_bias": WeightSpec((self.num_v_heads,), dtype=torch.float32),
        }

    def post_load(self) -> None:
        self.in_proj.fuse()

    def forward(self, x, ctx: ForwardContext, then: AddNorm | None = None):
        """x: a tensor or a NormedInput; then: as Linear.forward's."""
        qkv, z, b, a = self.in_proj(x)
        t = qkv.shape[0]
        w = self.conv1d.weight
        conv_state, ssm_state = self.conv_state, self.ssm_state
        slots, has_init = ctx.state_slots, ctx.has_initial_state
        if conv_state is None:
            # No cache bound (e.g. a memory-profiling run): fresh sequences, throw-away states.
            nseq = ctx.num_seqs
            conv_state = qkv.new_zeros(nseq, self.conv_dim, w.shape[1])
            ssm_state = torch.zeros(nseq, self.num_v_heads, self.head_k_dim, self.head_v_dim,
                                    dtype=torch.float32, device=qkv.device)
            slots = torch.arange(nseq, dtype=torch.int32, device=qkv.device)
            has_init = torch.zeros(nseq, dtype=torch.bool, device=qkv.device)
        if ctx.keep_linear_inputs:
            self._keep(qkv, a, b, ctx, conv_state, ssm_state)
        if ctx.is_prefill:
            o = self._conv_and_rule(qkv, a, b, ctx.cu_seqlens_q, conv_state, ssm_state, slots, has_init,
                                    ctx.context_lens, ctx.max_seqlen_q)
        # z stays a [t, Hv, Dv] view of the projection output (the norm reads it in place)
        z = z.view(t, self.num_v_heads, self.head_v_dim)
        if not ctx.is_prefill:  # conv step and recurrent step in one kernel on a GPU
            # a repacked (quantized) out_proj takes the norm from the step kernel; a dense
            # one in its GEMV's prologue (docs/kernels.md)
            norm_in_step = is_packed(self.out_proj.weight)
            o = ops.conv_gated_delta_rule_decode(
                qkv, w, conv_state, ctx.seq_lens, a, b, self.A_log, self.dt_bias, ssm_state, slots,
                num_k_heads=self.num_k_heads, head_k_dim=self.head_k_dim,
                v_head_order=self.head_order,
                gated_norm=(z, self.norm.weight, self.norm.eps) if norm_in_step else None,
            )
            if norm_in_step:
                return self.out_proj(o.reshape(t, self.value_dim), then)
        return self.out_proj.forward_gated_norm(o, z, self.norm, then)

    def _conv_and_rule(self, qkv, a, b, cu_seqlens, conv_state, ssm_state, slots, has_init, context_lens,
                       max_seqlen: int):
        """The causal conv and the gated delta rule over a flat varlen batch of sequences of at
        most max_seqlen tokens (their rings and states updated): token by token for sequences
        of a few tokens (a verify step, a rollback's replay), chunked for longer ones."""
        x = ops.causal_conv1d_prefill(qkv, self.conv1d.weight, cu_seqlens, conv_state, slots, has_init,
                                      context_lens)
        t = x.shape[0]
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rule = ops.gated_delta_rule_recurrent if max_seqlen <= RECURRENT_MAX_TOKENS else ops.gated_delta_rule_prefill
        return rule(q.reshape(t, self.num_k_heads, self.head_k_dim), k.reshape(t, self.num_k_heads, self.head_k_dim),
                    v.reshape(t, self.num_v_heads, self.head_v_dim), a, b, self.A_log, self.dt_bias, cu_seqlens,
                    ssm_state, slots, has_init, v_head_order=self.head_order)

    # -- speculative verification ---------------------------------------------------------------
    def _keep(self, qkv, a, b, ctx: ForwardContext, conv_state, ssm_state) -> None:
        """Before a verify step: the states of its sequences and the step's conv inputs and
        gates. Replaying the accepted prefix from these costs no projection (the GEMMs are the
        step's cost) and keeps one state copy per sequence instead of one per position."""
        rows = ctx.kept_rows
        slots = ctx.state_slots.long() if rows is None else ctx.state_slots.long().index_select(0, rows)
        self._kept = (conv_state.index_select(0, slots), ssm_state.index_select(0, slots), qkv.clone(),
                      a.clone(), b.clone(), ctx.cu_seqlens_q, ctx.state_slots, ctx.context_lens, rows,
                      ctx.max_seqlen_q)

    def rollback(self, keep: torch.Tensor, snaps: torch.Tensor | None = None) -> None:
        """End each sequence's state after its first keep[i] tokens of the kept verify step:
        restore the state from before the step and run the conv and the recurrence over those
        tokens again (exactly what a prefill of them computes). keep [B] int; a sequence that
        keeps all its tokens is left as the step wrote it. snaps [S, 3] int rows (i, n, slot):
        first write the state of sequence i after its first n tokens of the step into state
        slot `slot` (a prefix-cache snapshot at a block boundary inside the accepted tokens).
        With ctx.kept_rows, sequence i is the step's row kept_rows[i]."""
        kept, self._kept = self._kept, None
        if kept is None:
            return
        cu_l = kept[5].tolist()
        keep_l = [int(x) for x in keep.tolist()]
        row = list(range(len(keep_l))) if kept[8] is None else kept[8].tolist()
        if snaps is not None and snaps.numel():
            rows = snaps.tolist()
            self._replay(kept, [row[r[0]] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                         [r[0] for r in rows])
        redo = [i for i in range(len(keep_l)) if keep_l[i] < cu_l[row[i] + 1] - cu_l[row[i]]]
        if redo:
            slots_l = kept[6].tolist()
            self._replay(kept, [row[i] for i in redo], [keep_l[i] for i in redo], [slots_l[row[i]] for i in redo],
                         redo)

    def snapshot(self, rows: list[tuple[int, int, int]], at: list[int]) -> None:
        """rollback's snaps on their own, keeping the kept step for a rollback_padded after;
        at[j]: where row rows[j][0]'s state is among the kept ones (ctx.kept_rows)."""
        if self._kept is not None and rows:
            self._replay(self._kept, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], at)

    def rollback_padded(self, cu_keep: torch.Tensor, has_init: torch.Tensor) -> None:
        """rollback with static shapes (capturable in a graph; g906/engine/spec/verify_graphs.py):
        every row of the kept step gets its state from before the step back and replays its
        tokens up to cu_keep[i + 1] (int32 [B+1], same token order as the step, each row's
        boundary moved to its last kept token; the tokens cut off go to the next row, a filler
        row of the scratch slot). Rows that keep all their tokens recompute the state the step
        wrote (the same kernels on the same inputs)."""
        kept, self._kept = self._kept, None
        if kept is None:
            return
        conv0, ssm0, qkv, a, b, _, slots, ctx_lens, rows, width = kept
        sl = slots.long() if rows is None else slots.long().index_select(0, rows)
        self.conv_state.index_copy_(0, sl, conv0)
        self.ssm_state.index_copy_(0, sl, ssm0)
        # no row is longer than the step's width: what a row cuts off joins the filler row after it
        self._conv_and_rule(qkv, a, b, cu_keep, self.conv_state, self.ssm_state, slots, has_init, ctx_lens, width)

    def _replay(self, kept, seqs: list[int], lens: list[int], dst: list[int], at: list[int] | None = None) -> None:
        """Write into state slot dst[j] the state of kept sequence seqs[j] after its first
        lens[j] tokens of the kept step: its state from before the step, then those tokens.
        at[j]: the index of its kept state (seqs[j] when every row's state is kept)."""
        conv0, ssm0, qkv, a, b, cu, _, ctx_lens, _, _ = kept
        cu_l = cu.tolist()
        dev = qkv.device
        idx = torch.tensor(seqs, dtype=torch.long, device=dev)
        sidx = idx if at is None else torch.tensor(at, dtype=torch.long, device=dev)
        sl = torch.tensor(dst, dtype=torch.long, device=dev)
        self.conv_state.index_copy_(0, sl, conv0.index_select(0, sidx))
        self.ssm_state.index_copy_(0, sl, ssm0.index_select(0, sidx))
        rows = [r for i, n in zip(seqs, lens) for r in range(cu_l[i], cu_l[i] + n)]
        if not rows:
            return
        rows_t = torch.tensor(rows, dtype=torch.long, device=dev)
        sub_cu = [0]
        for n in lens:
            sub_cu.append(sub_cu[-1] + n)
        i32 = dict(dtype=torch.int32, device=dev)
        cu_t = torch.tensor(sub_cu, **i32)
        sl32 = sl.to(torch.int32)
        has_init = torch.ones(len(seqs), dtype=torch.bool, device=dev)
        self._conv_and_rule(qkv.index_select(0, rows_t), a.index_select(0, rows_t), b.index_select(0, rows_t), cu_t,
                            self.conv_state, self.ssm_state, sl32, has_init, ctx_lens.index_select(0, idx), max(lens))
