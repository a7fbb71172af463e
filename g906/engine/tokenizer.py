"""Tokenizer (HF `tokenizers` library) and incremental detokenization for streaming.

    tok = Tokenizer.from_hf_dir(model_dir)          # tokenizer.json + tokenizer_config.json
    tok = Tokenizer.from_gguf_metadata(gguf.metadata)  # byte-level BPE rebuilt from GGUF
    ids = tok.encode("hello")                       # no special tokens added by default
    text = tok.decode(ids, skip_special_tokens=True)

    detok = IncrementalDetokenizer(tok)
    for token_id in stream: print(detok.add(token_id), end="")
    print(detok.finish())

Rebuilding from GGUF follows what llama.cpp's converter writes: tokenizer.ggml.model "gpt2"
(byte-level BPE), tokenizer.ggml.pre names the pre-tokenizer ("qwen2" or "qwen35" for Qwen:
the regexes below are those of Qwen's tokenizer.json), tokens / token_type (1 normal, 3 control =
special added token, 4 user-defined = non-special added token, 5 unused padding "[PADn]"),
merges ("a b"), and the special token ids. Qwen's tokenizer.json also NFC-normalizes, which GGUF
does not record; it is restored for the Qwen pre-tokenizers.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from g906.errors import G906Error

QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (split regex or None for GPT-2's built-in byte-level regex, NFC normalizer)
_PRE_TOKENIZERS: dict[str, tuple[str | None, bool]] = {
    "qwen2": (QWEN2_PRETOKENIZE_REGEX, True),
    "deepseek-r1-qwen": (QWEN2_PRETOKENIZE_REGEX, True),
    "qwen35": (QWEN35_PRETOKENIZE_REGEX, True),
    "gpt-2": (None, False),
}

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6


# Control tokens that end generation in Qwen chat models (HF generation_config lists both; GGUF
# records only one eos id, so they are added by text, as llama.cpp does for its EOG set).
EOG_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>")


def gguf_eos_token_ids(fields: Mapping[str, Any]) -> list[int]:
    """End-of-generation ids of a GGUF tokenizer: eos, eot, eom ids, then EOG_TOKEN_TEXTS present
    as control tokens."""
    out: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = fields.get(key)
        if v is not None and int(v) not in out:
            out.append(int(v))
    tokens = fields.get("tokenizer.ggml.tokens") if "tokenizer.ggml.tokens" in fields else None
    types = fields.get("tokenizer.ggml.token_type") if "tokenizer.ggml.token_type" in fields else None
    if tokens:
        for text in EOG_TOKEN_TEXTS:
            try:
                i = tokens.index(text)
            except ValueError:
                continue
            if (types is None or types[i] == TOKEN_TYPE_CONTROL) and i not in out:
                out.append(i)
    return out


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet: printable char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def byte_encoder() -> dict[int, str]:
    return {b: c for c, b in byte_decoder().items()}


def _token_content(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping):
        c = v.get("content")
        return c if isinstance(c, str) else None
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise G906Error(f"{path}: cannot read: {exc}") from None


class Tokenizer:
    """A thin wrapper over a `tokenizers.Tokenizer` with the special-token facts the engine needs."""

    def __init__(
        self,
        backend: Any,
        *,
        eos_token_ids: Iterable[int] = (),
        bos_token_id: int | None = None,
        pad_token_id: int | None = None,
        add_bos_token: bool = False,
        chat_template: str | None = None,
        special_tokens_map: Mapping[str, str] | None = None,
        source: str = "",
    ):
        self.backend = backend
        self.eos_token_ids: list[int] = []
        for i in eos_token_ids:
            if i is not None and int(i) not in self.eos_token_ids:
                self.eos_token_ids.append(int(i))
        self.bos_token_id = bos_token_id
        self.pad_token_id = pad_token_id
        self.add_bos_token = add_bos_token
        self.chat_template = chat_template
        self.special_tokens_map: dict[str, str] = dict(special_tokens_map or {})
        self.source = source
        self._special_ids: set[int] = {
            int(i) for i, t in backend.get_added_tokens_decoder().items() if t.special
        }
        self._added_ids: set[int] = set(int(i) for i in backend.get_added_tokens_decoder())
        self._bytes_cache: dict[int, bytes] = {}
        try:
            from tokenizers import decoders

            self.byte_level = isinstance(backend.decoder, decoders.ByteLevel)
        except Exception:  # noqa: BLE001
            self.byte_level = False

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **kwargs: Any) -> "Tokenizer":
        from tokenizers import Tokenizer as _Backend

        p = Path(path)
        if not p.is_file():
            raise G906Error(f"{p}: no such tokenizer file")
        try:
            backend = _Backend.from_file(str(p))
        except Exception as exc:  # noqa: BLE001
            raise G906Error(f"{p}: cannot load the tokenizer: {exc}") from None
        kwargs.setdefault("source", str(p))
        return cls(backend, **kwargs)

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> "Tokenizer":
        d = Path(path)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise G906Error(f"{d}: no tokenizer.json in the model directory",
                            hint="g906 needs the fast-tokenizer file tokenizer.json")
        cfg = _read_json(d / "tokenizer_config.json") or {}
        model_cfg = _read_json(d / "config.json") or {}
        gen_cfg = _read_json(d / "generation_config.json") or {}
        from tokenizers import Tokenizer as _Backend

        try:
            backend = _Backend.from_file(str(tj))
        except Exception as exc:  # noqa: BLE001
            raise G906Error(f"{tj}: cannot load the tokenizer: {exc}") from None
        special: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
            c = _token_content(cfg.get(key))
            if c is not None:
                special[key] = c

        def tid(key: str) -> int | None:
            c = special.get(key)
            return None if c is None else backend.token_to_id(c)

        eos: list[int] = []
        if tid("eos_token") is not None:
            eos.append(tid("eos_token"))
        for src in (gen_cfg, model_cfg.get("text_config", model_cfg), model_cfg):
            v = src.get("eos_token_id") if isinstance(src, Mapping) else None
            for i in ([v] if isinstance(v, int) else list(v or [])):
                if i not in eos:
                    eos.append(int(i))
        template = None
        jinja = d / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        else:
            ct = cfg.get("chat_template")
            if isinstance(ct, str):
                template = ct
            elif isinstance(ct, list):
                named = {e.get("name"): e.get("template") for e in ct if isinstance(e, Mapping)}
                template = named.get("default") or next(iter(named.values()), None)
            elif (d / "chat_template.json").is_file():
                cj = _read_json(d / "chat_template.json") or {}
                template = cj.get("chat_template") if isinstance(cj, Mapping) else None
        return cls(
            backend,
            eos_token_ids=eos,
            bos_token_id=tid("bos_token"),
            pad_token_id=tid("pad_token"),
            add_bos_token=bool(cfg.get("add_bos_token", False)) and tid("bos_token") is not None,
            chat_template=template,
            special_tokens_map=special,
            source=str(d),
        )

    @classmethod
    def from_gguf_metadata(cls, fields: Mapping[str, Any]) -> "Tokenizer":
        """Rebuild the tokenizer from GGUF metadata (values already parsed to python)."""
        from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as _Backend
        from tokenizers.models import BPE

        model = fields.get("tokenizer.ggml.model")
        if model is None:
            raise G906Error("GGUF metadata has no tokenizer (tokenizer.ggml.model is missing)")
        if model != "gpt2":
            raise G906Error(f"GGUF tokenizer model {model!r} is not supported",
                            hint="g906 rebuilds byte-level BPE tokenizers (tokenizer.ggml.model = gpt2)")
        pre = fields.get("tokenizer.ggml.pre") or "default"
        if pre not in _PRE_TOKENIZERS:
            raise G906Error(f"GGUF pre-tokenizer {pre!r} is not supported",
                            hint="supported tokenizer.ggml.pre values: " + ", ".join(_PRE_TOKENIZERS))
        tokens = list(fields.get("tokenizer.ggml.tokens") or [])
        if not tokens:
            raise G906Error("GGUF metadata has no tokenizer.ggml.tokens")
        for key, values in (("tokenizer.ggml.tokens", tokens),
                            ("tokenizer.ggml.merges", fields.get("tokenizer.ggml.merges") or [])):
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:
                raise G906Error(f"{key}[{bad}] is a {type(values[bad]).__name__}, not a string: the vocabulary "
                                "is corrupt", hint="the file is damaged: download it again")
        types = list(fields.get("tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(tokens))
        if len(types) != len(tokens):
            raise G906Error(f"GGUF metadata lists {len(types)} token types for {len(tokens)} tokens")
        merges_raw = list(fields.get("tokenizer.ggml.merges") or [])
        merges: list[tuple[str, str]] = []
        for m in merges_raw:
            parts = m.split(" ")
            if len(parts) != 2:
                raise G906Error(f"GGUF tokenizer merge {m!r} is not two space-separated tokens")
            merges.append((parts[0], parts[1]))
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)
        known = set(vocab)
        for i, (a, b) in enumerate(merges):
            if a not in known or b not in known or a + b not in known:
                missing = next(x for x in (a, b, a + b) if x not in known)
                raise G906Error(f"tokenizer.ggml.merges[{i}] ({a!r} {b!r}) names {missing!r}, which is not in "
                                "tokenizer.ggml.tokens: the vocabulary is corrupt",
                                hint="the file is damaged: download it again")
        backend = _Backend(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
        regex, nfc = _PRE_TOKENIZERS[pre]
        if nfc:
            backend.normalizer = normalizers.NFC()
        if regex is None:
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
        backend.decoder = decoders.ByteLevel()
        # ids are preserved: every added token is already in the BPE vocabulary
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_CONTROL])
        backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_USER_DEFINED])

        def fid(key: str) -> int | None:
            v = fields.get(key)
            return None if v is None else int(v)

        eos = gguf_eos_token_ids(fields)
        special: dict[str, str] = {}
        for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                          ("pad_token", "padding")):
            i = fid(f"tokenizer.ggml.{key}_token_id")
            if i is not None and 0 <= i < len(tokens):
                special[name] = tokens[i]
        bos = fid("tokenizer.ggml.bos_token_id")
        add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
        template = fields.get("tokenizer.chat_template")
        return cls(backend, eos_token_ids=eos, bos_token_id=bos,
                   pad_token_id=fid("tokenizer.ggml.padding_token_id"), add_bos_token=add_bos,
                   chat_template=template if isinstance(template, str) else None,
                   special_tokens_map=special, source="gguf")

    # ------------------------------------------------------------------ API

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def special_token_ids(self) -> set[int]:
        return set(self._special_ids)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special_ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id] + ids
        return list(ids)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token contributes to decoded text (byte-level tokenizers)."""
        tid = int(token_id)
        b = self._bytes_cache.get(tid)
        if b is None:
            tok = self.backend.id_to_token(tid)
            if tok is None:
                b = b""
            else:
                dec = byte_decoder()
                try:
                    b = bytes(dec[c] for c in tok)
                except KeyError:  # not byte-level text (e.g. an added token with a space): as is
                    b = tok.encode("utf-8")
            self._bytes_cache[tid] = b
        return b

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eos={self.eos_token_ids}, source={self.source!r})"


