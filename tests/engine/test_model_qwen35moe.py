"""Qwen3.5 MoE against transformers' qwen3_5_moe (tiny random models, fp32, CPU): from the HF
checkpoint (experts one tensor each, as on the Hub, and fused as transformers holds them) and
from GGUF files written as llama.cpp's converter writes qwen35moe (F16, Q8_0, Q4_K experts kept
quantized; references from gguf-py's dequantization of the file)."""

from __future__ import annotations

import copy

import pytest
import torch

from g906.arch import config_from_hf_dir
from g906.engine.loader import load_model
from g906.engine.loaders.gguf import GGUFModelFile
from g906.engine.models.qwen35moe import Qwen35MoeForCausalLM
from g906.engine.weights import QuantizedExperts
from g906.errors import G906Error

from .conftest import TinyRunner, hf_greedy, hf_logits, random_prompt, rel_err
from .gguf_writer import gguf_name, reorder_v_heads, write_gguf

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _load(path, **kw):
    return load_model(str(path), device="cpu", dtype="float32", progress=False, **kw)


@pytest.fixture(scope="module")
def moe_hf(tiny_qwen35moe_hf_dir):
    return _load(tiny_qwen35moe_hf_dir)


def test_config_from_hf(tiny_qwen35moe_hf_dir, moe_hf):
    c = config_from_hf_dir(tiny_qwen35moe_hf_dir)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size) \
        == (16, 4, 256, 256)
    assert c.is_moe and c.norm_topk_prob and c.architecture == "Qwen3_5MoeForCausalLM"
    assert isinstance(moe_hf.model, Qwen35MoeForCausalLM)


@pytest.mark.parametrize("length", [1, 23, 70])
def test_hf_greedy_matches_transformers(moe_hf, tiny_qwen35moe_hf_model, length):
    runner = TinyRunner(moe_hf.model, max_seqs=2, max_len=128)
    p = random_prompt(length, seed=length)
    got = runner.step([0], [p])[0]
    assert rel_err(got, hf_logits(tiny_qwen35moe_hf_model, p)[-1]) < 1e-4
    assert runner.greedy(1, p, 10) == hf_greedy(tiny_qwen35moe_hf_model, p, 10)


def test_batched_decode_matches_single(moe_hf, tiny_qwen35moe_hf_model):
    """Two sequences in one flat batch (tokens of both routed in one grouped call)."""
    runner = TinyRunner(moe_hf.model, max_seqs=2, max_len=64)
    a, b = random_prompt(9, 1), random_prompt(14, 2)
    out = runner.step([0, 1], [a, b])
    assert rel_err(out[0], hf_logits(tiny_qwen35moe_hf_model, a)[-1]) < 1e-4
    assert rel_err(out[1], hf_logits(tiny_qwen35moe_hf_model, b)[-1]) < 1e-4


def test_fused_expert_tensors_load(tiny_qwen35moe_hf_model):
    """The fused form transformers holds in memory (gate_up_proj [E, 2I, H]) loads as well."""
    lm = Qwen35MoeForCausalLM(config_from_hf_dir_like(tiny_qwen35moe_hf_model), dtype=torch.float32)
    lm.load_weights(tiny_qwen35moe_hf_model.state_dict().items())
    p = random_prompt(12, 4)
    got = TinyRunner(lm, max_seqs=1, max_len=64).step([0], [p])[0]
    assert rel_err(got, hf_logits(tiny_qwen35moe_hf_model, p)[-1]) < 1e-4


def config_from_hf_dir_like(model):
    from g906.arch import config_from_hf

    d = model.config.to_dict()
    d["architectures"] = ["Qwen3_5MoeForCausalLM"]
    return config_from_hf(d)


def test_the_architecture_tables_name_every_weight_of_the_transformers_model(tiny_qwen35moe_hf_model):
    from g906.arch import lookup

    cfg = config_from_hf_dir_like(tiny_qwen35moe_hf_model)
    ours = dict(lookup(cfg.architecture).hf_shapes(cfg))
    theirs = {k: tuple(v.shape) for k, v in tiny_qwen35moe_hf_model.state_dict().items()}
    assert ours == theirs


def test_missing_expert_is_named(tiny_qwen35moe_hf_model):
    sd = {k: v for k, v in tiny_qwen35moe_hf_model.state_dict().items()}
    gu = sd.pop("model.layers.1.mlp.experts.gate_up_proj")
    inter = gu.shape[1] // 2
    per = {f"model.layers.1.mlp.experts.{e}.gate_proj.weight": gu[e, :inter] for e in range(16) if e != 7}
    lm = Qwen35MoeForCausalLM(config_from_hf_dir_like(tiny_qwen35moe_hf_model), dtype=torch.float32)
    with pytest.raises(G906Error, match=r"model\.layers\.1\.mlp\.experts\.7\.gate_proj\.weight"):
        lm.load_weights(list(sd.items()) + list(per.items()))


