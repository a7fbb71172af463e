"""The tokenizer that LLM.get_tokenizer() returns: g906's Tokenizer and the model's chat
template behind Hugging Face's method names and defaults, so that scripts written for vLLM's
`llm.get_tokenizer()` (which returns a transformers tokenizer) run unchanged.

    tok = llm.get_tokenizer()
    ids = tok.encode("Hello")                                   # add_special_tokens=True, as HF
    text = tok.decode(ids)
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

Anything else is g906's Tokenizer's own attribute (token_to_id, token_bytes, ...)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from g906.errors import G906Error


class HFStyleTokenizer:
    def __init__(self, tokenizer, prompts):
        """tokenizer: g906's Tokenizer (or a stand-in with encode/decode); prompts: the LLM's
        PromptBuilder, which holds the model's chat template."""
        self.tokenizer = tokenizer
        self._prompts = prompts

    # -- text <-> ids -------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        _no_tensors(kwargs)
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True, **kwargs: Any) -> dict:
        """{"input_ids": ..., "attention_mask": ...} for one text or a list of texts."""
        _no_tensors(kwargs)
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        batch = [self.encode(t, add_special_tokens) for t in text]
        return {"input_ids": batch, "attention_mask": [[1] * len(ids) for ids in batch]}

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else [int(t) for t in token_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False, **_: Any) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]):
        if isinstance(ids, int):
            return self.tokenizer.id_to_token(ids)
        return [self.tokenizer.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]):
        if isinstance(tokens, str):
            return self.tokenizer.token_to_id(tokens)
        return [self.tokenizer.token_to_id(t) for t in tokens]

    # -- chat ---------------------------------------------------------------------------------------
    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]], tools=None, documents=None, *,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            add_special_tokens: bool = False, **template_kwargs: Any) -> str | list[int]:
        """The conversation through the model's chat template: token ids (tokenize=True, the
        default as in transformers) or the text. Extra keyword arguments reach the template
        (enable_thinking=False, ...)."""
        for key in ("return_tensors", "return_dict", "chat_template"):
            if template_kwargs.get(key) is not None:
                raise G906Error(f"apply_chat_template({key}=...) is not supported by g906's tokenizer",
                                hint="call it without that argument (ids come back as a list)")
            template_kwargs.pop(key, None)
        if documents is not None:
            template_kwargs["documents"] = documents
        text = self._prompts.render_chat(conversation, add_generation_prompt=add_generation_prompt, tools=tools,
                                         **template_kwargs)
        if not tokenize:
            return text
        return self.encode(text, add_special_tokens=add_special_tokens)

    @property
    def chat_template(self) -> str | None:
        return self._prompts.template_source

    # -- special tokens -----------------------------------------------------------------------------
    @property
    def eos_token_id(self) -> int | None:
        ids = getattr(self.tokenizer, "eos_token_ids", None) or []
        return ids[0] if ids else None

    @property
    def eos_token(self) -> str | None:
        tid = self.eos_token_id
        return None if tid is None else self.tokenizer.id_to_token(tid)

    @property
    def bos_token_id(self) -> int | None:
        return getattr(self.tokenizer, "bos_token_id", None)

    @property
    def pad_token_id(self) -> int | None:
        return getattr(self.tokenizer, "pad_token_id", None)

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(getattr(self.tokenizer, "special_token_ids", ()) or ())

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    def __len__(self) -> int:
        return self.vocab_size

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "tokenizer":
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def __repr__(self) -> str:
        return f"HFStyleTokenizer({self.tokenizer!r})"


def _no_tensors(kwargs: dict) -> None:
    if kwargs.get("return_tensors") is not None:
        raise G906Error("return_tensors is not supported by g906's tokenizer", hint="ids come back as lists")
