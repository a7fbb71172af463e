"""The incremental detokenizer of a request's output: the engine's fast one when the tokenizer
is g906's own, else a generic fallback that decodes the whole output at each token."""

from __future__ import annotations


class IncrementalDecoder:
    """Fallback incremental detokenizer for tokenizers without one: text of the generated
    tokens, one token at a time, never ending in a broken UTF-8 character."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.emitted = 0

    def _decode(self) -> str:
        return self.tok.decode(self.ids, skip_special_tokens=self.skip)

    def add(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        full = self._decode()
        end = len(full)
        while end > self.emitted and full[end - 1] == "\ufffd":
            end -= 1
        out = full[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return out

    def finish(self) -> str:
        full = self._decode()
        out = full[self.emitted:]
        self.emitted = len(full)
        return out


def make_detokenizer(tokenizer, skip_special_tokens: bool = True):
    try:
        from g906.engine.tokenizer import IncrementalDetokenizer, Tokenizer
    except ImportError:  # pragma: no cover
        return IncrementalDecoder(tokenizer, skip_special_tokens)
    if isinstance(tokenizer, Tokenizer):
        return IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    return IncrementalDecoder(tokenizer, skip_special_tokens)
