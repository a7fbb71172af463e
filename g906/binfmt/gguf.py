"""GGUF files (versions 2 and 3, little-endian): the key/value metadata, the tensor table and each
tensor's bytes as a view of one memory map of the file.

    with GGUFFile("Qwen3.5-0.8B-Q4_K_M.gguf") as f:
        f.metadata["general.architecture"]       # "qwen35"
        f.fields["tokenizer.ggml.tokens"].item_type   # GGUFValueType.STRING
        t = f.tensor("token_embd.weight")        # TensorInfo: dims (ggml order), type, n_bytes ...
        raw = f.tensor_data(t)                   # np.uint8 view of the mapping, t.n_bytes long

The header is parsed with struct over the mapping: a 248k-token vocabulary is one pass over its
bytes, not one array object per string, so opening a model costs tens of milliseconds. Values are
plain Python (int, float, bool, str); arrays of numbers are numpy arrays (one np.frombuffer,
copied so the metadata does not pin the mapping), arrays of strings are lists of str, arrays of
arrays are lists. Every offset is computed with Python integers, so a corrupt offset near 2**64
cannot wrap around to a valid-looking one.

Every defect (bad magic, a version other than 2/3, a truncated header, an unknown value or tensor
type, a misaligned tensor, tensor data past the end of the file) is a GGUFFormatError naming the
file, the byte offset and the field or tensor. gguf-py supplies the enums and block sizes only.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_MAX_NESTING = 16   # arrays of arrays: deeper than any writer produces, shallow enough for the stack

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALARS: dict[GGUFValueType, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"), GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"), GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"), GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.UINT64: struct.Struct("<Q"), GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT32: struct.Struct("<f"), GGUFValueType.FLOAT64: struct.Struct("<d"),
    GGUFValueType.BOOL: struct.Struct("<B"),
}
_DTYPES: dict[GGUFValueType, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("<u1"), GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("<u1"),
}


class GGUFFormatError(ValueError):
    """A file that is not a valid GGUF file; `detail` says what is wrong, `offset` where in the
    file the faulty field (key, value, tensor table entry) was read."""

    prefix = ""

    def __init__(self, path: str | os.PathLike[str], detail: str, offset: int | None = None):
        self.path = Path(path)
        self.detail = detail
        self.offset = offset
        super().__init__(f"{self.path}: {self.prefix}{self.located}")

    @property
    def located(self) -> str:
        """The detail with its offset: what the callers put after their own framing."""
        return self.detail + (f" (read at byte {self.offset})" if self.offset is not None else "")


class NotGGUFError(GGUFFormatError):
    """The file does not start with the GGUF magic (an empty file included)."""


class TruncatedGGUFError(GGUFFormatError):
    """The header or a tensor's data runs past the end of the file."""

    prefix = "truncated file: "


class UnknownTensorTypeError(GGUFFormatError):
    """A tensor's ggml type id is not one the installed gguf package knows (a newer format)."""

    def __init__(self, path, detail: str, offset: int | None, type_id: int):
        super().__init__(path, detail, offset)
        self.type_id = type_id


