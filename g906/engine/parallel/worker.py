"""A tensor-parallel worker: `python -m g906.engine.parallel.worker` (started by engine.py).

Protocol with rank 0 (the process that started it):
  stdin       one JSON line (the spec: rank, size, device, store, source, dtype, threads,
              timeout_s, status_fd), then nothing: the worker exits at once when stdin reaches
              EOF, i.e. when rank 0 closes it or dies (no orphans, whatever killed rank 0).
  status_fd   JSON lines to rank 0: {"event": "ready"} (imports done), {"event": "loaded",
              "info": {...}}, {"event": "error", "message", "hint"} (then exit status 1).
  collectives the control channel (channel.py) and the model's own collectives.
SIGINT and SIGTERM are ignored: a terminal's Ctrl-C or a drain signal is rank 0's to handle,
and the worker ends with it."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback


def _watch_parent() -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except Exception:  # noqa: BLE001
        pass
    os._exit(0)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = json.loads(sys.stdin.buffer.readline().decode("utf-8"))
    status = os.fdopen(int(spec["status_fd"]), "w", buffering=1, encoding="utf-8")

    def report(event: str, **kw) -> None:
        try:
            status.write(json.dumps({"event": event, **kw}) + "\n")
            status.flush()
        except OSError:
            pass

    threading.Thread(target=_watch_parent, name="g906-tp-parent", daemon=True).start()
    rank = int(spec["rank"])
    try:
        import torch

        from g906.engine.parallel.engine import load_rank
        from g906.engine.parallel.group import init_distributed

        torch.set_num_threads(max(1, int(spec.get("threads") or 1)))
        report("ready")
        device = torch.device(spec["device"])
        comm = init_distributed(rank, int(spec["size"]), device, spec["store"], float(spec["timeout_s"]))
        model, _src, _cfg, stats = load_rank(spec["source"], comm, dtype=getattr(torch, spec["dtype"]),
                                             device=device, max_model_len=spec.get("max_model_len"))
        report("loaded", info=stats)
        serve(comm, model)
        report("stopped")
        from g906.engine.parallel.group import destroy_distributed

        destroy_distributed()
        return 0
    except BaseException as exc:  # noqa: BLE001 - everything goes to rank 0
        from g906.errors import G906Error

        if isinstance(exc, G906Error):
            report("error", message=exc.message, hint=exc.hint)
        else:
            report("error", message=f"{type(exc).__name__}: {exc}", hint=None)
        if not isinstance(exc, G906Error) or os.environ.get("G906_DEBUG") not in (None, "", "0"):
            sys.stderr.write(f"[g906 tensor-parallel rank {rank}] " + "".join(traceback.format_exc()))
            sys.stderr.flush()
        return 1


def serve(comm, model) -> None:
    """Answer rank 0's commands until "shutdown"."""
    import torch

    from g906.engine.cache import ModelCache
    from g906.engine.context import ForwardContext
    from g906.engine.parallel.channel import Channel, join_fields
    from g906.engine.parallel.group import fault_from_env
    from g906.engine.parallel.layers import rank_logits

    chan = Channel(comm)
    fault = fault_from_env()
    if fault is not None and fault.rank != comm.rank:
        fault = None
    steps = 0
    cache = None
    while True:
        cmd, meta, t = chan.recv()
        if cmd == "forward":
            steps += 1
            if fault is not None and steps == fault.step:
                _misbehave(fault.kind)
            ctx = join_fields(ForwardContext, meta["ctx"], t, "ctx.")
            kwargs = {k[3:]: v for k, v in t.items() if k.startswith("kw.")}
            kwargs.update(meta.get("kw", {}))
            model.forward(t["input_ids"], t["positions"], ctx, **kwargs)
        elif cmd == "embed":
            model.embed(t["ids"])
        elif cmd == "rollback":
            model.rollback_linear_state(t["keep"], t.get("snaps"))
        elif cmd == "logits":
            comm.gather_rows(rank_logits(model, t["hidden"]))
        elif cmd == "cache":
            cache = None
            model.cache = None
            cache = ModelCache.allocate(model.config, num_blocks=meta["num_blocks"], block_size=meta["block_size"],
                                        num_state_slots=meta["num_state_slots"], dtype=getattr(torch, meta["dtype"]),
                                        device=comm.device)
            model.bind_cache(cache)
        elif cmd == "copy_states":
            cache.copy_states(meta["src"], meta["dst"])
        elif cmd == "copy_blocks":
            cache.copy_blocks(meta["src"], meta["dst"])
        elif cmd == "shutdown":
            return
        else:
            raise RuntimeError(f"unknown tensor-parallel command {cmd!r}")


def _misbehave(kind: str) -> None:
    """The test-only fault hook (G906_TP_FAULT)."""
    if kind == "exit":
        os._exit(3)
    if kind == "hang":
        while True:
            time.sleep(3600)
    raise RuntimeError("G906_TP_FAULT: injected failure")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)     # not sys.exit: the parent-watch thread is blocked reading stdin
