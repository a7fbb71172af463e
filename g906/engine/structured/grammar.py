"""From StructuredOutputsParams to a checked llguidance grammar, for one model's tokenizer.

A JSON schema compiles with llguidance's JSON compiler, a regex as a regex, choices as a Lark
alternative of literal strings, a grammar as Lark (GBNF, recognised by its `::=` rules, is
translated first). Every grammar is validated against the tokenizer before a request starts,
so that a bad one is refused with llguidance's message instead of failing mid-generation.
Compiled grammars are cached by constraint (agents send the same schemas again and again)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from g906.engine.structured.params import StructuredOutputsError, StructuredOutputsParams

_CACHE_SIZE = 256


def lark_string(text: str) -> str:
    """A Lark literal for `text` (llguidance reads JSON string syntax)."""
    return json.dumps(text, ensure_ascii=False)


def to_grammar(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar (not yet checked) of a constraint."""
    import llguidance as llg

    kind = spec.kind
    try:
        compact = {"whitespace_flexible": False} if spec.disable_any_whitespace else None
        if kind == "json":
            return llg.LLMatcher.grammar_from_json_schema(spec.json, overrides=compact)
        if kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=compact)
        if kind == "regex":
            return llg.LLMatcher.grammar_from_regex(spec.regex)
        if kind == "choice":
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(lark_string(c) for c in spec.choice))
        text = spec.grammar
        if "::=" in text and not text.lstrip().startswith("%llguidance"):
            from llguidance.gbnf_to_lark import gbnf_to_lark

            text = gbnf_to_lark(text)
        return llg.LLMatcher.grammar_from_lark(text)
    except StructuredOutputsError:
        raise
    except Exception as exc:  # noqa: BLE001 - llguidance's converters raise ValueError and others
        raise StructuredOutputsError(f"{kind}: {exc}", kind) from None


class GrammarCompiler:
    """Grammars for one tokenizer: checked, cached, and turned into matchers."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        self._tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.eos_token_ids = sorted(int(t) for t in eos_token_ids)
        self._ll = None
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()      # the server checks requests while the engine thread runs

    @property
    def ll_tokenizer(self):  # noqa: D401
        """llguidance's view of the tokenizer (built on first use: it reads the whole vocabulary)."""
        if self._ll is None:
            import llguidance as llg

            backend = getattr(self._tokenizer, "backend", None)
            if backend is None or not hasattr(backend, "to_str"):
                raise StructuredOutputsError("structured outputs need a Hugging Face tokenizers tokenizer; "
                                             "this model's tokenizer is not one")
            self._ll = llg.LLTokenizer(_plain_added_tokens_as_text(backend.to_str()), n_vocab=self.vocab_size,
                                       eos_token=self.eos_token_ids or None)
        return self._ll

    def compile(self, spec: StructuredOutputsParams) -> str:
        """The checked grammar of `spec`; StructuredOutputsError naming the problem otherwise."""
        import llguidance as llg

        key = spec.key() + (" compact" if spec.disable_any_whitespace else "")
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        grammar = to_grammar(spec)
        try:
            err = llg.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        except Exception as exc:  # noqa: BLE001
            err = str(exc)
        if err and not err.startswith("WARNING"):
            raise StructuredOutputsError(f"{_what(spec)} cannot be compiled: {err.strip()}", spec.kind)
        with self._lock:
            self._cache[key] = grammar
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def matcher(self, spec: StructuredOutputsParams) -> Any:
        import llguidance as llg

        m = llg.LLMatcher(self.ll_tokenizer, self.compile(spec), log_level=0)
        if m.is_error():
            raise StructuredOutputsError(f"{_what(spec)} cannot be compiled: {m.get_error()}", spec.kind)
        return m

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text))


def _plain_added_tokens_as_text(tokenizer_json: str) -> str:
    """The tokenizer with its non-special added tokens (Qwen's <tool_call>, <think>...) moved into
    the BPE vocabulary: llguidance takes every added token for a special one, whose text a
    grammar cannot match, while to the model they are text (the tool-call format is written
    with them)."""
    data = json.loads(tokenizer_json)
    model = data.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, dict):
        return tokenizer_json
    from g906.engine.tokenizer import byte_encoder

    enc = byte_encoder()
    keep = []
    for tok in data.get("added_tokens") or []:
        if tok.get("special") is False and isinstance(tok.get("content"), str):
            vocab["".join(enc[b] for b in tok["content"].encode("utf-8"))] = tok["id"]
        else:
            keep.append(tok)
    data["added_tokens"] = keep
    return json.dumps(data, ensure_ascii=False)


def _what(spec: StructuredOutputsParams) -> str:
    return {"json": "the JSON schema", "json_object": "the JSON object grammar", "regex": "the regex",
            "choice": "the choices", "grammar": "the grammar"}[spec.kind]
