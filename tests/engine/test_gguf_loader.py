"""GGUF loading against transformers: files written from tiny HF Qwen3.5 models following
llama.cpp's converter (tests/engine/gguf_writer.py) load back to the HF weights, and the g906
model run on them gives transformers' logits (fp32 files: rel < 1e-4; quantized files: against
transformers run on the dequantized weights)."""

from __future__ import annotations

import copy

import pytest
import torch

from g906.arch import config_from_hf_dir
from g906.engine.loaders.gguf import GGUFModelFile, linear_attn_to_grouped, linear_attn_to_tiled
from g906.engine.weights import QuantizedTensor

from .conftest import TinyRunner, build_tiny_qwen35, hf_greedy, hf_logits, random_prompt, rel_err
from .gguf_writer import gguf_name, reorder_v_heads, write_gguf
from .qwen_tokenizer import qwen_tokenizer_dir  # noqa: F401 - fixture

gguf = pytest.importorskip("gguf")

# A tiny model whose every matmul row is a whole number of 256-element super-blocks (K-quants).
KQ_OVERRIDES = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=64,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
)
QUANT_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]


@pytest.fixture(scope="module")
def kq_hf_model():
    return build_tiny_qwen35(seed=3, **KQ_OVERRIDES)


@pytest.fixture(scope="module")
def f32_gguf(tiny_qwen35_hf_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf-f32")
    return write_gguf(tiny_qwen35_hf_model, d / "tiny-F32.gguf", qtype="F32", mtp_layers=1)[0]


def _load(path):
    from g906.engine.loader import load_model

    return load_model(str(path), device="cpu", dtype="float32", progress=False)


def _grouped_state(f: GGUFModelFile) -> dict[str, torch.Tensor]:
    cfg = f.config()
    return {n: linear_attn_to_grouped(n, t, cfg) for n, t in f.weights() if isinstance(t, torch.Tensor)}


# ------------------------------------------------------------------------------------------ config


def test_config_matches_hf(f32_gguf, tiny_qwen35_hf_dir):
    got = GGUFModelFile.open(f32_gguf).config()
    ref = config_from_hf_dir(tiny_qwen35_hf_dir)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "partial_rotary_factor",
                  "max_position_embeddings", "layer_types", "linear_conv_kernel_dim", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads", "tie_word_embeddings"):
        assert getattr(got, field) == getattr(ref, field), field
    assert got.mrope_section == [11, 11, 10]  # converter default when the checkpoint has none
    assert got.num_mtp_layers == 1  # block_count 5 = 4 main + 1 MTP
    assert got.linear_v_head_order == "tiled"
    assert got.architecture == "qwen35"


def test_metadata_and_names_follow_the_converter(f32_gguf):
    f = GGUFModelFile.open(f32_gguf)
    md = f.metadata
    assert md["general.architecture"] == "qwen35"
    assert md["qwen35.block_count"] == 5 and md["qwen35.nextn_predict_layers"] == 1
    assert md["qwen35.full_attention_interval"] == 2
    assert md["qwen35.rope.dimension_sections"] == [11, 11, 10, 0]
    names = set(f.tensor_names())
    assert {"token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_qkv.weight",
            "blk.0.attn_gate.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_conv1d.weight",
            "blk.0.ssm_alpha.weight", "blk.0.ssm_beta.weight", "blk.0.ssm_norm.weight", "blk.0.ssm_out.weight",
            "blk.0.post_attention_norm.weight", "blk.1.attn_q.weight", "blk.1.attn_q_norm.weight",
            "blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight", "blk.4.nextn.hnorm.weight",
            "blk.4.nextn.shared_head_norm.weight", "blk.4.attn_q.weight"} <= names
    assert f.tensor_entry("blk.0.ssm_conv1d.weight").shape == (64 + 64, 4)  # [C, K], squeezed
    assert f.tensor_types() == {"F32": len(names)}


# ------------------------------------------------------------------------------------------ weights


def test_f32_weights_equal_hf(f32_gguf, tiny_qwen35_hf_model):
    f = GGUFModelFile.open(f32_gguf)
    got = _grouped_state(f)
    ref = tiny_qwen35_hf_model.state_dict()
    assert set(ref) <= set(got)
    for n, r in ref.items():
        assert got[n].shape == r.shape, n
        torch.testing.assert_close(got[n].float(), r.float(), rtol=0, atol=5e-7, msg=n)
    # the V-head order really is the file's (tiled) before regrouping
    raw = dict(f.weights())
    a_log = raw["model.layers.0.linear_attn.A_log"]
    torch.testing.assert_close(linear_attn_to_tiled("x.linear_attn.A_log", got["model.layers.0.linear_attn.A_log"],
                                                    f.config()), a_log)
    assert not torch.equal(a_log, got["model.layers.0.linear_attn.A_log"])


def test_mtp_weights_are_yielded_with_hf_semantics(tiny_qwen35_hf_model, tmp_path):
    from .gguf_writer import random_mtp_tensors

    path = write_gguf(tiny_qwen35_hf_model, tmp_path / "mtp.gguf", mtp_layers=1)[0]
    got = dict(GGUFModelFile.open(path).weights())
    hp = tiny_qwen35_hf_model.config.to_dict()
    hp.setdefault("head_dim", 32)
    ref = random_mtp_tensors(hp, 1)
    for n, r in ref.items():
        torch.testing.assert_close(got[n], r, rtol=0, atol=5e-7, msg=n)
    assert not any(n.startswith("mtp.") for n, _ in GGUFModelFile.open(path).weights(include_mtp=False))


@pytest.mark.parametrize("qtype", ["F16", "BF16"])
def test_half_precision_files(tiny_qwen35_hf_model, tmp_path, qtype):
    path = write_gguf(tiny_qwen35_hf_model, tmp_path / f"t-{qtype}.gguf", qtype=qtype)[0]
    f = GGUFModelFile.open(path)
    dt = {"F16": torch.float16, "BF16": torch.bfloat16}[qtype]
    raw = dict(f.weights())
    assert raw["model.layers.0.mlp.up_proj.weight"].dtype == dt
    assert raw["model.norm.weight"].dtype == torch.float32
    got = _grouped_state(f)
    for n, r in tiny_qwen35_hf_model.state_dict().items():
        expect = r.to(dt).float() if r.dim() == 2 else r.float()  # 1-D tensors and norms stay F32
        torch.testing.assert_close(got[n].float(), expect, rtol=0, atol=5e-7, msg=n)


def test_tied_embeddings(tmp_path):
    hf = build_tiny_qwen35(seed=4, tie_word_embeddings=True)
    path = write_gguf(hf, tmp_path / "tied.gguf")[0]
    f = GGUFModelFile.open(path)
    assert "output.weight" not in f.tensor_names()
    assert f.config().tie_word_embeddings is True
    assert "lm_head.weight" not in dict(f.weights())
    lm = _load(path)
    p = random_prompt(9, 2)
    assert rel_err(TinyRunner(lm.model, max_seqs=1, max_len=64).step([0], [p])[0], hf_logits(hf, p)[-1]) < 1e-4


# ------------------------------------------------------------------------------------------ logits


def test_f32_logits_and_greedy_match_transformers(f32_gguf, tiny_qwen35_hf_model):
    lm = _load(f32_gguf)
    assert lm.config.linear_v_head_order == "tiled"
    runner = TinyRunner(lm.model, max_seqs=1, max_len=192)
    for n, seed in ((1, 10), (17, 11), (150, 12)):  # 150 crosses the 64-token chunk boundaries
        p = random_prompt(n, seed)
        runner.release(0)
        got = runner.step([0], [p])[0]
        assert rel_err(got, hf_logits(tiny_qwen35_hf_model, p)[-1]) < 1e-4, n
    # the decode path (recurrent step) with the file's tiled V order; 32-token greedy runs of
    # the model itself are in the model tests
    p = random_prompt(17, 13)
    assert runner.greedy(0, p, 8) == hf_greedy(tiny_qwen35_hf_model, p, 8)


def _dequantized_reference(hf_model, path):
    """A transformers model whose 2-D weights are what the GGUF file holds, read with gguf-py's
    own reader and dequantizer (independent of g906's loader)."""
    ref = copy.deepcopy(hf_model)
    hp = {**ref.config.to_dict()}
    nk, nv, dv = hp["linear_num_key_heads"], hp["linear_num_value_heads"], hp["linear_value_head_dim"]
    qk = 2 * nk * hp["linear_key_head_dim"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35, hp["num_hidden_layers"])
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.dim() != 2:
                continue
            t = tensors[gguf_name(name, hp, tmap)]
            deq = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).astype("float32"))
            # the file holds V heads in tiled order: back to HF's grouped order
            if ".in_proj_qkv." in name:
                deq = torch.cat([deq[:qk], reorder_v_heads(deq[qk:], 0, nv // nk, nk, dv)])
            elif ".in_proj_z." in name:
                deq = reorder_v_heads(deq, 0, nv // nk, nk, dv)
            elif ".in_proj_a." in name or ".in_proj_b." in name:
                deq = reorder_v_heads(deq, 0, nv // nk, nk, 1)
            elif ".out_proj." in name and "linear_attn" in name:
                deq = reorder_v_heads(deq, 1, nv // nk, nk, dv)
            p.copy_(deq.reshape(p.shape))
    return ref


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_quantized_logits_match_transformers_on_dequantized_weights(kq_hf_model, tmp_path, qtype):
    path = write_gguf(kq_hf_model, tmp_path / f"kq-{qtype}.gguf", qtype=qtype, strict=True)[0]
    f = GGUFModelFile.open(path)
    assert f.tensor_types()[qtype] == 3 * 8 + 7 + 2  # every matmul weight + embedding + head
    lm = _load(path)
    assert lm.info["quantized_tensors"] == 3 * 8 + 7 + 2
    ref = _dequantized_reference(kq_hf_model, path)
    p = random_prompt(13, 21)
    got = TinyRunner(lm.model, max_seqs=1, max_len=64).step([0], [p])[0]
    assert rel_err(got, hf_logits(ref, p)[-1]) < 1e-4, qtype


def test_quantized_tensors_stay_quantized(kq_hf_model, tmp_path):
    path = write_gguf(kq_hf_model, tmp_path / "kq-Q4_K.gguf", qtype="Q4_K", strict=True)[0]
    f = GGUFModelFile.open(path)
    w = dict(f.weights())
    qkv = w["model.layers.0.linear_attn.in_proj_qkv.weight"]
    assert isinstance(qkv, QuantizedTensor) and qkv.qtype == "Q4_K"
    assert qkv.data.dtype == torch.uint8 and qkv.shape == (2 * 2 * 32 + 4 * 64, 256)
    assert qkv.data.shape == (qkv.shape[0], 256 // 256 * 144)
    assert isinstance(w["model.embed_tokens.weight"], QuantizedTensor)
    resident = sum(t.nbytes if isinstance(t, QuantizedTensor) else t.numel() * t.element_size() for t in w.values())
    file_size = path.stat().st_size
    assert 0.9 * file_size < resident <= file_size
    lm = _load(path)
    assert 0.9 * file_size < lm.info["weight_bytes"] <= 1.05 * file_size
    dense_fp16 = sum(p.numel() for p in kq_hf_model.parameters()) * 2
    assert lm.info["weight_bytes"] < 0.5 * dense_fp16


def test_mixed_types_like_unsloth_files(kq_hf_model, tmp_path):
    """Per-tensor types differ in real files (embeddings Q6_K, attention Q8_0, ...)."""
    over = {"token_embd.weight": "Q6_K", "output.weight": "Q8_0", "blk.3.attn_q.weight": "IQ4_XS",
            "blk.0.attn_qkv.weight": "Q5_K", "blk.0.ffn_down.weight": "BF16"}
    path = write_gguf(kq_hf_model, tmp_path / "mixed.gguf", qtype="Q4_K", type_overrides=over)[0]
    f = GGUFModelFile.open(path)
    types = f.tensor_types()
    assert {"Q4_K", "Q6_K", "Q8_0", "IQ4_XS", "Q5_K", "BF16", "F32"} <= set(types)
    lm = _load(path)
    p = random_prompt(5, 30)
    out = TinyRunner(lm.model, max_seqs=1, max_len=64).step([0], [p])[0]
    assert torch.isfinite(out).all()


# ------------------------------------------------------------------------------------------ split files


def test_split_set_loads_from_any_part(tiny_qwen35_hf_model, tmp_path):
    paths = write_gguf(tiny_qwen35_hf_model, tmp_path / "split.gguf", qtype="Q8_0", split_max_tensors=20, mtp_layers=1)
    assert len(paths) == 4 and paths[0].name == "split-00001-of-00004.gguf"
    whole = write_gguf(tiny_qwen35_hf_model, tmp_path / "whole.gguf", qtype="Q8_0", mtp_layers=1)[0]
    ref = {n: t for n, t in GGUFModelFile.open(whole).weights()}
    for p in (paths[0], paths[2]):
        f = GGUFModelFile.open(p)
        assert len(f.paths) == 4 and f.config().num_mtp_layers == 1
        got = dict(f.weights())
        assert set(got) == set(ref)
        for n, t in got.items():
            a = t.data if isinstance(t, QuantizedTensor) else t
            b = ref[n].data if isinstance(ref[n], QuantizedTensor) else ref[n]
            assert torch.equal(a, b), n
    lm = _load(paths[1])
    assert lm.info["file_bytes"] == sum(p.stat().st_size for p in paths)


# ------------------------------------------------------------------------------------------ tokenizer in GGUF


def test_gguf_carries_tokenizer_and_template(tiny_qwen35_hf_model, qwen_tokenizer_dir, tmp_path):
    path = write_gguf(tiny_qwen35_hf_model, tmp_path / "tok.gguf", tokenizer_dir=qwen_tokenizer_dir)[0]
    f = GGUFModelFile.open(path)
    tok = f.tokenizer()
    assert f.chat_template() == (qwen_tokenizer_dir / "chat_template.jinja").read_text(encoding="utf-8")
    text = "Hello 世界 🙂 <|im_start|>user"
    from transformers import AutoTokenizer

    assert tok.encode(text) == AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir)).encode(text, add_special_tokens=False)
    cfg = f.config()
    assert cfg.eos_token_ids and cfg.eos_token_ids[0] == tok.token_to_id("<|im_end|>")
    lm = _load(path)
    assert lm.tokenizer is not None and lm.chat_template == f.chat_template()


def test_no_tokenizer_metadata_gives_none(f32_gguf):
    assert GGUFModelFile.open(f32_gguf).tokenizer() is None

