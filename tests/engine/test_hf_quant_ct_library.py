"""compressed-tensors W4A16 checkpoints written by the compressed-tensors library itself
(tests/engine/ct_library.py: its preset schemes, apply_quantization_config, calculate_qparams,
ModelCompressor pack-quantized, save_pretrained + update_config, as llm-compressor saves), of a
tiny random Qwen3.5 (dense) and Qwen3.5 MoE: g906 loads what the library wrote, packed, and
computes what transformers computes on the library's decompression of it (float32, CPU): logits
and greedy continuations, token for token. The dense model also in the multimodal form
(Qwen3_5ForConditionalGeneration, model.language_model.* names, the vision tower in the ignore
list, as the releases are quantized)."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="compressed-tensors (the test extra) is not installed: "
                    "the checkpoints of these tests are written by that library")

from g906.engine.loader import load_model  # noqa: E402
from g906.kernels.int4.experts import GroupQuantExperts  # noqa: E402
from g906.kernels.int4.weight import GroupQuantWeight  # noqa: E402

from .conftest import (  # noqa: E402
    TinyRunner,
    assert_matches_transformers,
    build_tiny_qwen35,
    build_tiny_qwen35_vl,
    build_tiny_qwen35moe,
    hf_greedy,
    hf_logits,
    random_prompt,
    rel_err,
)
from .ct_library import quantization_config, quantize_with_compressed_tensors  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# the tiny dense model has 64 hidden features: groups of 32 (the MoE one takes the presets' 128)
CASES = {
    # every Linear but lm_head, the linear-attention b/a projections (4 outputs) included
    "dense-w4a16-g32": (build_tiny_qwen35, 7, "W4A16", 32, ["lm_head"]),
    "dense-w4a16-asym-g32": (build_tiny_qwen35, 8, "W4A16_ASYM", 32,
                             ["lm_head", r"re:.*linear_attn\.in_proj_[ab]$"]),
    # two config_groups: down_proj 8-bit per channel (a named target wins over "Linear")
    "dense-w4a16-asym-g32+w8a16-channel-down": (build_tiny_qwen35, 11, "W4A16_ASYM", 32, ["lm_head"],
                                                (("W8A16", [r"re:.*mlp\.down_proj$"], -1),)),
    # the multimodal form the releases use: model.language_model.* names, the vision tower ignored
    "vl-w4a16-asym-g32": (lambda seed: build_tiny_qwen35_vl(build_tiny_qwen35(seed=seed)), 9, "W4A16_ASYM", 32,
                          ["lm_head", "re:.*visual.*", r"re:.*linear_attn\.in_proj_[ab]$"]),
    # the ignore list of the Qwen3.5 MoE recipes: router, shared-expert gate, b/a, lm_head
    "moe-w4a16": (build_tiny_qwen35moe, 21, "W4A16", None,
                  ["lm_head", r"re:.*mlp\.gate$", r"re:.*shared_expert_gate$", r"re:.*linear_attn\.in_proj_[ab]$"]),
    "moe-w4a16-asym": (build_tiny_qwen35moe, 22, "W4A16_ASYM", None,
                       ["lm_head", r"re:.*mlp\.gate$", r"re:.*shared_expert_gate$",
                        r"re:.*linear_attn\.in_proj_[ab]$"]),
}
EXPERT = re.compile(r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj$")


@pytest.fixture(scope="module", params=list(CASES))
def written(request, tmp_path_factory):
    build, seed, preset, gs, ignore, *more = CASES[request.param]
    d = tmp_path_factory.mktemp(request.param)
    ref, n = quantize_with_compressed_tensors(build(seed=seed), d, preset=preset, group_size=gs, ignore=ignore,
                                              more=more[0] if more else ())
    lm = load_model(str(d), dtype="float32", device="cpu", progress=False)
    return request.param, d, ref, n, lm


def test_the_library_wrote_it_and_g906_keeps_it_packed(written):
    name, d, _, n, lm = written
    qc = quantization_config(d)
    import compressed_tensors

    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["version"] == compressed_tensors.__version__ and qc["quantization_status"] == "compressed"
    groups = {tuple(g["targets"]): g["weights"] for g in qc["config_groups"].values()}
    w = groups[("Linear",)]
    assert (w["num_bits"], w["strategy"], w["symmetric"]) == (4, "group", "ASYM" not in name.upper())
    assert len(groups) == (2 if "+w8a16" in name else 1)
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not any(k.endswith("weight_g_idx") for k in keys)          # min-max: no act order
    assert any(k.endswith("weight_zero_point") for k in keys) == ("asym" in name)

    layer = lm.model.model.layers[0]
    if not name.startswith("moe"):
        assert lm.info["quantized_tensors"] == n
        assert isinstance(layer.mlp.down_proj.weight, GroupQuantWeight)
        # in_proj_{qkv,z,b,a} stack by kind: one packed stack, or a packed and a 16-bit one
        kinds = {isinstance(w, GroupQuantWeight) for w in layer.linear_attn.in_proj.weights}
        ba_ignored = any("in_proj_[ab]" in i for i in CASES[name][4])
        assert kinds == ({True, False} if ba_ignored else {True})
        down = layer.mlp.down_proj.weight
        if "+w8a16-channel-down" in name:
            assert (down.bits, down.group_size, down.zeros) == (8, down.shape[1], None)
            assert layer.linear_attn.out_proj.weight.bits == 4
        else:
            assert (down.bits, down.group_size) == (4, 32)
    else:
        ex = layer.mlp.experts
        assert isinstance(ex.gate_up, GroupQuantExperts) and isinstance(ex.down_proj, GroupQuantExperts)
        assert ex.gate_up.group_size == 128 and (ex.gate_up.zeros is not None) == ("asym" in name)
        assert not isinstance(layer.mlp.gate.weight, (GroupQuantWeight, GroupQuantExperts))
        # per-expert modules counted once per stacked projection
        experts = [k[:-len(".weight_packed")] for k in keys if k.endswith(".weight_packed")]
        routed = [m for m in experts if EXPERT.match(m)]
        stacked = {re.sub(r"\.experts\.\d+\.", ".experts.", m) for m in routed}
        assert len(experts) == n
        assert lm.info["quantized_tensors"] == n - len(routed) + len(stacked)
    from g906.bench.synthetic import weight_stats

    assert weight_stats(lm.model)["weight_bytes"] == lm.info["weight_bytes"]


def test_logits_and_greedy_match_transformers_on_the_library_decompression(written):
    name, _, ref, _, lm = written
    assert_matches_transformers(lm.model, ref, greedy_tokens=10)


def test_quantization_changed_the_model(written):
    """The comparison is against the quantized model, not the float one it came from."""
    name, _, ref, _, _ = written
    build, seed, *_ = CASES[name]
    p = random_prompt(9, 6)
    assert rel_err(hf_logits(build(seed=seed), p)[-1], hf_logits(ref, p)[-1]) > 1e-2
    assert torch.isfinite(hf_logits(ref, p)).all()


# the library's other presets, in the formats it picks for them: refused when the directory is
# opened, naming what the library wrote
REFUSED = {
    "W8A8": (None, "'int-quantized' format"),             # int8 weights and activations
    "W4A8": (32, "'int-quantized' format"),
    "FP8_DYNAMIC": (None, "'float-quantized' format"),
    "NVFP4A16": (None, "'nvfp4-pack-quantized' format"),
    "W3A16": (32, "compressed-tensors 3-bit"),
}


@pytest.mark.parametrize("preset", list(REFUSED))
def test_library_schemes_g906_does_not_run_are_refused_naming_them(preset, tmp_path):
    from g906.errors import G906Error

    gs, named = REFUSED[preset]
    quantize_with_compressed_tensors(build_tiny_qwen35(seed=10), tmp_path, preset=preset, group_size=gs,
                                     ignore=["lm_head"], fmt=None)
    with pytest.raises(G906Error) as e:
        load_model(str(tmp_path), dtype="float32", device="cpu", progress=False)
    assert named in e.value.message and "pack-quantized" in e.value.hint and "GPTQ" in e.value.hint


def test_sharded_directory_with_modules_split_across_files(tmp_path):
    """save_pretrained's shards cut between a module's weight_packed and its weight_scale /
    weight_zero_point: g906 gathers each module's parts from the index."""
    import json

    ref, _ = quantize_with_compressed_tensors(build_tiny_qwen35(seed=12), tmp_path, preset="W4A16_ASYM",
                                              group_size=32, ignore=["lm_head"], max_shard_size="20KB")
    files: dict[str, set] = {}
    for key, f in json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].items():
        if ".weight_" in key:
            files.setdefault(key.rsplit(".", 1)[0], set()).add(f)
    assert any(len(fs) > 1 for fs in files.values())
    lm = load_model(str(tmp_path), dtype="float32", device="cpu", progress=False)
    p = random_prompt(17, 8)
    assert TinyRunner(lm.model, max_seqs=1).greedy(0, p, 8) == hf_greedy(ref, p, 8)


def test_recipe_validation_reads_what_the_library_wrote(written, tmp_path):
    """The torch-free scheme parser (recipe, doctor) on the library's config.json: the detected
    scheme, the packed bytes, and TP=2 accepted (every split falls on whole groups)."""
    import shutil

    from tests.recipe.test_resolve import plan_of

    name, d, _, _, _ = written
    shutil.copytree(d, tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    gs = 128 if name.startswith("moe") else 32
    sym = "asymmetric" if "asym" in name else "symmetric"
    want = f"compressed-tensors (pack-quantized): 4-bit, group {gs}, {sym}"
    if "+w8a16-channel-down" in name:
        want += "; 8-bit, per-channel, symmetric"
    for tp in (1, 2):
        plan = plan_of(tmp_path, f'[model]\nsource = "m"\n[parallel]\ntensor_parallel_size = {tp}\n')
        assert plan.quantization == "compressed-tensors" and plan.quant_detail == want
        assert plan.tensor_parallel_size == tp
    assert plan.model_facts["weights_bytes_by_dtype"]["I32"] > 0
