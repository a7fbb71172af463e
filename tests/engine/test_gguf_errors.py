"""Bad GGUF files give a clear G906Error naming the file and the problem (never a traceback):
wrong magic, truncated, missing tensor, shape mismatch, unknown architecture, unsupported
tensor type, missing or misnamed split parts."""

from __future__ import annotations

import shutil

import pytest

from g906.engine.loaders.gguf import GGUFModelFile
from g906.errors import G906Error

from .gguf_writer import write_gguf


@pytest.fixture(scope="module")
def good(tiny_qwen35_hf_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf-good")
    return write_gguf(tiny_qwen35_hf_model, d / "good.gguf", qtype="Q8_0")[0]


def _load_all(path):
    f = GGUFModelFile.open(path)
    f.config()
    for _ in f.weights():
        pass
    return f


def _expect(path, *patterns):
    with pytest.raises(G906Error) as ei:
        _load_all(path)
    msg = ei.value.message
    assert str(path.name) in msg or str(path) in msg, msg
    for p in patterns:
        assert p in msg, msg
    return ei.value


def test_good_file_loads(good):
    f = _load_all(good)
    assert f.tensor_types()["Q8_0"] > 0


def test_missing_file(tmp_path):
    _expect(tmp_path / "nope.gguf", "no such GGUF file")


def test_wrong_magic(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    err = _expect(p, "not a GGUF file")
    assert err.hint


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    _expect(p, "not a GGUF file")


@pytest.mark.parametrize("keep", [0.5, 0.98, 0.02])
def test_truncated(good, tmp_path, keep):
    data = good.read_bytes()
    p = tmp_path / f"cut-{keep}.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    err = _expect(p)
    assert "truncated" in err.message or "truncated" in (err.hint or "")


def test_missing_tensor(tiny_qwen35_hf_model, tmp_path):
    p = write_gguf(tiny_qwen35_hf_model, tmp_path / "missing.gguf", drop_tensors=("blk.2.ssm_out.weight",))[0]
    _expect(p, "blk.2.ssm_out.weight", "missing")


def test_shape_mismatch(tiny_qwen35_hf_model, tmp_path):
    p = write_gguf(tiny_qwen35_hf_model, tmp_path / "shape.gguf", hp_overrides={"intermediate_size": 96})[0]
    _expect(p, "blk.0.ffn_gate.weight", "shape", "[96, 64]")


def test_unknown_architecture(tiny_qwen35_hf_model, tmp_path):
    p = write_gguf(tiny_qwen35_hf_model, tmp_path / "llama.gguf", arch="llama")[0]
    _expect(p, "architecture", "'llama'")


def test_dense_file_labelled_moe_names_the_missing_expert_metadata(tiny_qwen35_hf_model, tmp_path):
    p = write_gguf(tiny_qwen35_hf_model, tmp_path / "moe.gguf", arch="qwen35moe")[0]
    _expect(p, "lacks qwen35moe.expert_feed_forward_length")


def test_missing_metadata(tiny_qwen35_hf_model, tmp_path):
    # a qwen35 file without the ssm.* keys (written under another prefix)
    p = write_gguf(tiny_qwen35_hf_model, tmp_path / "nossm.gguf", arch="qwen3")[0]
    with pytest.raises(G906Error):
        _load_all(p)


@pytest.mark.parametrize("qtype", ["IQ2_XXS", "Q8_K", "TQ1_0"])
def test_unsupported_tensor_type(tiny_qwen35_hf_model, tmp_path, qtype):
    import gguf

    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][0]
    hf = tiny_qwen35_hf_model
    if hf.config.intermediate_size % block:
        # rows of down_proj are intermediate_size long; use a tensor whose rows fit the block
        name = "token_embd.weight" if hf.config.hidden_size % block == 0 else None
    else:
        name = "blk.1.ffn_down.weight"
    if name is None:
        from .conftest import build_tiny_qwen35
        from .test_gguf_loader import KQ_OVERRIDES

        hf = build_tiny_qwen35(seed=3, **KQ_OVERRIDES)
        name = "blk.1.ffn_down.weight"
    p = write_gguf(hf, tmp_path / f"{qtype}.gguf", type_overrides={name: qtype})[0]
    err = _expect(p, name, qtype)
    assert "Q4_K" in (err.hint or "")


def test_unknown_type_id(tmp_path):
    import numpy as np
    import gguf

    w = gguf.GGUFWriter(path=None, arch="qwen35")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file(path=tmp_path / "x.gguf")
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    b = bytearray((tmp_path / "x.gguf").read_bytes())
    name = b"token_embd.weight"
    i = b.index(name) + len(name) + 4 + 8 * 2  # after name, n_dims (u32) and two dims (u64)
    b[i:i + 4] = (77).to_bytes(4, "little")
    p = tmp_path / "future.gguf"
    p.write_bytes(bytes(b))
    _expect(p, "type")


def test_split_missing_part(tiny_qwen35_hf_model, tmp_path):
    paths = write_gguf(tiny_qwen35_hf_model, tmp_path / "s.gguf", split_max_tensors=25)
    assert len(paths) == 3
    paths[1].unlink()
    with pytest.raises(G906Error) as ei:
        GGUFModelFile.open(paths[0])
    assert "s-00002-of-00003.gguf" in ei.value.message and "incomplete" in ei.value.message


def test_split_part_renamed(tiny_qwen35_hf_model, tmp_path):
    paths = write_gguf(tiny_qwen35_hf_model, tmp_path / "s.gguf", split_max_tensors=25)
    lone = tmp_path / "renamed.gguf"
    shutil.copy(paths[0], lone)
    with pytest.raises(G906Error, match="split set"):
        GGUFModelFile.open(lone)
    # parts swapped: names and split.no metadata disagree
    tmp = tmp_path / "tmp.gguf"
    paths[0].rename(tmp)
    paths[1].rename(paths[0])
    tmp.rename(paths[1])
    with pytest.raises(G906Error, match="split part"):
        GGUFModelFile.open(paths[0])


def test_cli_reports_without_traceback(good, tmp_path):
    """The loader entry point raises G906Error (the CLI renders it as Error:/Hint:)."""
    from g906.engine.loader import load_model

    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(G906Error, match="bad.gguf"):
        load_model(str(p), device="cpu", dtype="float32")
