"""g906.engine.quant.dequant equals gguf.quants.dequantize exactly, for every supported type,
on random blocks (random bytes give every scale pattern, including inf/NaN/subnormal fp16
scales) and on blocks with extreme finite scales; plus the test writer's quantizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from g906 import data
from g906.engine.quant.dequant import block_geometry, dequantize, row_bytes, supported_types
from g906.errors import G906Error

from .gguf_writer import quantize

gguf = pytest.importorskip("gguf")

TYPES = list(data.load("quant_types")["types"])
QUANTIZED = [t for t in TYPES if data.load("quant_types")["types"][t]["storage"] == "quantized"]


def _ref(raw: np.ndarray, qtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])


def _assert_same(got: torch.Tensor, ref: np.ndarray) -> None:
    g = got.cpu().numpy()
    assert g.dtype == np.float32 and g.shape == ref.shape
    # identical values (NaN where the reference has NaN: payload bits may differ)
    np.testing.assert_array_equal(g, ref)
    finite = np.isfinite(ref)
    assert np.array_equal(g[finite].view(np.uint32), ref[finite].view(np.uint32))


def test_table_matches_ggml_and_the_module():
    assert sorted(supported_types()) == sorted(TYPES)
    for name, info in data.load("quant_types")["types"].items():
        qt = gguf.GGMLQuantizationType[name]
        assert int(qt) == info["id"], name
        assert gguf.GGML_QUANT_SIZES[qt] == (info["block"], info["bytes"]), name
        assert block_geometry(name) == (info["block"], info["bytes"])


@pytest.mark.parametrize("qtype", TYPES)
def test_random_blocks_equal_gguf(qtype):
    block, nbytes = block_geometry(qtype)
    rng = np.random.default_rng(sum(qtype.encode()))
    raw = rng.integers(0, 256, size=(5, nbytes * 3), dtype=np.uint8)
    _assert_same(dequantize(torch.from_numpy(raw), qtype), _ref(raw, qtype))


def _scale_offsets(qtype: str) -> list[int]:
    """Byte offsets of the fp16 scales (d, and dmin/m where present) inside one block."""
    return {
        "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
        "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
    }[qtype]


@pytest.mark.parametrize("qtype", QUANTIZED)
@pytest.mark.parametrize("scale", [65504.0, -65504.0, 6.0e-8, 1.0, -0.0])
def test_extreme_scales_equal_gguf(qtype, scale):
    block, nbytes = block_geometry(qtype)
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(4, nbytes * 2), dtype=np.uint8)
    blocks = raw.reshape(-1, nbytes)
    fp = np.array([scale], dtype=np.float16).view(np.uint8)
    for off in _scale_offsets(qtype):
        blocks[:, off:off + 2] = fp
    _assert_same(dequantize(torch.from_numpy(raw), qtype), _ref(raw, qtype))


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_shapes_and_leading_dims(qtype):
    block, nbytes = block_geometry(qtype)
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(2, 3, nbytes * 2), dtype=np.uint8)
    ref = _ref(raw.reshape(6, -1), qtype).reshape(2, 3, 2 * block)
    _assert_same(dequantize(torch.from_numpy(raw), qtype), ref)
    out = dequantize(torch.from_numpy(raw), qtype, (6, 2 * block))
    assert out.shape == (6, 2 * block)
    assert row_bytes(qtype, 2 * block) == 2 * nbytes


def test_bad_input_is_a_clear_error():
    with pytest.raises(G906Error, match="IQ2_XXS"):
        dequantize(torch.zeros(4, 66, dtype=torch.uint8), "IQ2_XXS")
    with pytest.raises(G906Error, match="whole"):
        dequantize(torch.zeros(4, 35, dtype=torch.uint8), "Q8_0")
    with pytest.raises(G906Error, match="shape"):
        dequantize(torch.zeros(4, 34, dtype=torch.uint8), "Q8_0", (4, 33))
    with pytest.raises(G906Error, match="uint8"):
        dequantize(torch.zeros(4, 34), "Q8_0")


@pytest.mark.parametrize("qtype,max_rel", [
    ("Q8_0", 0.01), ("Q4_0", 0.12), ("Q4_1", 0.12), ("Q5_0", 0.06), ("Q5_1", 0.06), ("Q2_K", 0.45),
    ("Q3_K", 0.25), ("Q4_K", 0.12), ("Q5_K", 0.06), ("Q6_K", 0.03), ("IQ4_NL", 0.12), ("IQ4_XS", 0.12),
    ("BF16", 0.005),
])
def test_writer_quantizers_are_valid(qtype, max_rel):
    """The test writer's quantizers produce blocks gguf-py decodes to nearby values."""
    x = np.random.default_rng(3).standard_normal((6, 512)).astype(np.float32)
    raw = quantize(x, qtype)
    deq = _ref(raw, qtype)
    rel = float(np.sqrt(((deq - x) ** 2).mean() / (x ** 2).mean()))
    assert rel < max_rel, rel
    _assert_same(dequantize(torch.from_numpy(raw), qtype, x.shape), deq)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("qtype", TYPES)
def test_gpu_equals_cpu(qtype):
    block, nbytes = block_geometry(qtype)
    raw = torch.randint(0, 256, (64, nbytes * 4), dtype=torch.uint8)
    cpu = dequantize(raw, qtype)
    gpu = dequantize(raw.cuda(), qtype).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=0, atol=0, equal_nan=True)
