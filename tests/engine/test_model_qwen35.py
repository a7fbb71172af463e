"""The g906 Qwen3.5 model against transformers' implementation (tiny random models, fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from g906.arch import config_from_hf
from g906.engine.loader import load_model
from g906.engine.models.qwen35 import Qwen35ForCausalLM

from .conftest import TinyRunner, build_tiny_qwen35, hf_greedy, hf_logits, random_prompt, rel_err

pytestmark = pytest.mark.usefixtures("torch_one_thread")

TOL = 1e-4
PROMPT_LENGTHS = [1, 17, 300]


@pytest.fixture(scope="session")
def g906_tiny(tiny_qwen35_hf_dir):
    return load_model(str(tiny_qwen35_hf_dir), device="cpu", progress=False)


@pytest.fixture()
def runner(g906_tiny):
    return TinyRunner(g906_tiny.model, max_seqs=4, max_len=512, block_size=16)


@pytest.fixture(scope="session")
def hf_refs(tiny_qwen35_hf_model):
    """Reference last-position logits and greedy continuations, computed once."""
    cache: dict = {}

    def get(kind: str, length: int):
        key = (kind, length)
        if key not in cache:
            prompt = random_prompt(length, seed=length)
            if kind == "logits":
                cache[key] = hf_logits(tiny_qwen35_hf_model, prompt)
            else:
                cache[key] = hf_greedy(tiny_qwen35_hf_model, prompt, 32)
        return cache[key]

    return get


def test_loaded_info(g906_tiny, tiny_qwen35_hf_model):
    assert g906_tiny.source_format == "hf"
    assert g906_tiny.info["dtype"] == "float32"
    n = sum(p.numel() for p in tiny_qwen35_hf_model.parameters())
    assert g906_tiny.info["weight_bytes"] == n * 4
    assert g906_tiny.config.layer_types == tiny_qwen35_hf_model.config.layer_types


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_prefill_logits_match_transformers(runner, hf_refs, length):
    prompt = random_prompt(length, seed=length)
    got = runner.step([0], [prompt])[0]
    assert rel_err(got, hf_refs("logits", length)[-1]) < TOL


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_greedy_32_matches_transformers(runner, hf_refs, length):
    prompt = random_prompt(length, seed=length)
    assert runner.greedy(1, prompt, 32) == hf_refs("greedy", length)


def _decode_steps_match(runner, hf_model, steps):
    """A 14-token prompt into slot 2, then `steps` decode steps, each step's logits against
    transformers (not only the argmax; 6 steps cross a KV block boundary)."""
    prompt = random_prompt(14, seed=5)
    runner.step([2], [prompt])
    seq = list(prompt)
    for tok in random_prompt(steps, seed=6):
        seq.append(tok)
        got = runner.step([2], [[tok]], is_prefill=False)[0]
        assert rel_err(got, hf_logits(hf_model, seq)[-1]) < TOL


def test_decode_logits_match_transformers(runner, tiny_qwen35_hf_model):
    _decode_steps_match(runner, tiny_qwen35_hf_model, 6)


def test_flat_batch_equals_each_alone(g906_tiny, hf_refs):
    lengths = [17, 1, 300, 70]
    prompts = [random_prompt(n, seed=n) for n in lengths]
    batched = TinyRunner(g906_tiny.model, max_seqs=4)
    together = batched.step([0, 1, 2, 3], prompts)
    for i, p in enumerate(prompts):
        alone = TinyRunner(g906_tiny.model, max_seqs=4).step([i], [p])[0]
        assert rel_err(together[i], alone) < 1e-5
    assert rel_err(together[0], hf_refs("logits", 17)[-1]) < TOL
    assert rel_err(together[2], hf_refs("logits", 300)[-1]) < TOL
    # batched decode steps for all four sequences, against each sequence decoded alone
    toks = [[int(t)] for t in together.argmax(-1)]
    step2 = batched.step([0, 1, 2, 3], toks, is_prefill=False)
    for i, p in enumerate(prompts):
        r = TinyRunner(g906_tiny.model, max_seqs=4)
        r.step([i], [p])
        assert rel_err(step2[i], r.step([i], [toks[i]], is_prefill=False)[0]) < 1e-5


def test_chunked_prefill_equals_one_shot(g906_tiny, hf_refs):
    prompt = random_prompt(300, seed=300)
    one = TinyRunner(g906_tiny.model).step([0], [prompt])[0]
    r = TinyRunner(g906_tiny.model)
    for i in range(0, 300, 100):
        chunked = r.step([0], [prompt[i : i + 100]])[0]
    assert rel_err(chunked, one) < 1e-5
    assert rel_err(chunked, hf_refs("logits", 300)[-1]) < TOL
    # a continuing chunk and a fresh sequence in one flat batch
    r = TinyRunner(g906_tiny.model)
    r.step([0], [prompt[:130]])
    other = random_prompt(17, seed=17)
    mixed = r.step([0, 3], [prompt[130:], other])
    assert rel_err(mixed[0], one) < 1e-5
    assert rel_err(mixed[1], hf_refs("logits", 17)[-1]) < TOL
    # and greedy decoding continues from the chunked state
    assert r.greedy(1, prompt, 32, prefill_chunk=100) == hf_refs("greedy", 300)


@pytest.mark.parametrize("split_norms", [False, True])
def test_no_cache_run_matches(tiny_qwen35_hf_dir, hf_refs, monkeypatch, split_norms):
    """Without a bound cache (a memory-profiling run) fresh sequences still compute right,
    also with the layers' inputs as NormedInputs (the split norms forced on)."""
    from g906.engine.context import ForwardContext
    from g906.engine.layers import ops

    if split_norms:
        monkeypatch.setattr(ops, "linear_fuses_norm", lambda x, w: True)
    lm = load_model(str(tiny_qwen35_hf_dir), device="cpu", progress=False)
    p1, p2 = random_prompt(300, seed=300), random_prompt(17, seed=17)
    n = len(p1) + len(p2)
    ctx = ForwardContext(
        is_prefill=True,
        cu_seqlens_q=torch.tensor([0, len(p1), n], dtype=torch.int32),
        seq_lens=torch.tensor([len(p1), len(p2)], dtype=torch.int32),
        context_lens=torch.zeros(2, dtype=torch.int32),
        slot_mapping=torch.full((n,), -1, dtype=torch.int64),
        block_tables=torch.zeros(2, 1, dtype=torch.int32),
        state_slots=torch.tensor([0, 1], dtype=torch.int32),
        has_initial_state=torch.zeros(2, dtype=torch.bool),
        max_seqlen_q=len(p1),
        max_seqlen_k=len(p1),
    )
    pos = torch.cat([torch.arange(len(p1)), torch.arange(len(p2))])
    hidden = lm.model(torch.tensor(p1 + p2), pos, ctx)
    logits = lm.model.compute_logits(hidden[[len(p1) - 1, n - 1]])
    assert rel_err(logits[0], hf_refs("logits", 300)[-1]) < TOL
    assert rel_err(logits[1], hf_refs("logits", 17)[-1]) < TOL


