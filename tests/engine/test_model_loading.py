"""Loading checks: bad checkpoints give clear errors; dtypes; cache sizes."""

from __future__ import annotations

import json

import pytest
import torch

from g906.arch import config_from_hf
from g906.engine.cache import ModelCache, kv_bytes_per_block, state_bytes_per_slot
from g906.engine.device import resolve_dtype
from g906.engine.loader import load_model
from g906.engine.models.qwen35 import Qwen35ForCausalLM
from g906.errors import G906Error

from .conftest import TinyRunner, random_prompt, rel_err

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def tiny_cfg(tiny_qwen35_hf_model):
    return config_from_hf(tiny_qwen35_hf_model.config.to_dict())


@pytest.fixture(scope="module")
def tiny_sd(tiny_qwen35_hf_model):
    return dict(tiny_qwen35_hf_model.state_dict())


def _model(cfg, dtype=torch.float32):
    return Qwen35ForCausalLM(cfg, dtype=dtype, device="cpu", max_positions=1024)


def test_missing_tensor_is_named(tiny_cfg, tiny_sd):
    sd = dict(tiny_sd)
    del sd["model.layers.2.linear_attn.A_log"]
    with pytest.raises(G906Error, match=r"lacks tensor model\.layers\.2\.linear_attn\.A_log"):
        _model(tiny_cfg).load_weights(sd.items())


