"""Tensor parallelism (gloo, two processes) over a compressed-tensors W4A16_ASYM checkpoint that
the compressed-tensors library itself wrote (tests/engine/ct_library.py) of a tiny random
Qwen3.5 MoE: every Linear quantized in groups of 128 with zero points (a rank's 128 features of
o_proj, out_proj and the experts' down_proj are one whole group; the zero points split along
the outputs), the router, shared-expert gate, b/a projections and lm_head 16-bit as the recipes
leave them. TP=2 computes what TP=1 and transformers, on the library's decompression, compute."""

from __future__ import annotations

import pytest

pytest.importorskip("compressed_tensors", reason="compressed-tensors (the test extra) is not installed: "
                    "the checkpoint of this test is written by that library")

from g906.kernels.int4.experts import GroupQuantExperts  # noqa: E402
from g906.kernels.int4.weight import GroupQuantWeight  # noqa: E402
from tests.engine.conftest import build_tiny_qwen35moe  # noqa: E402
from tests.engine.ct_library import quantize_with_compressed_tensors  # noqa: E402
from tests.parallel.conftest import assert_tp_matches_tp1_and_hf  # noqa: E402

IGNORE = ["lm_head", r"re:.*mlp\.gate$", r"re:.*shared_expert_gate$", r"re:.*linear_attn\.in_proj_[ab]$"]


@pytest.fixture(scope="module")
def ct_pair(tmp_path_factory):
    from g906.engine.loader import load_model
    from g906.engine.parallel import load_model_tp

    d = tmp_path_factory.mktemp("tp-ct-library")
    hf, _ = quantize_with_compressed_tensors(build_tiny_qwen35moe(seed=33), d, preset="W4A16_ASYM", ignore=IGNORE)
    ref = load_model(str(d), dtype="float32", device="cpu", progress=False)
    tp = load_model_tp(str(d), tensor_parallel_size=2, dtype="float32", device="cpu", progress=False)
    yield hf, ref, tp
    tp.model.close()


def test_tp2_matches_tp1_and_transformers(ct_pair):
    hf, ref, tp = ct_pair
    assert tp.info["quantized_tensors"] == ref.info["quantized_tensors"] > 0
    assert tp.info["weight_bytes"] < ref.info["weight_bytes"]
    layer = ref.model.model.layers[3]
    assert isinstance(layer.mlp.experts.down_proj, GroupQuantExperts)
    assert isinstance(layer.self_attn.o_proj.weight, GroupQuantWeight) and layer.self_attn.o_proj.weight.zeros is not None
    assert_tp_matches_tp1_and_hf(ref, tp, hf)
