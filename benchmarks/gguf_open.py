"""Opening a GGUF: g906.binfmt.gguf against gguf-py's GGUFReader, and `g906 up --dry-run FILE`.

    python benchmarks/gguf_open.py                          # qwen3.5-0.8b Q4_K (248,320 tokens)
    python benchmarks/gguf_open.py --gguf model.gguf --repeat 5 --reference-repeat 0

Writes a synthetic GGUF of a real shape once (g906.bench.gguf_out: llama.cpp's layout and the
full-size vocabulary, which is what the header parse pays for), then prints, best of --repeat (a
shared machine only ever adds time):
- header: g906's GGUFFile and gguf-py's GGUFReader on the same file, and their ratio;
- the floor for the header: copying its bytes out of the page cache plus decoding the same
  strings from one contiguous buffer, and the parse's % of that floor;
- `g906 up --dry-run FILE` wall time, against the interpreter+CLI floor (`g906 --version`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def best(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def floor_s(path: Path, header_bytes: int, strings: list[str]) -> float:
    """Copy the header bytes and decode the vocabulary's strings from one buffer: what any parser
    that hands out Python strings must at least do."""
    blob = "\0".join(strings).encode()

    def run():
        with open(path, "rb") as fh:
            fh.read(header_bytes)
        blob.decode().split("\0")
    return best(run, 5)


def cli_s(args: list[str], n: int) -> float:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}

    def run():
        out = subprocess.run([sys.executable, "-m", "g906", *args], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            sys.exit(f"g906 {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return best(run, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3.5-0.8b")
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF to open (written when missing)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reference-repeat", type=int, default=1, help="gguf-py runs (slow); 0 skips it")
    ap.add_argument("--no-cli", action="store_true", help="skip the `g906 up --dry-run` timing")
    args = ap.parse_args()
    if args.gguf is None:
        args.gguf = Path(os.environ.get("TMPDIR", "/tmp")) / f"g906-bench-{args.shape}-q4_k.gguf"
    if not args.gguf.exists():
        from g906.bench.gguf_out import write_synthetic_gguf

        write_synthetic_gguf(args.shape, "q4_k", args.gguf)
    from g906.binfmt.gguf import GGUFFile

    f = GGUFFile(args.gguf)             # warms the page cache for every variant alike
    strings = [s for fld in f.fields.values() if fld.item_type is not None and fld.item_type.name == "STRING"
               for s in fld.value]
    row: dict = {"file": str(args.gguf), "header_bytes": f.data_offset, "fields": len(f.fields),
                 "tensors": len(f.tensors), "strings": len(strings)}
    row["g906_header_s"] = best(lambda: GGUFFile(args.gguf), args.repeat)
    row["floor_s"] = floor_s(args.gguf, f.data_offset, strings)
    row["g906_pct_of_floor"] = round(100 * row["floor_s"] / row["g906_header_s"], 1)
    if args.reference_repeat:
        import gguf

        row["gguf_py_header_s"] = best(lambda: gguf.GGUFReader(str(args.gguf)), args.reference_repeat)
        row["speedup_vs_gguf_py"] = round(row["gguf_py_header_s"] / row["g906_header_s"], 1)
    if not args.no_cli:
        row["up_dry_run_s"] = cli_s(["up", "--dry-run", str(args.gguf)], args.repeat)
        row["cli_floor_s"] = cli_s(["--version"], args.repeat)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, indent=2))


if __name__ == "__main__":
    main()
