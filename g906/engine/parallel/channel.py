"""The control channel, rank 0 -> workers.

One message = a header broadcast on the gloo control group + at most one payload broadcast on
the compute group (NCCL on GPUs, so tensors already on the device never visit the host):

  header   uint8 [HEADER_BYTES]: 8-byte little-endian length n, then n bytes of pickle of
           {"cmd": str, "meta": dict of plain values, "tensors": [(name, dtype, shape, offset,
           nbytes)]}; a header longer than fits is followed by one more ctrl broadcast of the rest.
  payload  uint8 [total] on the compute device: every tensor's bytes, each starting at an 8-byte
           aligned offset; the receiver takes views (no copies) of one fresh buffer.

Commands (see engine.py / worker.py): "cache" (allocate and bind a cache of the given shape),
"forward" (input ids, positions, the ForwardContext's fields), "logits" (the hidden rows to
project; the pieces are gathered on rank 0), "embed" (token ids: the vocab-parallel embedding,
for the MTP drafter), "rollback" (a speculative verify step's kept tokens per sequence),
"shutdown". The ranks are processes of one user on
one host, so pickle is only ever read from the process that spawned the reader."""

from __future__ import annotations

import dataclasses
import pickle
import struct
from typing import Any

import torch
import torch.distributed as dist

from g906.engine.parallel.group import Comm

HEADER_BYTES = 4096
_ALIGN = 8


class Channel:
    def __init__(self, comm: Comm):
        self.comm = comm
        self._header = torch.zeros(HEADER_BYTES, dtype=torch.uint8)

    # -- rank 0 -------------------------------------------------------------------------------
    def send(self, cmd: str, meta: dict | None = None, tensors: dict[str, torch.Tensor] | None = None) -> None:
        dev = self.comm.device
        descs, pieces, off = [], [], 0
        for name, t in (tensors or {}).items():
            t = t.detach()
            if t.device != dev:
                t = t.to(dev)
            raw = t.contiguous().reshape(-1).view(torch.uint8)
            n = raw.numel()
            descs.append((name, str(t.dtype).replace("torch.", ""), tuple(t.shape), off, n))
            pieces.append(raw)
            pad = (-n) % _ALIGN
            if pad:
                pieces.append(torch.zeros(pad, dtype=torch.uint8, device=dev))
            off += n + pad
        body = pickle.dumps({"cmd": cmd, "meta": meta or {}, "tensors": descs, "total": off},
                            protocol=pickle.HIGHEST_PROTOCOL)
        blob = struct.pack("<q", len(body)) + body
        head = blob[:HEADER_BYTES]
        self._header.zero_()
        self._header[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        dist.broadcast(self._header, src=0, group=self.comm.ctrl)
        if len(blob) > HEADER_BYTES:
            rest = torch.frombuffer(bytearray(blob[HEADER_BYTES:]), dtype=torch.uint8)
            dist.broadcast(rest, src=0, group=self.comm.ctrl)
        if off:
            payload = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
            dist.broadcast(payload, src=0)

    # -- workers ------------------------------------------------------------------------------
    def recv(self) -> tuple[str, dict, dict[str, torch.Tensor]]:
        dist.broadcast(self._header, src=0, group=self.comm.ctrl)
        head = self._header.numpy().tobytes()
        (n,) = struct.unpack("<q", head[:8])
        blob = head[8: 8 + n]
        if 8 + n > HEADER_BYTES:
            rest = torch.empty(8 + n - HEADER_BYTES, dtype=torch.uint8)
            dist.broadcast(rest, src=0, group=self.comm.ctrl)
            blob += rest.numpy().tobytes()
        msg = pickle.loads(blob)
        tensors: dict[str, torch.Tensor] = {}
        if msg["total"]:
            payload = torch.empty(msg["total"], dtype=torch.uint8, device=self.comm.device)
            dist.broadcast(payload, src=0)
            for name, dtype, shape, off, nbytes in msg["tensors"]:
                tensors[name] = payload[off: off + nbytes].view(getattr(torch, dtype)).view(shape)
        return msg["cmd"], msg["meta"], tensors


# -- ForwardContext on the wire ----------------------------------------------------------------

def split_fields(obj: Any, prefix: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """A dataclass (ForwardContext) as (plain fields, tensor fields): any fields it gains later
    travel too."""
    meta, tensors = {}, {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, torch.Tensor):
            tensors[f"{prefix}{f.name}"] = v
        else:
            meta[f.name] = v
    return meta, tensors


def join_fields(cls, meta: dict, tensors: dict[str, torch.Tensor], prefix: str):
    kw = dict(meta)
    for k, v in tensors.items():
        if k.startswith(prefix):
            kw[k[len(prefix):]] = v
    return cls(**kw)
