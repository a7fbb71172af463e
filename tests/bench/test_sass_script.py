"""benchmarks/sass.py: the GEMVs compiled for sm_90 offline (Triton's own ptxas and nvdisasm),
registers and instruction mix read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass.py"), "--json", *args],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_packed_gemv_mix_shows_the_field_pairing():
    paired = _run("--qtype", "Q4_K", "--rows", "2", "--warps", "1")
    single = _run("--qtype", "Q4_K", "--rows", "2", "--warps", "1", "--no-pairs")
    for res in (paired, single):
        assert res["kernel"] == "_pq_gemv_kernel" and 0 < res["registers"] <= 255
        assert res["spill_bytes"] == 0 and res["mix"]["FFMA"] > 0 and res["mix"]["LDG"] > 0
        assert res["instructions"] == sum(res["mix"].values())
    # fields decoded two per shift: fewer shifts than one field at a time (docs/PERF.md run 5)
    assert paired["mix"]["SHF"] < single["mix"]["SHF"]


def test_dense_gemv_split_norm_variants():
    """The consumer loads the producer's partial sums; the producer stores h, hn and them."""
    base = ("--qtype", "F16", "--rows", "4", "--block-k", "128")
    plain = _run(*base)
    consumer = _run(*base, "--rms-in", "--partials", "64")
    producer = _run(*base, "--add-norm")
    assert consumer["mix"]["LDG"] > plain["mix"]["LDG"]
    assert producer["mix"]["STG"] > plain["mix"]["STG"] and producer["mix"]["LDG"] > plain["mix"]["LDG"]
