"""A batch's token masks: llguidance writes one int32 bitmask row per constrained row on the
CPU (bit t of word t // 32: token t allowed); the rows go to the device in one copy and set the
logits of every other token to -inf there."""

from __future__ import annotations

import torch


def allocate(rows: int, vocab_size: int) -> torch.Tensor:
    pin = torch.cuda.is_available()
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32, pin_memory=pin)


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def allowed(bitmask: torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    """The bool [rows, vocab_size] of allowed tokens, on `device`."""
    words = bitmask.to(device, non_blocking=True)
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.view(words.shape[0], -1)[:, :vocab_size].bool()


def apply(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
    """`logits` with the disallowed tokens of rows `rows` (bitmask row i is logits row rows[i])
    set to -inf; a new tensor."""
    v = logits.shape[1]
    ok = allowed(bitmask[: len(rows)], v, logits.device)
    if ok.shape[1] < v:               # logits wider than the vocabulary: the padding is never allowed
        ok = torch.nn.functional.pad(ok, (0, v - ok.shape[1]), value=False)
    out = logits.clone()
    idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
    out[idx] = out[idx].masked_fill(~ok, float("-inf"))
    return out
