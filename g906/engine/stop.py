"""When a sequence stops, and which text it may show so far.

Token-level stops: eos (unless ignore_eos), stop_token_ids, max_tokens, the context length.
Text-level stops: stop strings. A stop string may be split across several tokens, so the
text a client sees lags by at most the longest suffix that could still grow into a stop
string: that suffix is held back until the next token decides it. On a match the text is cut
where the stop string starts (or after it with include_stop_str_in_output) and nothing past
it is ever emitted."""

from __future__ import annotations

from g906.engine.sampling_params import SamplingParams


class StopStrings:
    """Streams text through a stop-string filter: feed() returns what is safe to show."""

    def __init__(self, stops: list[str], include_stop: bool = False):
        self.stops = [s for s in stops if s]
        self.include_stop = include_stop
        self.text = ""          # all text so far (up to the cut, once stopped)
        self.emitted = 0        # characters of self.text already handed out
        self.matched: str | None = None

    def _holdback(self) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        best = 0
        t = self.text
        for s in self.stops:
            for k in range(min(len(s) - 1, len(t) - self.emitted), best, -1):
                if t.endswith(s[:k]):
                    best = k
                    break
        return best

    def feed(self, delta: str) -> str:
        if self.matched is not None:
            return ""
        self.text += delta
        if self.stops:
            hit_at, hit = -1, None
            for s in self.stops:
                i = self.text.find(s, self.emitted)
                if i != -1 and (hit_at == -1 or i < hit_at):
                    hit_at, hit = i, s
            if hit is not None:
                self.matched = hit
                end = hit_at + len(hit) if self.include_stop else hit_at
                self.text = self.text[:end]
                return self._take(len(self.text))
            return self._take(len(self.text) - self._holdback())
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted:upto]
        self.emitted = upto
        return out

    def flush(self) -> str:
        """The held-back text, once the sequence has stopped for another reason."""
        return self._take(len(self.text))


def token_stop(
    params: SamplingParams,
    token_id: int,
    num_output_tokens: int,
    num_tokens: int,
    eos_token_ids: frozenset[int] | set[int],
    max_model_len: int,
) -> tuple[str | None, int | None]:
    """(finish_reason, stop token) after token_id became the num_output_tokens-th output token.

    finish_reason is "stop" for eos / a stop token (second value: the token), "length" for
    max_tokens or the context length, None to continue."""
    if num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and token_id in eos_token_ids:
            return "stop", token_id
        if token_id in params.stop_token_ids:
            return "stop", token_id
    if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
        return "length", None
    if num_tokens >= max_model_len:
        return "length", None
    return None, None
