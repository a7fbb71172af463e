"""The CPU work a request needs before the engine sees it — JSON parsing and validation, chat
template rendering, tokenization, image decoding — runs in one bounded pool of threads, never on
the event loop: an 8 MiB prompt tokenized on the loop would freeze /health and every stream for
seconds. The pool is its own (not asyncio's default executor, which DNS lookups share) and
bounded, so a burst of heavy requests queues instead of starving the rest of the process.

    ids = await offload(st.prompts.encode, text)
    check_prompt_bytes(st, nbytes, param="prompt")     # before tokenizing: 400 when it cannot fit
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from g906.server.errors import bad_request

T = TypeVar("T")

WORKERS = max(2, min(8, os.cpu_count() or 2))
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="g906-cpu")
        return _pool


async def offload(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(pool(), functools.partial(fn, *args, **kwargs))


# Unicode normalisation (NFC/NFKC) can shrink text before it is split into tokens, by at most
# this factor (a 3-byte fullwidth letter becomes a 1-byte ASCII one)
_NORMALISATION_SHRINK = 3


def check_prompt_bytes(st, nbytes: int, *, param: str) -> None:
    """400 context_length_exceeded for text too long to fit max_model_len whatever it tokenizes
    to: decided from its size in bytes, before any tokenizer runs."""
    per_token = st.max_token_bytes
    if not per_token or st.max_model_len is None:
        return
    limit = st.max_model_len * per_token * _NORMALISATION_SHRINK
    if nbytes > limit:
        raise bad_request(
            f"the prompt is {nbytes} bytes long: more than this model's context (max_model_len "
            f"{st.max_model_len} tokens) can hold whatever it tokenizes to (at most {limit} bytes)",
            param=param, code="context_length_exceeded")