class IncrementalDetokenizer:
    """Turns a token stream into text deltas whose concatenation equals decode(all ids).

    Multi-byte UTF-8 characters split across tokens are held back until complete, so no U+FFFD
    appears mid-stream; finish() flushes what is left (replacement characters only for bytes that
    never formed a valid character, exactly as decode() would show them)."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        self.token_ids: list[int] = []
        self._bytes_mode = tokenizer.byte_level
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._emitted = 0  # generic mode: characters of the full decode already emitted
        self._finished = False

    def add(self, token_id: int) -> str:
        tid = int(token_id)
        self.token_ids.append(tid)
        if self.skip_special_tokens and self.tokenizer.is_special(tid):
            return ""
        if self._bytes_mode:
            delta = self._decoder.decode(self.tokenizer.token_bytes(tid), final=False)
        else:
            full = self.tokenizer.decode(self.token_ids, skip_special_tokens=self.skip_special_tokens)
            end = len(full)
            while end > self._emitted and full[end - 1] == "\ufffd":
                end -= 1  # maybe an incomplete character: wait for the next token
            delta = full[self._emitted:end]
            self._emitted = max(self._emitted, end)
        self.text += delta
        return delta

    def add_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.add(t) for t in token_ids)

    def finish(self) -> str:
        if self._finished:
            return ""
        self._finished = True
        if self._bytes_mode:
            delta = self._decoder.decode(b"", final=True)
        else:
            full = self.tokenizer.decode(self.token_ids, skip_special_tokens=self.skip_special_tokens)
            delta = full[self._emitted:]
            self._emitted = len(full)
        self.text += delta
        return delta


__all__ = ["IncrementalDetokenizer", "Tokenizer", "QWEN2_PRETOKENIZE_REGEX",
           "QWEN35_PRETOKENIZE_REGEX"]