def test_misshaped_tensor_is_named(tiny_cfg, tiny_sd):
    sd = dict(tiny_sd)
    sd["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(64, 64)
    with pytest.raises(G906Error, match=r"model\.layers\.1\.self_attn\.q_proj\.weight has shape \[64, 64\]"):
        _model(tiny_cfg).load_weights(sd.items())


def test_unexpected_tensor_is_named(tiny_cfg, tiny_sd):
    sd = dict(tiny_sd)
    sd["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(256, 64)  # layer 0 is linear attention
    with pytest.raises(G906Error, match=r"unexpected tensor model\.layers\.0\.self_attn\.q_proj\.weight"):
        _model(tiny_cfg).load_weights(sd.items())


def test_multimodal_names_and_vision_skipped(tiny_cfg, tiny_sd):
    renamed = [(k.replace("model.", "model.language_model.", 1), v) for k, v in tiny_sd.items()]
    renamed.append(("model.visual.blocks.0.attn.qkv.weight", torch.zeros(3, 3)))
    _model(tiny_cfg).load_weights(renamed)


def test_fp16_overflow_is_refused(tiny_cfg, tiny_sd):
    sd = {k: v.to(torch.bfloat16) for k, v in tiny_sd.items()}
    sd["model.layers.3.mlp.down_proj.weight"][0, 0] = 1.0e6
    with pytest.raises(G906Error, match=r"model\.layers\.3\.mlp\.down_proj\.weight.*float16"):
        _model(tiny_cfg, torch.float16).load_weights(sd.items())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_runs_close_to_fp32(tiny_cfg, tiny_sd, dtype):
    m32 = _model(tiny_cfg)
    m32.load_weights(tiny_sd.items())
    m16 = _model(tiny_cfg, dtype)
    m16.load_weights(tiny_sd.items())
    assert m16.model.layers[0].linear_attn.A_log.dtype == torch.float32
    prompt = random_prompt(100, seed=9)
    a = TinyRunner(m32).step([0], [prompt])[0]
    r16 = TinyRunner(m16)
    assert r16.cache.ssm.dtype == torch.float32 and r16.cache.kv.dtype == dtype
    b = r16.step([0], [prompt])[0]
    assert b.dtype == torch.float32
    assert rel_err(b, a) < 5e-2


def test_bad_safetensors_file(tmp_path, tiny_qwen35_hf_dir):
    (tmp_path / "config.json").write_text((tiny_qwen35_hf_dir / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(G906Error, match="model.safetensors"):
        load_model(str(tmp_path), device="cpu")


def test_truncated_safetensors_file(tmp_path, tiny_qwen35_hf_dir):
    (tmp_path / "config.json").write_text((tiny_qwen35_hf_dir / "config.json").read_text())
    data = (tiny_qwen35_hf_dir / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(G906Error, match="model.safetensors"):
        load_model(str(tmp_path), device="cpu")


def test_missing_shard(tmp_path, tiny_qwen35_hf_dir):
    (tmp_path / "config.json").write_text((tiny_qwen35_hf_dir / "config.json").read_text())
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(G906Error, match="model-00002-of-00002.safetensors.*missing"):
        load_model(str(tmp_path), device="cpu")


def test_no_weights_and_bad_sources(tmp_path, tiny_qwen35_hf_dir):
    (tmp_path / "config.json").write_text((tiny_qwen35_hf_dir / "config.json").read_text())
    with pytest.raises(G906Error, match="no safetensors weights"):
        load_model(str(tmp_path), device="cpu")
    with pytest.raises(G906Error, match="does not exist"):
        load_model(str(tmp_path / "nope"), device="cpu")
    other = tmp_path / "weights.bin"
    other.write_bytes(b"xxxx")
    with pytest.raises(G906Error, match="not a GGUF file"):
        load_model(str(other), device="cpu")


def test_chat_template_override(tmp_path, tiny_qwen35_hf_dir):
    lm = load_model(str(tiny_qwen35_hf_dir), device="cpu", chat_template="{{ messages[0]['content'] }}")
    assert lm.chat_template == "{{ messages[0]['content'] }}"
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    lm = load_model(str(tiny_qwen35_hf_dir), device="cpu", chat_template=str(f))
    assert lm.chat_template.startswith("{% for m")
    assert lm.tokenizer is None  # the fixture directory has no tokenizer.json


def test_resolve_dtype():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("fp16", cpu) == torch.float16
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype(torch.float32, cpu) == torch.float32
    with pytest.raises(G906Error, match="unknown dtype"):
        resolve_dtype("int8", cpu)


def test_cache_sizes_and_reset(tiny_cfg):
    cache = ModelCache.allocate(tiny_cfg, num_blocks=10, block_size=16, num_state_slots=3,
                                dtype=torch.float16, device="cpu")
    assert cache.kv.numel() * 2 == 10 * kv_bytes_per_block(tiny_cfg, 16, torch.float16)
    state = cache.conv.numel() * 2 + cache.ssm.numel() * 4
    assert state == 3 * state_bytes_per_slot(tiny_cfg, torch.float16)
    assert set(cache.k_cache) == {1, 3} and set(cache.conv_state) == {0, 2}
    assert cache.k_cache[1].shape == (10, 16, 2, 32)
    assert cache.conv_state[0].shape == (3, tiny_cfg.linear_conv_dim, 4)    # rings of K inputs
    assert cache.ssm_state[2].shape == (3, 4, 16, 16) and cache.ssm_state[2].dtype == torch.float32
    cache.conv.fill_(1)
    cache.ssm.fill_(1)
    cache.reset_slots([2])
    assert cache.conv[:, 2].abs().sum() == 0 and cache.ssm[:, 2].abs().sum() == 0
    assert bool((cache.conv[:, :2] == 1).all()) and bool((cache.ssm[:, :2] == 1).all())


def test_the_architecture_tables_name_every_weight_of_the_transformers_model(tiny_qwen35_hf_model):
    # g906.arch's HF shape table (built through its GGUF table) against transformers' own modules
    from g906.arch import lookup

    cfg = config_from_hf(tiny_qwen35_hf_model.config.to_dict())
    arch = lookup(cfg.architecture)
    ours = dict(arch.hf_shapes(cfg))
    theirs = {k: tuple(v.shape) for k, v in tiny_qwen35_hf_model.state_dict().items()
              if not k.startswith(("model.visual.", "visual.")) and not k.endswith("rotary_emb.inv_freq")}
    theirs = {k.replace("model.language_model.", "model."): v for k, v in theirs.items()}
    if cfg.tie_word_embeddings:
        theirs.pop("lm_head.weight", None)
    assert ours == theirs


def test_a_bad_kernel_choice_is_a_g906_error(monkeypatch):
    from g906.errors import G906Error

    from g906 import LLM, SamplingParams

    monkeypatch.setenv("G906_KERNELS", "fastest")
    with pytest.raises(G906Error, match="G906_KERNELS='fastest' is not one of") as err:
        LLM("builtin:tiny-qwen35", device="cpu").generate(["hi"], SamplingParams(max_tokens=2))
    assert "G906_KERNELS=auto" in (err.value.hint or "")


def test_auto_dtype_is_float16_on_gpus_for_gguf_and_int4_checkpoints():
    """A bf16 compute dtype would send every quantized matmul of a GGUF or GPTQ model to the
    reference path (the fused kernels take fp16 activations): 'auto' picks fp16 for them on a GPU."""
    from types import SimpleNamespace

    from g906.engine.device import auto_dtype_for

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    q4 = SimpleNamespace(metadata={"general.file_type": 15})
    assert auto_dtype_for(q4, "gguf", gpu, "auto") == "float16"
    assert auto_dtype_for(SimpleNamespace(metadata={}), "gguf", gpu, "auto") == "float16"
    assert auto_dtype_for(SimpleNamespace(quant=object()), "hf", gpu, "auto") == "float16"
    assert auto_dtype_for(SimpleNamespace(quant=None), "hf", gpu, "auto") == "auto"      # the device default
    assert auto_dtype_for(q4, "gguf", gpu, "bfloat16") == "bfloat16"                    # asked for: kept
    assert auto_dtype_for(q4, "gguf", cpu, "auto") == "auto"