# ------------------------------------------------------------------------------------------ GGUF


def dequantized_reference(hf_model, path):
    """transformers model holding what the GGUF file holds, read and dequantized by gguf-py."""
    ref = copy.deepcopy(hf_model)
    hp = ref.config.to_dict()
    nk, nv, dv = hp["linear_num_key_heads"], hp["linear_num_value_heads"], hp["linear_value_head_dim"]
    qk = 2 * nk * hp["linear_key_head_dim"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35MOE, hp["num_hidden_layers"])
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}

    def deq(gname):
        t = tensors[gname]
        return torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).astype("float32"))

    with torch.no_grad():
        for name, p in ref.named_parameters():
            blk = name.split(".")[2] if name.startswith("model.layers.") else None
            if name.endswith("mlp.experts.gate_up_proj"):
                p.copy_(torch.cat([deq(f"blk.{blk}.ffn_gate_exps.weight"), deq(f"blk.{blk}.ffn_up_exps.weight")], 1))
                continue
            if name.endswith("mlp.experts.down_proj"):
                p.copy_(deq(f"blk.{blk}.ffn_down_exps.weight"))
                continue
            if p.dim() != 2:  # norms, conv1d, A_log, dt_bias: F32 in the file, equal to HF
                continue
            d = deq(gguf_name(name, hp, tmap))
            if ".in_proj_qkv." in name:
                d = torch.cat([d[:qk], reorder_v_heads(d[qk:], 0, nv // nk, nk, dv)])
            elif ".in_proj_z." in name:
                d = reorder_v_heads(d, 0, nv // nk, nk, dv)
            elif ".in_proj_a." in name or ".in_proj_b." in name:
                d = reorder_v_heads(d, 0, nv // nk, nk, 1)
            elif ".out_proj." in name and "linear_attn" in name:
                d = reorder_v_heads(d, 1, nv // nk, nk, dv)
            p.copy_(d.reshape(p.shape))
    return ref


@pytest.fixture(scope="module")
def moe_ggufs(tiny_qwen35moe_hf_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("moe-gguf")
    return lambda qtype, **kw: write_gguf(tiny_qwen35moe_hf_model, d / f"moe-{qtype}-{len(kw)}.gguf",
                                          qtype=qtype, **kw)[0]


def test_gguf_metadata_and_names(moe_ggufs, tiny_qwen35moe_hf_dir):
    f = GGUFModelFile.open(moe_ggufs("F16"))
    assert f.architecture == "qwen35moe"
    c = f.config()
    ref = config_from_hf_dir(tiny_qwen35moe_hf_dir)
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
              "hidden_size", "num_hidden_layers"):
        assert getattr(c, k) == getattr(ref, k), k
    names = set(f.tensor_names())
    for suf in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp",
                "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp"):
        assert f"blk.0.{suf}.weight" in names
    assert f.tensor_entry("blk.0.ffn_gate_exps.weight").shape == (16, 256, 256)
    assert f.tensor_entry("blk.0.ffn_gate_inp.weight").type_name == "F32"


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_K"])
def test_gguf_greedy_matches_transformers_on_dequantized_weights(moe_ggufs, tiny_qwen35moe_hf_model, qtype):
    path = moe_ggufs(qtype)
    lm = _load(path)
    w = lm.model.model.layers[0].mlp.experts
    if qtype != "F16":
        assert isinstance(w.gate_up, QuantizedExperts) and w.gate_up.qtype == qtype
        assert isinstance(w.down_proj, QuantizedExperts)
    ref = dequantized_reference(tiny_qwen35moe_hf_model, path)
    runner = TinyRunner(lm.model, max_seqs=1, max_len=64)
    p = random_prompt(19, 40)
    got = runner.step([0], [p])[0]
    assert rel_err(got, hf_logits(ref, p)[-1]) < 1e-4
    assert runner.greedy(0, p, 8) == hf_greedy(ref, p, 8)


def test_gguf_stacked_gate_up_and_mtp(moe_ggufs, tiny_qwen35moe_hf_model):
    """ffn_gate_up_exps (one tensor for gate and up) and an MTP block with its own experts."""
    path = moe_ggufs("Q8_0", gate_up_stacked=True, mtp_layers=1)
    f = GGUFModelFile.open(path)
    assert "blk.0.ffn_gate_up_exps.weight" in f.tensor_names() and f.config().num_mtp_layers == 1
    mtp = {n for n, _ in f.weights() if n.startswith("mtp.")}
    assert "mtp.layers.0.mlp.experts.gate_up_proj" in mtp and "mtp.layers.0.mlp.shared_expert_gate.weight" in mtp
    lm = _load(path)
    plain = _load(moe_ggufs("Q8_0"))
    p = random_prompt(11, 41)
    a = TinyRunner(lm.model, max_seqs=1, max_len=64).step([0], [p])[0]
    b = TinyRunner(plain.model, max_seqs=1, max_len=64).step([0], [p])[0]
    assert torch.equal(a, b)


def test_gguf_experts_stay_quantized(moe_ggufs):
    path = moe_ggufs("Q4_K")
    lm = _load(path)
    file_size = path.stat().st_size
    assert 0.9 * file_size < lm.info["weight_bytes"] <= 1.05 * file_size


def test_gguf_expert_count_disagreeing_with_router_is_refused(tiny_qwen35moe_hf_model, tmp_path):
    path = write_gguf(tiny_qwen35moe_hf_model, tmp_path / "bad.gguf", qtype="F16",
                      hp_overrides={"num_experts": 8})[0]
    with pytest.raises(G906Error, match="expert_count is 8 but blk.0.ffn_gate_inp.weight routes to 16"):
        GGUFModelFile.open(path).config()


def test_multimodal_checkpoint_text_part_and_vision_tower(tiny_qwen35moe_hf_model, tmp_path):
    """Qwen3_5MoeForConditionalGeneration: the text part runs as the MoE model (names under
    model.language_model.*), the vision tower loads from the same checkpoint as for dense."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    from g906.engine.vision.runtime import load_vision

    from .conftest import MOE_OVERRIDES, TINY_VOCAB, tiny_text_config_kwargs

    text = tiny_text_config_kwargs(**MOE_OVERRIDES)
    text.pop("intermediate_size")
    cfg = Qwen3_5MoeConfig(
        text_config=text, image_token_id=TINY_VOCAB - 4, video_token_id=TINY_VOCAB - 5,
        vision_start_token_id=TINY_VOCAB - 3, vision_end_token_id=TINY_VOCAB - 2,
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=256,
                           patch_size=8, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64))
    torch.manual_seed(7)
    vl = Qwen3_5MoeForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        vl.model.language_model.load_state_dict(tiny_qwen35moe_hf_model.model.state_dict())
        vl.lm_head.weight.copy_(tiny_qwen35moe_hf_model.lm_head.weight)
    vl.save_pretrained(tmp_path)
    lm = _load(tmp_path)
    assert lm.config.architecture == "Qwen3_5MoeForConditionalGeneration" and lm.config.image_token_id == TINY_VOCAB - 4
    p = random_prompt(15, 8)
    got = TinyRunner(lm.model, max_seqs=1, max_len=64).step([0], [p])[0]
    assert rel_err(got, hf_logits(tiny_qwen35moe_hf_model, p)[-1]) < 1e-4
    vision = load_vision(tmp_path, text_config=lm.config, tokenizer=None, dtype=torch.float32,
                         device=torch.device("cpu"), required=True)
    assert vision.tower.merger.linear_fc2.out_features == 256


def test_recipe_and_doctor_read_the_experts_of_a_gguf(moe_ggufs):
    """The recipe resolver reads the stacked experts' types and bytes from the header; the
    doctor's estimate counts the bytes a decode token reads (top_k / num_experts of them)."""
    from g906.doctor.memory import estimate_memory
    from g906.recipe.resolve import resolve
    from g906.recipe.schema import Recipe

    path = moe_ggufs("Q4_K")
    plan = resolve(Recipe.model_validate({"model": {"source": str(path), "mmproj": "none"},
                                          "parallel": {"tensor_parallel_size": 2}}))
    f = plan.model_facts
    assert f["num_experts"] == 16 and f["num_experts_per_tok"] == 4
    assert f["expert_types"] == {"Q4_K": 12}
    exps = [GGUFModelFile.open(path).tensor_entry(f"blk.{i}.ffn_{p}_exps.weight") for i in range(4)
            for p in ("gate", "up", "down")]
    assert f["expert_bytes"] == len(exps) * 16 * 256 * 144
    d = estimate_memory(plan, device_kind="cpu").per_device[0]
    assert d.active_weights == d.weights - f["expert_bytes"] + f["expert_bytes"] * 4 // 16
