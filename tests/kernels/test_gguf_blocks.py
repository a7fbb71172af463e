"""The kernels' GGUF block facts: their geometry table agrees with the engine's
(g906/data/quant_types.toml, the one source of truth), and their torch decode of the types the
kernels fuse equals gguf's (the ground truth; every type: tests/engine/test_quant_dequant.py)."""

from __future__ import annotations

import numpy as np
import pytest

from g906 import data
from g906.kernels.linear.gguf_blocks import BLOCKS, DECODERS, decode_blocks

from .test_linear import QTYPES, random_blocks


def test_geometry_matches_the_engines_table():
    table = data.load("quant_types")["types"]
    assert BLOCKS == {name: (info["block"], info["bytes"]) for name, info in table.items()}
    assert set(DECODERS) == set(table)


@pytest.mark.parametrize("qtype", QTYPES)
def test_torch_decode_matches_gguf(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = random_blocks(3, 512, qtype, 1)
    ref = dequantize(raw.numpy(), GGMLQuantizationType[qtype])
    mine = decode_blocks(raw.reshape(-1, BLOCKS[qtype][1]), qtype).reshape(ref.shape).numpy()
    np.testing.assert_array_equal(mine, ref)


def test_the_fused_kernel_types_are_the_quant_tables():
    from g906.arch import quant
    from g906.kernels.ops import FUSED_QTYPES

    assert set(FUSED_QTYPES) == set(quant.fused_types())