@dataclass(frozen=True)
class Field:
    """One metadata key/value pair. For arrays `item_type` is the element type (ARRAY for arrays
    of arrays) and `count` the number of elements; for scalars item_type is None and count 1."""

    key: str
    type: GGUFValueType
    item_type: GGUFValueType | None
    count: int
    value: Any
    offset: int          # where the pair starts in the file

    @property
    def is_array(self) -> bool:
        return self.type == GGUFValueType.ARRAY


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table. `dims` are in ggml order (innermost first), as stored;
    `shape` is the numpy/torch order (outermost first)."""

    name: str
    dims: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int          # relative to the data section, as stored
    data_start: int      # absolute byte offset of the data in the file
    n_bytes: int
    info_offset: int     # where this entry of the tensor table starts in the file

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.dims))

    @property
    def type_name(self) -> str:
        return self.type.name

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


class GGUFFile:
    """A GGUF file mapped into memory. mode "r": tensor views are read-only; mode "c": private
    copy-on-write pages, writable views that never change the file (torch.from_numpy wants a
    writable array)."""

    def __init__(self, path: str | os.PathLike[str], mode: str = "r"):
        if mode not in ("r", "c"):
            raise ValueError(f"mode must be 'r' or 'c', not {mode!r}")
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            self.size = os.fstat(fh.fileno()).st_size
            if self.size < len(MAGIC):
                head = fh.read(len(MAGIC))
                shown = "an empty file" if not head else f"it starts with {head!r}"
                raise NotGGUFError(self.path, f"not a GGUF file ({shown}, not {MAGIC!r})", 0)
            access = mmap.ACCESS_READ if mode == "r" else mmap.ACCESS_COPY
            self._map = mmap.mmap(fh.fileno(), 0, access=access)
        self.fields: dict[str, Field] = {}
        self.tensors: list[TensorInfo] = []
        self._by_name: dict[str, TensorInfo] = {}
        self._metadata: dict[str, Any] | None = None
        self.version = 0
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0
        try:
            _HeaderParser(self).parse()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ metadata

    @property
    def metadata(self) -> dict[str, Any]:
        """key -> value for every metadata field (see the module docstring for the value types)."""
        if self._metadata is None:
            self._metadata = {k: f.value for k, f in self.fields.items()}
        return self._metadata

    def get(self, key: str, default: Any = None) -> Any:
        f = self.fields.get(key)
        return default if f is None else f.value

    @property
    def architecture(self) -> str | None:
        v = self.get("general.architecture")
        return v if isinstance(v, str) else None

    # ------------------------------------------------------------------ tensors

    def tensor(self, name: str) -> TensorInfo:
        return self._by_name[name]

    def tensor_data(self, t: TensorInfo | str) -> np.ndarray:
        """The tensor's bytes: a uint8 view of the mapping (no copy, pages load on first touch)."""
        info = self._by_name[t] if isinstance(t, str) else t
        return np.frombuffer(self._map, dtype=np.uint8, count=info.n_bytes, offset=info.data_start)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Unmap the file now if no tensor view still uses the mapping (else it is unmapped when
        the last view is freed)."""
        try:
            self._map.close()
        except BufferError:
            pass

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, version={self.version}, fields={len(self.fields)}, "
                f"tensors={len(self.tensors)})")


class _HeaderParser:
    """Reads the header of `f` (its mapping) into f.version, f.fields, f.tensors, f.alignment
    and f.data_offset."""

    def __init__(self, f: GGUFFile):
        self.f = f
        self.buf = f._map
        self.size = f.size
        self.pos = 0

    def fail(self, detail: str, offset: int | None = None, cls=GGUFFormatError) -> NoReturn:
        raise cls(self.f.path, detail, self.pos if offset is None else offset)

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            self.fail(f"{what} needs {n} bytes but the file ends at byte {self.size}",
                      cls=TruncatedGGUFError)

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"the length of {what}")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.fail(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start} of the string)", start)

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        code = self.u32(f"the value type of {what}")
        try:
            return GGUFValueType(code)
        except ValueError:
            self.fail(f"{what} has unknown value type {code} (known: 0-12)", at)

    # ------------------------------------------------------------------ values

    def value(self, vtype: GGUFValueType, what: str, depth: int = 0) -> tuple[Any, GGUFValueType | None, int]:
        """(value, item type, count) of a value of type vtype at the current position."""
        if vtype == GGUFValueType.STRING:
            return self.string(what), None, 1
        if vtype == GGUFValueType.ARRAY:
            return self.array(what, depth)
        st = _SCALARS[vtype]
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return (bool(v) if vtype == GGUFValueType.BOOL else v), None, 1

    def array(self, what: str, depth: int) -> tuple[Any, GGUFValueType, int]:
        if depth >= _MAX_NESTING:
            self.fail(f"{what} nests arrays more than {_MAX_NESTING} deep")
        item = self.value_type(f"the elements of {what}")
        at = self.pos
        count = self.u64(f"the length of {what}")
        dtype = _DTYPES.get(item)
        if dtype is not None:
            self.need(count * dtype.itemsize, f"{what} ({count} x {item.name})")
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            return (arr.astype(bool) if item == GGUFValueType.BOOL else arr), item, count
        # every string or inner array takes at least 8 bytes: a corrupt count fails here, before
        # a list of that length is built
        if count * 8 > self.size - self.pos:
            self.fail(f"{what} claims {count} elements, more than the rest of the file holds",
                      at, cls=TruncatedGGUFError)
        if item == GGUFValueType.STRING:
            return self.strings(count, what), item, count
        out = []
        for i in range(count):
            out.append(self.array(f"{what}[{i}]", depth + 1)[0])
        return out, item, count

    def strings(self, count: int, what: str) -> list[str]:
        """`count` length-prefixed strings in one pass over the mapping."""
        buf, size, unpack = self.buf, self.size, _U64.unpack_from
        pos = self.pos
        out: list[str] = []
        append = out.append
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.fail(f"{what}[{i}] runs past the end of the file ({size} bytes)",
                          cls=TruncatedGGUFError)
            (n,) = unpack(buf, pos)
            end = pos + 8 + n
            if end > size:
                self.fail(f"{what}[{i}] ({n} bytes) runs past the end of the file ({size} bytes)",
                          pos, cls=TruncatedGGUFError)
            try:
                append(buf[pos + 8:end].decode("utf-8"))
            except UnicodeDecodeError as exc:
                self.fail(f"{what}[{i}] is not valid UTF-8 ({exc.reason} at byte {exc.start} of the string)", pos)
            pos = end
        self.pos = pos
        return out

    # ------------------------------------------------------------------ header

    def parse(self) -> None:
        f = self.f
        if bytes(self.buf[:4]) != MAGIC:
            self.fail(f"not a GGUF file (it starts with {bytes(self.buf[:4])!r}, not {MAGIC!r})", 0, NotGGUFError)
        self.pos = 4
        version = self.u32("the version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFFFF == 0 and (version >> 24) in (1, 2, 3):
                detail = "a big-endian GGUF file; only little-endian files are supported"
            else:
                detail = f"GGUF version {version} is not supported (only versions 2 and 3)"
            self.fail(detail, 4)
        f.version = version
        n_tensors = self.u64("the tensor count")
        n_kv = self.u64("the metadata count")
        for i in range(n_kv):
            at = self.pos
            key = self.string(f"metadata key #{i}")
            vtype = self.value_type(f"metadata {key}")
            value, item, count = self.value(vtype, f"metadata {key}")
            if key in f.fields:
                self.fail(f"metadata key {key} appears twice", at)
            f.fields[key] = Field(key, vtype, item, count, value, at)
        self.alignment()
        infos = [self.tensor_info(i) for i in range(n_tensors)]
        pad = -self.pos % f.alignment
        f.data_offset = self.pos + pad
        for name, dims, gtype, rel, at in infos:
            f.tensors.append(self.place(name, dims, gtype, rel, at))
        for t in f.tensors:
            if t.name in f._by_name:
                self.fail(f"tensor {t.name} appears twice in the tensor table", t.info_offset)
            f._by_name[t.name] = t

    def alignment(self) -> None:
        fld = self.f.fields.get("general.alignment")
        align = DEFAULT_ALIGNMENT
        if fld is not None:
            if fld.type != GGUFValueType.UINT32 or fld.value == 0 or fld.value & (fld.value - 1):
                self.fail(f"general.alignment must be a power of two stored as uint32, not "
                          f"{fld.value!r} ({fld.type.name})", fld.offset)
            align = fld.value
        self.f.alignment = align

    def tensor_info(self, i: int) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int, int]:
        at = self.pos
        name = self.string(f"the name of tensor #{i}")
        n_dims = self.u32(f"the dimension count of tensor {name}")
        self.need(8 * n_dims, f"the dimensions of tensor {name}")
        dims = struct.unpack_from(f"<{n_dims}Q", self.buf, self.pos)
        self.pos += 8 * n_dims
        type_at = self.pos
        type_id = self.u32(f"the type of tensor {name}")
        try:
            gtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise UnknownTensorTypeError(
                self.f.path, f"tensor {name} has ggml type {type_id}, which the installed gguf package "
                f"does not know (a newer quantization type?)", type_at, type_id) from None
        rel = self.u64(f"the data offset of tensor {name}")
        return name, tuple(dims), gtype, rel, at

    def place(self, name: str, dims: tuple[int, ...], gtype: GGMLQuantizationType, rel: int, at: int) -> TensorInfo:
        f = self.f
        if rel % f.alignment:
            self.fail(f"tensor {name} starts at data offset {rel}, which is not a multiple of the file's "
                      f"alignment ({f.alignment})", at)
        n = 1
        for d in dims:
            n *= d
        block, type_size = GGML_QUANT_SIZES[gtype]
        if n % block or (dims and dims[0] % block):
            self.fail(f"tensor {name} has an impossible shape {list(dims)} for its type {gtype.name} "
                      f"(rows must be whole blocks of {block})", at)
        n_bytes = n // block * type_size
        start = f.data_offset + rel
        if start + n_bytes > self.size:
            self.fail(f"tensor {name} ({gtype.name}, {n_bytes} bytes at byte {start}) would end at "
                      f"byte {start + n_bytes} but the file has {self.size}", at, TruncatedGGUFError)
        return TensorInfo(name, dims, gtype, rel, start, n_bytes, at)


__all__ = [
    "DEFAULT_ALIGNMENT", "MAGIC", "SUPPORTED_VERSIONS", "Field", "GGUFFile", "GGUFFormatError",
    "NotGGUFError", "TensorInfo", "TruncatedGGUFError", "UnknownTensorTypeError",
]
