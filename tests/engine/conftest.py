"""Shared engine fixtures: a tiny random Qwen3.5 built with transformers (CPU, fp32), saved as
Hugging Face directories, plus a minimal cache-backed runner for driving the g906 model.

Fixtures (session-scoped):
  tiny_qwen35_hf_model   transformers Qwen3_5ForCausalLM (eval, fp32), the reference
  tiny_qwen35_hf_dir     its save_pretrained directory (config.json + model.safetensors)
  tiny_qwen35moe_hf_model / tiny_qwen35moe_hf_dir
                         Qwen3_5MoeForCausalLM (MOE_OVERRIDES: 16 experts, top-4, hidden 256)
  tiny_qwen35_vl_hf_model / tiny_qwen35_vl_hf_dir
                         Qwen3_5ForConditionalGeneration with a tiny vision tower and the same
                         text weights (checkpoint names model.language_model.*, model.visual.*)
The tiny model: 4 layers (linear, full, linear, full), hidden 64, 4 query heads / 2 KV heads of
dim 32 (rotary 8), 2 key heads / 4 value heads of dim 16 for linear attention, vocab 512,
rope_theta 10000; every norm weight, A_log, dt_bias and the conv kernel are randomised after
init so that offset or ordering mistakes show."""

from __future__ import annotations

import math

import pytest
import torch

from g906.engine.context import ForwardContext

TINY_VOCAB = 512


def tiny_text_config_kwargs(**over) -> dict:
    kw = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        eos_token_id=TINY_VOCAB - 1,
        bos_token_id=None,
    )
    kw.update(over)
    return kw


@torch.no_grad()
def randomise_qwen35(model, seed: int = 0) -> None:
    """Unit-scale random weights everywhere (so every op matters for the logits), with
    non-default norm weights, A_log, dt_bias and conv kernels."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(math.log(0.05), math.log(4.0), generator=g))
        elif name.endswith("dt_bias"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif name.endswith("linear_attn.norm.weight"):  # gated norm: plain weight
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
        elif "norm" in name:  # zero-centred norms (1 + w)
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        elif "conv1d" in name:
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        elif "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        elif p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        elif p.dim() >= 1:
            p.copy_(0.1 * torch.randn(p.shape, generator=g))


def build_tiny_qwen35(seed: int = 0, **over):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(**tiny_text_config_kwargs(**over))
    model = Qwen3_5ForCausalLM(cfg).eval().to(torch.float32)
    randomise_qwen35(model, seed)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


@pytest.fixture(scope="module")
def torch_one_thread():
    """Tiny tensors: intra-op threads only add overhead, and suffer badly on a busy machine.
    Use with pytestmark = pytest.mark.usefixtures("torch_one_thread")."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_qwen35_hf_model():
    return build_tiny_qwen35(seed=0)


