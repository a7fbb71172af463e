"""Model files crafted to break the loader (issue 43, finding 9): tensor offsets that wrap around
2**64 or are unaligned, a corrupted vocabulary, an HF config with an absurd context length. Each
gives g906's own error naming the file and the field; none loads silently wrong."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from g906.engine.loaders.gguf import GGUFModelFile
from g906.errors import G906Error

from .gguf_writer import write_gguf
from .qwen_tokenizer import qwen_tokenizer_dir  # noqa: F401 - fixture


@pytest.fixture(scope="module")
def good(tiny_qwen35_hf_model, qwen_tokenizer_dir, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("gguf-hostile")
    return write_gguf(tiny_qwen35_hf_model, d / "good.gguf", qtype="F16", tokenizer_dir=qwen_tokenizer_dir)[0]


def _file_offset(reader, part: np.ndarray) -> int:
    """Where a field part (a view of the reader's memory map) lies in the file."""
    return part.ctypes.data - reader.data.ctypes.data


def _patched_copy(good, tmp_path, name, edit):
    import gguf

    p = tmp_path / name
    shutil.copy(good, p)
    reader = gguf.GGUFReader(good, "r")
    patches = edit(reader)
    del reader
    with open(p, "r+b") as fh:
        for off, data in patches:
            fh.seek(off)
            fh.write(data)
    return p


def _tensor_offset_patch(reader, index: int, new_rel: int):
    part = reader.tensors[index].field.parts[-1]
    return [(_file_offset(reader, part), np.array([new_rel], dtype="<u8").tobytes())]


def _open_all(path):
    f = GGUFModelFile.open(path)
    for _ in f.weights():
        pass
    return f


def test_good_file_opens(good):
    _open_all(good)


def test_offset_wrapping_around_2_64_is_refused(good, tmp_path):
    """data start + offset wraps to 0: without the check, the tensor would be read from the
    file's header."""
    p = _patched_copy(good, tmp_path, "wrap.gguf",
                      lambda r: _tensor_offset_patch(r, 0, (1 << 64) - int(r.data_offset)))
    with pytest.raises(G906Error) as e:
        _open_all(p)
    assert "wrap.gguf" in e.value.message and r"tensor" in e.value.message


def test_unaligned_offset_is_refused(good, tmp_path):
    def edit(r):
        return _tensor_offset_patch(r, 0, int(r.tensors[0].field.parts[-1][0]) + 1)

    p = _patched_copy(good, tmp_path, "unaligned.gguf", edit)
    with pytest.raises(G906Error) as e:
        _open_all(p)
    assert "unaligned.gguf" in e.value.message and "alignment" in e.value.message


def test_overlapping_tensors_are_refused(good, tmp_path):
    """Tensor 1 pointed at tensor 0's bytes: aligned and inside the file, still wrong."""
    def edit(r):
        big = max(range(len(r.tensors)), key=lambda i: int(r.tensors[i].n_bytes))
        other = next(i for i in range(len(r.tensors)) if i != big)
        return _tensor_offset_patch(r, other, int(r.tensors[big].field.parts[-1][0]))

    p = _patched_copy(good, tmp_path, "overlap.gguf", edit)
    with pytest.raises(G906Error) as e:
        _open_all(p)
    assert "overlap.gguf" in e.value.message and "overlap" in e.value.message


def test_changed_tensor_type_is_refused(good, tmp_path):
    """An F32 norm relabelled F16: half the bytes, still inside the file and aligned; its data
    would be read as different numbers. The unused bytes it leaves give it away."""
    def edit(r):
        i = next(i for i, t in enumerate(r.tensors) if int(t.tensor_type) == 0 and int(t.n_bytes) >= 64)
        part = r.tensors[i].field.parts[4]
        return [(_file_offset(r, part), np.array([1], dtype="<u4").tobytes())]

    p = _patched_copy(good, tmp_path, "type.gguf", edit)
    with pytest.raises(G906Error) as e:
        _open_all(p)
    assert "type.gguf" in e.value.message and "belong to no tensor" in e.value.message


def test_corrupted_vocabulary_is_g906s_error(good, tmp_path):
    """A merge rewritten to name tokens that are not in the vocabulary: the tokenizers library
    would raise its own exception; g906 names the file and the field."""
    def edit(r):
        field = r.fields["tokenizer.ggml.merges"]
        part = field.parts[field.data[0]]
        n = len(part)
        junk = "\x7f" * (n // 2) + " " + "\x7f" * (n - n // 2 - 1)
        return [(_file_offset(r, part), junk.encode())]

    p = _patched_copy(good, tmp_path, "vocab.gguf", edit)
    f = GGUFModelFile.open(p)
    with pytest.raises(G906Error) as e:
        f.tokenizer()
    assert "vocab.gguf" in e.value.message and "tokenizer.ggml.merges[0]" in e.value.message


def test_config_context_is_bounded_by_max_model_len(tiny_qwen35_hf_dir, tmp_path):
    """max_position_embeddings = 2**62: with max_model_len 64 the model loads with 64-row
    tables; without one, the value is refused by name (never allocated)."""
    from g906.engine.loader import load_model

    d = tmp_path / "huge-ctx"
    shutil.copytree(tiny_qwen35_hf_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (cfg.get("text_config") or cfg)["max_position_embeddings"] = 1 << 62
    (d / "config.json").write_text(json.dumps(cfg))
    loaded = load_model(str(d), dtype="float32", device="cpu", progress=False, max_model_len=64)
    assert loaded.config.max_position_embeddings == 64
    assert loaded.model.model.rotary.cos_sin_cache.shape[0] == 64
    with pytest.raises(G906Error) as e:
        load_model(str(d), dtype="float32", device="cpu", progress=False)
    assert "max_position_embeddings" in e.value.message and "huge-ctx" in e.value.message


@pytest.mark.parametrize("key,value", [("linear_num_key_heads", 0), ("linear_num_value_heads", "x"),
                                       ("hidden_size", 1 << 62), ("rms_norm_eps", -1.0), ("num_hidden_layers", None),
                                       ("head_dim", 2.5)])
def test_config_values_are_checked_by_name(tiny_qwen35_hf_dir, tmp_path, key, value):
    """Found by the fuzz (python -m tests.fuzz): a zero head count was a ZeroDivisionError, a
    string one a TypeError; now each is g906's error naming config.json and the field."""
    from g906.arch.registry import config_from_hf_dir

    d = tmp_path / "cfg"
    d.mkdir()
    cfg = json.loads((tiny_qwen35_hf_dir / "config.json").read_text())
    (cfg.get("text_config") or cfg)[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(G906Error) as e:
        config_from_hf_dir(d)
    assert "config.json" in e.value.message and (key in e.value.message or "wrong type" in e.value.message)


def test_config_context_is_bounded_at_tp2_too(tiny_qwen35_hf_dir, tmp_path):
    """The same bound on every tensor-parallel rank (workers build their own rotary tables)."""
    from g906.engine.loader import load_model

    d = tmp_path / "huge-ctx-tp"
    shutil.copytree(tiny_qwen35_hf_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (cfg.get("text_config") or cfg)["max_position_embeddings"] = 1 << 62
    (d / "config.json").write_text(json.dumps(cfg))
    loaded = load_model(str(d), dtype="float32", device="cpu", progress=False, max_model_len=64,
                        tensor_parallel_size=2)
    try:
        assert loaded.config.max_position_embeddings == 64
    finally:
        loaded.model.close()
    with pytest.raises(G906Error) as e:
        load_model(str(d), dtype="float32", device="cpu", progress=False, tensor_parallel_size=2)
    assert "max_position_embeddings" in e.value.message