def test_independent_reference_ops_agree(g906_tiny, hf_refs, monkeypatch):
    """layers/reference.py (written apart from g906.kernels) gives the same model output."""
    from g906.engine.layers import ops, reference

    for name in ("causal_conv1d_decode", "causal_conv1d_prefill", "conv_gated_delta_rule_decode",
                 "gated_delta_rule_decode",
                 "gated_delta_rule_prefill", "gated_delta_rule_recurrent", "gated_rms_norm", "linear", "paged_decode_attention",
                 "prefill_attention", "qk_norm_rotary", "rms_norm", "rotary_", "silu_and_mul",
                 "store_kv"):
        monkeypatch.setattr(ops, name, getattr(reference, name))
    r = TinyRunner(g906_tiny.model)
    prompt = random_prompt(300, seed=300)
    for i in range(0, 300, 100):
        got = r.step([0], [prompt[i : i + 100]])[0]
    assert rel_err(got, hf_refs("logits", 300)[-1]) < TOL
    assert r.greedy(1, random_prompt(17, seed=17), 32) == hf_refs("greedy", 17)


def test_norms_split_over_the_projections(g906_tiny, tiny_qwen35_hf_model, hf_refs, monkeypatch):
    """Every step with the RMSNorms split over the projections around them (the decode GEMVs'
    add_norm / rms_of, computed here by the reference ops): the same logits and tokens."""
    from g906.engine.layers import ops

    monkeypatch.setattr(ops, "linear_fuses_norm", lambda x, w: True)
    seen = {"add_norm": 0, "rms_of": 0}

    def counted(fn):
        def call(*a, **kw):
            for k in seen:
                seen[k] += kw.get(k) is not None
            return fn(*a, **kw)
        return call

    for name in ("linear", "silu_mul_linear", "gated_norm_linear"):
        monkeypatch.setattr(ops, name, counted(getattr(ops, name)))
    r = TinyRunner(g906_tiny.model)
    assert rel_err(r.step([0], [random_prompt(300, seed=300)])[0], hf_refs("logits", 300)[-1]) < TOL
    layers = g906_tiny.model.config.num_hidden_layers
    # every norm but the first layer's input norm and the final one
    assert seen == {"add_norm": 2 * layers - 1, "rms_of": 2 * layers - 1}
    _decode_steps_match(r, tiny_qwen35_hf_model, 4)
    assert r.greedy(1, random_prompt(17, seed=17), 32) == hf_refs("greedy", 17)