@pytest.fixture(scope="session")
def tiny_qwen35_hf_dir(tiny_qwen35_hf_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-qwen35-hf")
    tiny_qwen35_hf_model.save_pretrained(d)
    return d


@torch.no_grad()
def build_tiny_qwen35_vl(text):
    """transformers Qwen3_5ForConditionalGeneration (the multimodal form the releases use) whose
    language model and lm_head are the tiny text model's, with a tiny random vision tower."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    cfg = Qwen3_5Config(
        text_config=tiny_text_config_kwargs(),
        vision_config=dict(
            depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
            patch_size=8, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
        ),
        image_token_id=TINY_VOCAB - 4,
        video_token_id=TINY_VOCAB - 5,
        vision_start_token_id=TINY_VOCAB - 3,
        vision_end_token_id=TINY_VOCAB - 2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1)
    model = Qwen3_5ForConditionalGeneration(cfg).eval().to(torch.float32)
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.weight.copy_(text.lm_head.weight)
    return model


@pytest.fixture(scope="session")
def tiny_qwen35_vl_hf_model(tiny_qwen35_hf_model):
    return build_tiny_qwen35_vl(tiny_qwen35_hf_model)


@pytest.fixture(scope="session")
def tiny_qwen35_vl_hf_dir(tiny_qwen35_vl_hf_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-qwen35-vl-hf")
    tiny_qwen35_vl_hf_model.save_pretrained(d)
    return d


# A tiny Qwen3.5 MoE whose every expert row is a whole number of 256-element super-blocks
# (K-quants): 16 experts, top-4, experts and shared expert of 256 features.
MOE_OVERRIDES = dict(
    hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=64,
    num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256, shared_expert_intermediate_size=256,
)


@torch.no_grad()
def build_tiny_qwen35moe(seed: int = 0, **over):
    """transformers Qwen3_5MoeForCausalLM (eval, fp32) with randomised weights; the router gets
    a larger scale so that the top-k choice is clear-cut (no ties a rounding could flip)."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    kw = tiny_text_config_kwargs(**{**MOE_OVERRIDES, **over})
    kw.pop("intermediate_size")
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**kw)).eval().to(torch.float32)
    randomise_qwen35(model, seed)
    g = torch.Generator().manual_seed(seed + 100)
    for name, p in model.named_parameters():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        elif name.endswith("mlp.gate.weight"):
            p.copy_(4 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return model


@pytest.fixture(scope="session")
def tiny_qwen35moe_hf_model():
    return build_tiny_qwen35moe(seed=0)


@pytest.fixture(scope="session")
def tiny_qwen35moe_hf_dir(tiny_qwen35moe_hf_model, tmp_path_factory):
    """save_pretrained directory: experts one tensor each, as on the Hub."""
    d = tmp_path_factory.mktemp("tiny-qwen35moe-hf")
    tiny_qwen35moe_hf_model.save_pretrained(d)
    return d


# ------------------------------------------------------------------------------------------
# reference outputs from transformers


@torch.no_grad()
def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    """All-position logits [L, V] from one transformers forward (no cache)."""
    out = hf_model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


@torch.no_grad()
def hf_greedy(hf_model, ids: list[int], n: int) -> list[int]:
    """Greedy continuation by full recomputation (independent of transformers' cache path)."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(hf_logits(hf_model, seq)[-1].argmax()))
    return seq[len(ids):]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------
# a minimal runner over the g906 model and its cache (trivial block tables; the real scheduler
# and block manager are engine II's)


class TinyRunner:
    """Drives Qwen35ForCausalLM: sequence i owns blocks [i*M, (i+1)*M) and state slot i."""

    def __init__(self, model, *, max_seqs: int = 4, max_len: int = 512, block_size: int = 16):
        from g906.engine.cache import ModelCache

        self.model = model
        self.block_size = block_size
        self.blocks_per_seq = (max_len + block_size - 1) // block_size
        self.cache = ModelCache.allocate(
            model.config, num_blocks=max_seqs * self.blocks_per_seq, block_size=block_size,
            num_state_slots=max_seqs, dtype=model.dtype, device=model.device,
        )
        model.bind_cache(self.cache)
        self.lens = [0] * max_seqs

    def block_table(self, seq: int) -> list[int]:
        # interleave the blocks of different sequences so that paging mistakes show
        return [b * (len(self.lens)) + seq for b in range(self.blocks_per_seq)]

    def _ctx(self, seqs: list[int], new: list[int], is_prefill: bool):
        dev = self.model.device
        cu = [0]
        for n in new:
            cu.append(cu[-1] + n)
        ctx_lens = [self.lens[s] for s in seqs]
        seq_lens = [c + n for c, n in zip(ctx_lens, new)]
        slots, positions = [], []
        for s, c, n in zip(seqs, ctx_lens, new):
            bt = self.block_table(s)
            for p in range(c, c + n):
                slots.append(bt[p // self.block_size] * self.block_size + p % self.block_size)
                positions.append(p)
        ctx = ForwardContext(
            is_prefill=is_prefill,
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor([self.block_table(s) for s in seqs], dtype=torch.int32, device=dev),
            state_slots=torch.tensor(seqs, dtype=torch.int32, device=dev),
            has_initial_state=torch.tensor([c > 0 for c in ctx_lens], dtype=torch.bool, device=dev),
            max_seqlen_q=max(new),
            max_seqlen_k=max(seq_lens),
        )
        return ctx, torch.tensor(positions, dtype=torch.long, device=dev), seq_lens

    def step(self, seqs: list[int], tokens: list[list[int]], is_prefill: bool = True) -> torch.Tensor:
        """Run new tokens of several sequences in one flat batch; returns the last-position
        logits of each sequence [B, V] (fp32)."""
        if self.model.cache is not self.cache:  # another runner bound its cache meanwhile
            self.model.bind_cache(self.cache)
        new = [len(t) for t in tokens]
        for s in seqs:
            if self.lens[s] == 0:
                self.cache.reset_slots([s])
        ctx, positions, seq_lens = self._ctx(seqs, new, is_prefill)
        ids = torch.tensor([t for ts in tokens for t in ts], dtype=torch.long, device=self.model.device)
        hidden = self.model(ids, positions, ctx)
        last = ctx.cu_seqlens_q[1:].long() - 1
        for s, L in zip(seqs, seq_lens):
            self.lens[s] = L
        return self.model.compute_logits(hidden[last])

    def release(self, seq: int) -> None:
        self.lens[seq] = 0

    def greedy(self, seq: int, prompt: list[int], n: int, prefill_chunk: int | None = None) -> list[int]:
        self.release(seq)
        chunk = prefill_chunk or len(prompt)
        for i in range(0, len(prompt), chunk):
            logits = self.step([seq], [prompt[i : i + chunk]], is_prefill=True)
        out = []
        for _ in range(n):
            tok = int(logits[0].argmax())
            out.append(tok)
            logits = self.step([seq], [[tok]], is_prefill=False)
        return out


def random_prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY_VOCAB, (length,), generator=g).tolist()


def assert_matches_transformers(model, hf_model, greedy_tokens: int) -> None:
    """g906's logits equal transformers' (1e-4) for a one-token prompt (the decode routes) and a
    21-token one (the prefill routes), and its greedy continuation of a third prompt is theirs."""
    runner = TinyRunner(model, max_seqs=2, max_len=96)
    for n, seed in ((1, 3), (21, 4)):
        p = random_prompt(n, seed)
        runner.release(0)
        logits = runner.step([0], [p])[0]
        assert rel_err(logits, hf_logits(hf_model, p)[-1]) < 1e-4
    p = random_prompt(13, 5)
    assert runner.greedy(1, p, greedy_tokens) == hf_greedy(hf_model, p, greedy_tokens)
