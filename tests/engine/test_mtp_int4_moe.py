"""The MTP block of an int4 MoE checkpoint (e.g. a GPTQ release that quantized the MTP layer's
experts too): its stacked GroupQuantExperts load packed, as the target's do, and the block runs
(its MoE MLP on the packed experts equals the same block on their dequantized values)."""

from __future__ import annotations

import pytest
import torch

from g906.kernels.int4.experts import GroupQuantExperts
from g906.kernels.int4.reference import pack_rows
from g906.kernels.int4.weight import GroupQuantWeight

from .conftest import MOE_OVERRIDES, tiny_text_config_kwargs

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _config():
    from transformers import Qwen3_5MoeTextConfig

    from g906.arch import config_from_hf

    kw = tiny_text_config_kwargs(**MOE_OVERRIDES)
    kw.pop("intermediate_size")
    d = Qwen3_5MoeTextConfig(**kw).to_dict()
    d.update(architectures=["Qwen3_5MoeForCausalLM"], mtp_num_hidden_layers=1)
    return config_from_hf(d)


def _int4_experts(E, N, K, g) -> GroupQuantExperts:
    ws = []
    for _ in range(E):
        q = torch.randint(0, 16, (N, K), generator=g)
        s = (torch.rand(N, K // 32, generator=g) * 0.02 + 0.005).half()
        ws.append(GroupQuantWeight(pack_rows(q, 4), s, None, 4, 32, (N, K)))
    return GroupQuantExperts.stack(ws)


def test_mtp_block_keeps_int4_experts_packed():
    from g906.engine.layers.base import WeightHolder
    from g906.engine.spec.mtp import MTPBlock

    c = _config()
    g = torch.Generator().manual_seed(5)
    weights = {}
    for build in range(2):
        blk = MTPBlock(c, dtype=torch.float32, device="cpu", max_positions=64)
        if not weights:
            for mod_name, mod in blk.named_modules():
                if isinstance(mod, WeightHolder):
                    for attr, spec in mod.weight_specs().items():
                        weights[f"mtp.{mod_name}.{attr}"] = torch.randn(spec.shape, generator=g) * 0.05
            E, I, H = c.num_experts, c.moe_intermediate_size, c.hidden_size
            for proj, (n, k) in {"gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}.items():
                weights[f"mtp.layers.0.mlp.experts.{proj}"] = _int4_experts(E, n, k, g)
            packed = dict(weights)
        else:   # the same block on the dequantized experts
            weights = {n: (t.dequantize_experts(torch.arange(t.shape[0])) if isinstance(t, GroupQuantExperts) else t)
                       for n, t in packed.items()}
        blk.load(weights)
        experts = blk.layers[0].mlp.experts
        if build == 0:
            assert isinstance(experts.gate_up, GroupQuantExperts) and isinstance(experts.down_proj, GroupQuantExperts)
            mlp_packed = blk.layers[0].mlp
        else:
            mlp_dense = blk.layers[0].mlp
    x = torch.randn(5, c.hidden_size, generator=g)
    a, b = mlp_packed(x), mlp_dense(x)
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