# ------------------------------------------------------------------------------------------
# checkpoint layouts


def _tiled_state_dict(hf_model) -> dict[str, torch.Tensor]:
    """The HF weights with linear-attention value heads reordered the way llama.cpp's GGUF
    converter stores them: file head p = (i, kh) -> HF head kh * ratio + i, p = i * Hk + kh."""
    cfg = hf_model.config
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = hv // hk
    perm = torch.tensor([(p % hk) * r + p // hk for p in range(hv)])
    rows = (perm[:, None] * dv + torch.arange(dv)[None, :]).reshape(-1)  # per-head rows of Dv
    key_dim = hk * dk
    sd = {k: v.clone() for k, v in hf_model.state_dict().items()}
    for i, t in enumerate(cfg.layer_types):
        if t != "linear_attention":
            continue
        p = f"model.layers.{i}.linear_attn."
        qkv = sd[p + "in_proj_qkv.weight"]
        sd[p + "in_proj_qkv.weight"] = torch.cat([qkv[: 2 * key_dim], qkv[2 * key_dim:][rows]])
        conv = sd[p + "conv1d.weight"]
        sd[p + "conv1d.weight"] = torch.cat([conv[: 2 * key_dim], conv[2 * key_dim:][rows]])
        sd[p + "in_proj_z.weight"] = sd[p + "in_proj_z.weight"][rows]
        for name in ("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
            sd[p + name] = sd[p + name][perm]
        sd[p + "out_proj.weight"] = sd[p + "out_proj.weight"][:, rows]
    return sd


def test_tiled_v_head_order_gives_identical_logits(g906_tiny, tiny_qwen35_hf_model, hf_refs):
    cfg = config_from_hf(tiny_qwen35_hf_model.config.to_dict())
    cfg.linear_v_head_order = "tiled"
    model = Qwen35ForCausalLM(cfg, dtype=torch.float32, device="cpu")
    model.load_weights(_tiled_state_dict(tiny_qwen35_hf_model).items())
    prompt = random_prompt(300, seed=300)
    tiled = TinyRunner(model)
    got = tiled.step([0], [prompt])[0]
    grouped = TinyRunner(g906_tiny.model).step([0], [prompt])[0]
    assert rel_err(got, grouped) < 1e-6
    assert rel_err(got, hf_refs("logits", 300)[-1]) < TOL
    assert tiled.greedy(1, random_prompt(17, seed=17), 32) == hf_refs("greedy", 17)
    # the grouped reading of tiled weights is wrong: the test does see the order
    cfg2 = config_from_hf(tiny_qwen35_hf_model.config.to_dict())
    wrong = Qwen35ForCausalLM(cfg2, dtype=torch.float32, device="cpu")
    wrong.load_weights(_tiled_state_dict(tiny_qwen35_hf_model).items())
    assert rel_err(TinyRunner(wrong).step([0], [prompt])[0], grouped) > 1e-2


def test_multimodal_checkpoint_loads_text_part(tiny_qwen35_vl_hf_dir, tiny_qwen35_vl_hf_model, hf_refs):
    import json

    names = json.loads((tiny_qwen35_vl_hf_dir / "config.json").read_text())
    assert "text_config" in names and "vision_config" in names
    lm = load_model(str(tiny_qwen35_vl_hf_dir), device="cpu", progress=False)
    assert lm.config.image_token_id is not None
    prompt = random_prompt(17, seed=17)
    got = TinyRunner(lm.model).step([0], [prompt])[0]
    assert rel_err(got, hf_refs("logits", 17)[-1]) < TOL
    with torch.no_grad():
        vl = tiny_qwen35_vl_hf_model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0, -1]
    assert rel_err(got, vl) < TOL


def test_tied_embeddings(tmp_path):
    hf = build_tiny_qwen35(seed=3, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu", progress=False)
    assert lm.model.lm_head is None
    prompt = random_prompt(17, seed=1)
    got = TinyRunner(lm.model).step([0], [prompt])[0]
    assert rel_err(got, hf_logits(hf, prompt)[-1]) < TOL


def test_sharded_bf16_checkpoint(tmp_path, tiny_qwen35_hf_model):
    """model.safetensors.index.json + several shards, BF16 on disk, computed in fp32."""
    import copy

    hf16 = copy.deepcopy(tiny_qwen35_hf_model).to(torch.bfloat16)
    hf16.save_pretrained(tmp_path, max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    lm = load_model(str(tmp_path), device="cpu", progress=False)
    ref = hf16.to(torch.float32)
    prompt = random_prompt(17, seed=17)
    got = TinyRunner(lm.model).step([0], [prompt])[0]
    assert rel_err(got, hf_logits(ref, prompt)[-1]) < TOL


def test_mtp_weights_are_kept_not_run(tiny_qwen35_hf_model, hf_refs):
    cfg = config_from_hf(tiny_qwen35_hf_model.config.to_dict())
    extra = [("mtp.fc.weight", torch.randn(64, 128)), ("mtp.norm.weight", torch.randn(64))]
    dropped = Qwen35ForCausalLM(cfg, dtype=torch.float32, device="cpu")
    stats = dropped.load_weights(list(tiny_qwen35_hf_model.state_dict().items()) + extra)
    assert stats["mtp_tensors"] == 2 and stats["mtp_kept"] == 0 and not dropped.mtp_weights
    model = Qwen35ForCausalLM(cfg, dtype=torch.float32, device="cpu", keep_mtp=True)
    stats = model.load_weights(list(tiny_qwen35_hf_model.state_dict().items()) + extra)
    assert stats["mtp_kept"] == 2 and set(model.mtp_weights) == {"mtp.fc.weight", "mtp.norm.weight"}
    got = TinyRunner(model).step([0], [random_prompt(17, seed=17)])[0]
    assert rel_err(got, hf_refs("logits", 17)[-1]) < TOL


def test_quantized_q8_0_weights(tiny_qwen35_hf_model):
    """Q8_0 linear and embedding weights stay QuantizedTensor and match transformers run on
    the dequantized weights."""
    import copy

    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from g906.engine.weights import QuantizedTensor

    sd = tiny_qwen35_hf_model.state_dict()
    ref = copy.deepcopy(tiny_qwen35_hf_model)
    ref_sd = ref.state_dict()
    weights = []
    qt = GGMLQuantizationType.Q8_0
    for name, t in sd.items():
        # two tensors of layer 0 stay dense: mixed types cannot be stacked into one matmul
        keep_dense = name in ("model.layers.0.mlp.up_proj.weight", "model.layers.0.linear_attn.in_proj_b.weight")
        if t.dim() == 2 and ("proj" in name or "embed_tokens" in name or "lm_head" in name) and not keep_dense:
            raw = quantize(t.numpy(), qt)
            with torch.no_grad():
                ref_sd[name].copy_(torch.from_numpy(dequantize(raw, qt).reshape(t.shape).copy()))
            weights.append((name, QuantizedTensor(torch.from_numpy(np.ascontiguousarray(raw)), "Q8_0", tuple(t.shape))))
        else:
            weights.append((name, t))
    cfg = config_from_hf(tiny_qwen35_hf_model.config.to_dict())
    model = Qwen35ForCausalLM(cfg, dtype=torch.float32, device="cpu")
    stats = model.load_weights(weights)
    assert stats["quantized_tensors"] > 20
    layers = model.model.layers
    # layer 0: the Q8_0 qkv, z and a stack, the dense b runs alone (one matmul per kind)
    la0 = layers[0].linear_attn
    assert [idx for idx, _ in la0.in_proj.stacks] == [[0, 1, 3]] and la0.in_proj_qkv.weight is None
    assert isinstance(la0.in_proj_b.weight, torch.Tensor) and layers[0].mlp.gate_up_weight is None
    assert [(idx, type(w)) for idx, w in layers[2].linear_attn.in_proj.stacks] == [([0, 1, 2, 3], QuantizedTensor)]
    assert [(idx, type(w)) for idx, w in layers[1].self_attn.qkv.stacks] == [([0, 1, 2], QuantizedTensor)]
    assert isinstance(layers[1].mlp.gate_up_weight, QuantizedTensor)
    assert isinstance(model.model.embed_tokens.weight, QuantizedTensor)
    prompt = random_prompt(70, seed=70)
    r = TinyRunner(model)
    got = r.step([0], [prompt])[0]
    assert rel_err(got, hf_logits(ref, prompt)[-1]) < TOL
    assert r.greedy(1, prompt[:17], 16) == hf_greedy(ref, prompt[:17], 16)
