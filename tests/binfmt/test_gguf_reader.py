"""g906.binfmt.gguf against gguf-py: real files written by gguf.GGUFWriter (every value type,
nested arrays, a 250k-string vocabulary, split sets, quantized and F16/F32 tensors, a custom
alignment) read by both readers must give the same metadata and the same tensor bytes; damaged
files must give GGUFFormatError naming the file, the offset and the field."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from g906.binfmt.gguf import (
    GGUFFile,
    GGUFFormatError,
    NotGGUFError,
    TruncatedGGUFError,
    UnknownTensorTypeError,
)

SCALARS = [
    ("t.u8", 200, V.UINT8), ("t.i8", -100, V.INT8), ("t.u16", 60000, V.UINT16), ("t.i16", -30000, V.INT16),
    ("t.u32", 4_000_000_000, V.UINT32), ("t.i32", -2_000_000_000, V.INT32), ("t.f32", 1.5, V.FLOAT32),
    ("t.bool_t", True, V.BOOL), ("t.bool_f", False, V.BOOL), ("t.str", "héllo ✓ 𝄞", V.STRING),
    ("t.empty_str", "", V.STRING), ("t.u64", 2**63 + 5, V.UINT64), ("t.i64", -(2**62), V.INT64),
    ("t.f64", -2.25e300, V.FLOAT64),
]
NUMERIC_ARRAYS = {V.UINT8: np.uint8, V.INT8: np.int8, V.UINT16: np.uint16, V.INT16: np.int16,
                  V.UINT32: np.uint32, V.INT32: np.int32, V.UINT64: np.uint64, V.INT64: np.int64,
                  V.FLOAT32: np.float32, V.FLOAT64: np.float64}
NESTED = [[1, 2, 3], [4], [5, 6]]


def _vocab(n: int) -> list[str]:
    extra = ["", "Ġthe", "ĊĊ", "<|im_start|>", "日本語", "🦙", "a" * 300]
    return extra + [f"tok{i}" for i in range(n - len(extra))]


def _tensors(rng) -> dict[str, tuple[np.ndarray, Q | None, tuple[int, ...] | None]]:
    """name -> (array to add, raw type, raw shape): F32, F16, and raw quantized blocks."""
    out = {
        "f32.weight": (rng.standard_normal((3, 5)).astype(np.float32), None, None),
        "f16.weight": (rng.standard_normal((4, 64)).astype(np.float16), None, None),
        "vec.bias": (rng.standard_normal(7).astype(np.float32), None, None),
    }
    for qt, rows in ((Q.Q4_K, 2), (Q.Q8_0, 3), (Q.Q6_K, 1), (Q.BF16, 2)):
        block, size = gguf.GGML_QUANT_SIZES[qt]
        cols = 256 if block > 1 else 16
        nbytes = rows * cols // block * size
        data = rng.integers(0, 256, size=(rows, nbytes // rows), dtype=np.uint8)
        out[f"{qt.name.lower()}.weight"] = (data, qt, (rows, cols))
    return out


def _write(path, *, vocab: int = 0, alignment: int | None = None, split_max_tensors: int = 0,
           endian=gguf.GGUFEndian.LITTLE, tensors=True):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "testarch", endianess=endian, split_max_tensors=split_max_tensors)
    if alignment:
        w.add_custom_alignment(alignment)
    for key, value, vt in SCALARS:
        w.add_key_value(key, value, vt)
    for vt, dt in NUMERIC_ARRAYS.items():
        w.add_key_value(f"a.{vt.name.lower()}", np.arange(1, 6).astype(dt).tolist(), V.ARRAY, sub_type=vt)
    w.add_key_value("a.bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_key_value("a.str", ["x", "", "ÿ€"], V.ARRAY, sub_type=V.STRING)
    w.add_key_value("a.nested", NESTED, V.ARRAY)
    if vocab:
        w.add_token_list(_vocab(vocab))
        w.add_token_types([1] * vocab)
    written = _tensors(rng) if tensors else {}
    for name, (arr, raw, shape) in written.items():
        w.add_tensor(name, arr, raw_dtype=raw)      # quantized: bytes per row, gguf-py derives the shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def _same_as_gguf_py(path, f: GGUFFile) -> None:
    ref = gguf.GGUFReader(path)
    ref_fields = {k: v for k, v in ref.fields.items() if not k.startswith("GGUF.")}
    assert set(f.fields) == set(ref_fields)
    for key, rf in ref_fields.items():
        ours = f.fields[key]
        assert ours.type == rf.types[0], key
        if key == "a.nested":
            continue                      # gguf-py's contents() flattens nested arrays
        want = rf.contents()
        got = ours.value.tolist() if isinstance(ours.value, np.ndarray) else ours.value
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-7), key
        else:
            assert got == want, key
        if ours.is_array:
            assert ours.item_type == rf.types[-1] and ours.count == len(rf.data), key
    assert f.alignment == ref.alignment and f.data_offset == ref.data_offset
    assert [t.name for t in f.tensors] == [t.name for t in ref.tensors]
    for t, rt in zip(f.tensors, ref.tensors):
        assert t.dims == tuple(int(d) for d in rt.shape), t.name
        assert t.type == rt.tensor_type and t.n_bytes == int(rt.n_bytes) and t.n_elements == int(rt.n_elements)
        assert t.data_start == int(rt.data_offset)
        assert f.tensor_data(t).tobytes() == rt.data.tobytes(), t.name


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    p = tmp_path_factory.mktemp("gguf-reader") / "big.gguf"
    written = _write(p, vocab=250_000)
    return p, written


def test_every_value_type_and_tensor_type_equals_gguf_py(big):
    path, written = big
    with GGUFFile(path) as f:
        _same_as_gguf_py(path, f)
        assert f.version == 3 and f.architecture == "testarch"
        for key, value, vt in SCALARS:
            assert f.fields[key].type == vt and f.fields[key].item_type is None
            assert f.metadata[key] == (pytest.approx(value, rel=1e-7) if vt == V.FLOAT32 else value)
            assert type(f.metadata[key]) is type(value)
        for vt, dt in NUMERIC_ARRAYS.items():
            arr = f.metadata[f"a.{vt.name.lower()}"]
            assert arr.dtype == np.dtype(dt) and arr.tolist() == list(range(1, 6))
        assert f.metadata["a.bool"].dtype == np.bool_ and f.metadata["a.bool"].tolist() == [True, False, True]
        assert f.metadata["a.str"] == ["x", "", "ÿ€"]
        nested = f.fields["a.nested"]
        assert nested.item_type == V.ARRAY and nested.count == 3
        assert [a.tolist() for a in nested.value] == NESTED
        for name, (arr, raw, shape) in written.items():
            t = f.tensor(name)
            assert t.shape == (shape or arr.shape) and t.type_name == (raw.name if raw else
                                                                      {np.float32: "F32", np.float16: "F16"}[arr.dtype.type])
            assert f.tensor_data(name).tobytes() == arr.tobytes()


def test_250k_string_vocabulary(big):
    path, _ = big
    with GGUFFile(path) as f:
        tokens = f.metadata["tokenizer.ggml.tokens"]
        assert tokens == _vocab(250_000)
        assert f.fields["tokenizer.ggml.tokens"].count == 250_000
        assert f.metadata["tokenizer.ggml.token_type"].shape == (250_000,)


@pytest.mark.parametrize("alignment", [64, 1])
def test_custom_alignment(tmp_path, alignment):
    p = tmp_path / "aligned.gguf"
    _write(p, alignment=alignment)
    with GGUFFile(p) as f:
        assert f.alignment == alignment and f.data_offset % alignment == 0
        _same_as_gguf_py(p, f)


def test_split_set_parts_each_equal_gguf_py(tmp_path):
    _write(tmp_path / "m.gguf", split_max_tensors=3)
    parts = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(parts) == 3
    names = []
    for i, p in enumerate(parts):
        with GGUFFile(p) as f:
            _same_as_gguf_py(p, f)
            assert f.metadata["split.no"] == i and f.metadata["split.count"] == len(parts)
            names += [t.name for t in f.tensors]
    assert sorted(names) == sorted(_tensors(np.random.default_rng(0)))


def test_modes_read_only_and_copy_on_write(big):
    path, written = big
    before = path.read_bytes()[-64:]
    with GGUFFile(path) as f:
        view = f.tensor_data("f32.weight")
        assert not view.flags.writeable
        with pytest.raises(ValueError):
            view[0] = 1
    f = GGUFFile(path, "c")
    last = f.tensors[-1]
    view = f.tensor_data(last)
    assert view.flags.writeable
    view[:] = 0                                       # private pages: the file is untouched
    assert path.read_bytes()[-64:] == before
    del view
    f.close()
    with pytest.raises(ValueError, match="mode"):
        GGUFFile(path, "w")


# ---------------------------------------------------------------------------- damaged files


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    p = tmp_path_factory.mktemp("gguf-small") / "small.gguf"
    _write(p)
    return p


def _edited(tmp_path, src, name, edit):
    b = bytearray(src.read_bytes())
    edit(b)
    p = tmp_path / name
    p.write_bytes(bytes(b))
    return p


def _error(p, cls=GGUFFormatError, *words) -> GGUFFormatError:
    with pytest.raises(cls) as e:
        GGUFFile(p)
    msg = str(e.value)
    assert str(p) in msg, msg
    for w in words:
        assert w in msg, msg
    return e.value


def test_not_gguf(tmp_path):
    p = tmp_path / "zip.gguf"
    p.write_bytes(b"PK\x03\x04" + bytes(100))
    _error(p, NotGGUFError, "not a GGUF file", "b'PK")
    e = tmp_path / "empty.gguf"
    e.write_bytes(b"")
    _error(e, NotGGUFError, "an empty file")


@pytest.mark.parametrize("version,words", [(1, "version 1"), (4, "version 4"), (0x03000000, "big-endian")])
def test_unsupported_versions(tmp_path, small, version, words):
    p = _edited(tmp_path, small, "v.gguf", lambda b: b.__setitem__(slice(4, 8), struct.pack("<I", version)))
    err = _error(p, GGUFFormatError, words)
    assert err.offset == 4


def test_big_endian_file_from_gguf_py_is_refused(tmp_path):
    p = tmp_path / "be.gguf"
    _write(p, endian=gguf.GGUFEndian.BIG, tensors=False)
    _error(p, GGUFFormatError, "big-endian")


def test_every_truncation_of_the_header_is_a_format_error(tmp_path, small):
    """Cut the file at every byte of its header (and inside the data): always our error, the
    header ones a TruncatedGGUFError naming a field or tensor and an offset."""
    data = small.read_bytes()
    with GGUFFile(small) as f:
        data_offset = f.data_offset
    p = tmp_path / "cut.gguf"
    for n in list(range(4, data_offset + 1)) + [len(data) - 1, data_offset + 17]:
        p.write_bytes(data[:n])
        with pytest.raises(GGUFFormatError) as e:
            GGUFFile(p)
        assert isinstance(e.value, TruncatedGGUFError) and e.value.offset is not None, (n, str(e.value))
        assert "truncated" in str(e.value) and str(p) in str(e.value)


def test_tensor_past_the_end_names_the_tensor(tmp_path, small):
    data = small.read_bytes()
    p = tmp_path / "short.gguf"
    p.write_bytes(data[:-1])
    _error(p, TruncatedGGUFError, "tensor", "would end at byte")


def _find(b: bytearray, text: bytes) -> int:
    i = b.index(text)
    return i + len(text)


def test_unknown_value_type_names_the_key(tmp_path, small):
    def edit(b):
        i = _find(b, b"t.u16")
        b[i:i + 4] = struct.pack("<I", 99)
    err = _error(_edited(tmp_path, small, "vt.gguf", edit), GGUFFormatError, "t.u16", "unknown value type 99")
    assert err.offset is not None


def test_unknown_array_element_type_names_the_key(tmp_path, small):
    def edit(b):
        i = _find(b, b"a.str") + 4          # after the key: ARRAY, then the element type
        b[i:i + 4] = struct.pack("<I", 13)
    _error(_edited(tmp_path, small, "at.gguf", edit), GGUFFormatError, "a.str", "unknown value type 13")


def test_unknown_tensor_type(tmp_path, small):
    def edit(b):
        i = _find(b, b"f32.weight") + 4 + 8 * 2
        b[i:i + 4] = struct.pack("<I", 77)
    err = _error(_edited(tmp_path, small, "tt.gguf", edit), UnknownTensorTypeError, "f32.weight", "type 77")
    assert err.type_id == 77


def test_unaligned_tensor_offset(tmp_path, small):
    def edit(b):
        i = _find(b, b"f16.weight") + 4 + 8 * 2 + 4
        (rel,) = struct.unpack_from("<Q", b, i)
        b[i:i + 8] = struct.pack("<Q", rel + 1)
    _error(_edited(tmp_path, small, "ua.gguf", edit), GGUFFormatError, "f16.weight", "alignment (32)")


def test_offset_near_2_64_does_not_wrap(tmp_path, small):
    with GGUFFile(small) as f:
        start = f.data_offset

    def edit(b):
        i = _find(b, b"f32.weight") + 4 + 8 * 2 + 4
        b[i:i + 8] = struct.pack("<Q", 2**64 - start)    # data_offset + rel == 2**64
    _error(_edited(tmp_path, small, "wrap.gguf", edit), GGUFFormatError, "f32.weight")


def test_impossible_quantized_shape(tmp_path, small):
    def edit(b):
        i = _find(b, b"q4_k.weight") + 4
        b[i:i + 8] = struct.pack("<Q", 100)           # 100 columns: not whole 256-blocks
    _error(_edited(tmp_path, small, "shape.gguf", edit), GGUFFormatError, "q4_k.weight", "impossible shape")


def test_bad_alignment_value(tmp_path):
    p = tmp_path / "align.gguf"
    w = gguf.GGUFWriter(p, "x")
    w.add_key_value("general.alignment", 48, V.UINT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    _error(p, GGUFFormatError, "general.alignment", "48")


def test_invalid_utf8_names_the_element(tmp_path, big):
    def edit(b):
        i = b.index(b"\x00tok1234\x07") + 1          # its length's last byte, "tok1234", the next length
        b[i] = 0xFF
    k = _vocab(2000).index("tok1234")
    _error(_edited(tmp_path, big[0], "utf8.gguf", edit), GGUFFormatError, f"tokenizer.ggml.tokens[{k}]", "UTF-8")


def test_huge_array_count_fails_before_allocating(tmp_path, small):
    def edit(b):
        i = _find(b, b"a.str") + 8
        b[i:i + 8] = struct.pack("<Q", 2**62)
    _error(_edited(tmp_path, small, "count.gguf", edit), TruncatedGGUFError, "a.str", str(2**62))


def test_duplicate_key_and_tensor(tmp_path, small):
    def dup_key(b):
        i = b.index(b"t.i16")
        b[i:i + 5] = b"t.u16"
    _error(_edited(tmp_path, small, "dupkey.gguf", dup_key), GGUFFormatError, "t.u16", "twice")

    def dup_tensor(b):
        i = b.index(b"f16.weight")
        b[i:i + 10] = b"f32.weight"
    _error(_edited(tmp_path, small, "dupt.gguf", dup_tensor), GGUFFormatError, "f32.weight", "twice")


def test_random_damage_is_always_a_format_error_or_a_valid_file(tmp_path_factory, small):
    """Flipped bytes anywhere in the header: the file opens (the bytes were a value) or the
    error is a GGUFFormatError; never an IndexError, struct.error, MemoryError or a hang."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    data = small.read_bytes()
    with GGUFFile(small) as f:
        header_end = f.data_offset
    d = tmp_path_factory.mktemp("gguf-fuzz")

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.lists(st.tuples(st.integers(4, header_end - 1), st.integers(0, 255)), min_size=1, max_size=4))
    def run(edits):
        b = bytearray(data)
        for i, v in edits:
            b[i] = v
        p = d / "fuzz.gguf"
        p.write_bytes(bytes(b))
        try:
            with GGUFFile(p) as f:
                for t in f.tensors:
                    assert t.data_start + t.n_bytes <= len(b)
        except GGUFFormatError as exc:
            assert str(p) in str(exc)

    run()


def test_benchmark_script_runs(small):
    """benchmarks/gguf_open.py on a test file (no CLI timing): it prints its JSON row."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gguf_open.py"
    out = subprocess.run([sys.executable, str(script), "--gguf", str(small), "--repeat", "1", "--no-cli"],
                         capture_output=True, text=True, check=True)
    row = json.loads(out.stdout)
    assert row["tensors"] == len(_tensors(np.random.default_rng(0))) and row["strings"] == 3      # a.str
    assert row["g906_header_s"] > 0 and row["speedup_vs_gguf_py"] > 0
