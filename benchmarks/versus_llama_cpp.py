#!/usr/bin/env python
"""g906 and llama.cpp side by side on one GPU, the same files, in one run: every speed figure of
the performance page with llama.cpp's beside it, the hardware limit and the % of it.

    python benchmarks/versus_llama_cpp.py --out "$OUT"                          # a GPU machine
    python benchmarks/versus_llama_cpp.py --quick --device cpu --llama-bin DIR  # dry run, tiny shapes

llama.cpp: the tools in --llama-bin (default .llama/bin) when they start; else .llama/llama-bin.tar.gz
(what an earlier run packed); else built from --llama-src (default .llama/llama.cpp-src.tar.gz) in
the background while the first rows run, then packed to OUT/llama-bin.tar.gz.* (parts of 15 MiB:
`cat` them back into .llama/llama-bin.tar.gz and later runs skip the build). .llama/ is ignored by
git: llama.cpp's source and binaries never enter the repository.

Files: random-weight GGUFs of the real shapes, written by g906.bench.gguf_out (llama.cpp's
qwen35 / qwen35moe layout, "Q4_K_M" = llama.cpp's type mix), into --work, one group at a time.
Groups (--groups, in this order by default; a group that would start after --budget-s is
recorded as skipped):

  dense       9B Q4_K_M / F16 / Q8_0 and 0.8B F16: decode tg128 after a 512-token prompt (batch 1);
              9B F16 prefill pp512 and pp2048
  c64         9B F16, 64 concurrent streamed requests 512 in / 256 out through the servers
              (g906 up, llama-server -np 64)
  moe         35B-A3B Q4_K_M: decode batch 1 and 16 against the active-bytes limit, prefill pp512
  27b         27B Q4_K_M decode batch 1
  spec        speculative verify cost, k+1 positions vs one decode step, projected MTP speedup
              (benchmarks/speculative.py, 9B Q4_K_M shape, g906 only)
  prefix      TTFT of turns 2..10 of a growing agent conversation, cache on vs off
              (benchmarks/prefix_cache.py, 9B Q4_K_M shape, g906 only)
  structured  json-schema-constrained vs free decode tok/s at batch 1 and 16
              (benchmarks/structured.py on the 9B Q4_K_M file, g906 only)
  int4        GPTQ-style int4 GEMV/GEMM beside Q4_K on the 9B projections (benchmarks/int4.py)

Limits: decode = copy bandwidth / bytes read per token (MoE: the shared weights + top_k/E of the
experts at batch 1; at batch 16 the expected distinct experts of 16 tokens); prefill = the fp16
matmul rate / 2 FLOP per parameter (+ attention). Both rates are measured at the start of the
run. Results: OUT/versus-llama-cpp.json (rows, GPU, driver, commits) after every row, and a
table printed at the end."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from g906.bench.bandwidth import measure_copy_bandwidth, measure_matmul_flops  # noqa: E402
from g906.bench.gguf_out import write_synthetic_gguf  # noqa: E402
from g906.bench.llama_cpp import LlamaCpp  # noqa: E402
from g906.bench.metrics import LengthSpec, Workload  # noqa: E402
from g906.bench.offline import make_engine, open_model, run_offline  # noqa: E402
from g906.bench.online import serve_g906  # noqa: E402
from g906.bench.run_record import environment, free, log  # noqa: E402
from g906.errors import G906Error  # noqa: E402

GROUPS = ("dense", "moe", "prefix", "structured", "c64", "spec", "27b", "int4")
FILES = {"9b-q4_k": ("qwen3.5-9b", "q4_k"), "9b-f16": ("qwen3.5-9b", "f16"), "9b-q8_0": ("qwen3.5-9b", "q8_0"),
         "0.8b-f16": ("qwen3.5-0.8b", "f16"), "27b-q4_k": ("qwen3.5-27b", "q4_k"),
         "35b-a3b-q4_k": ("qwen3.5-35b-a3b", "q4_k")}
# the goals: (% of limit at least, × llama.cpp at least)
GOALS = {"9b-f16-decode": (88, None), "9b-q8_0-decode": (80, None), "9b-q4_k-decode": (70, 2.2),
         "35b-a3b-q4_k-decode": (60, 2.0), "9b-f16-pp512": (None, 1.5), "9b-f16-c64": (None, 1.2)}
QUICK = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512, vocab_size=2048, num_attention_heads=2,
             num_key_value_heads=1, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=32, linear_value_head_dim=32)
QUICK_MOE = dict(QUICK, intermediate_size=256, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                 shared_expert_intermediate_size=256)


class Run:
    """The run's state: lengths, rates, llama.cpp, the JSON written after every row."""

    def __init__(self, args):
        self.args = args
        q = args.quick
        self.P, self.O, self.P2 = (32, 16, 64) if q else (512, 128, 2048)
        self.N64, self.O64 = (4, 8) if q else (64, 256)
        self.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.out_dir = Path(args.out) if args.out else None
        self.t0 = time.perf_counter()
        self.llama: LlamaCpp | None = None
        self.llama_error: str | None = None
        self.llama_ready = threading.Event()
        self.res = {"environment": environment(self.device, ROOT), "rows": [], "skipped": [], "llama_cpp": {}}
        self.out_name = "versus-llama-cpp.json"

    # ---------------------------------------------------------------- output

    def save(self) -> None:
        if self.out_dir:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / self.out_name).write_text(json.dumps(self.res, indent=1, default=str))

    def row(self, row_id: str, label: str, unit: str, g906: float | None, llama: float | None = None, *,
            limit: float | None = None, detail: dict | None = None, error: str | None = None) -> dict:
        r = {"id": row_id, "label": label, "unit": unit, "g906": _r(g906), "limit": _r(limit), "error": error,
             "detail": detail or {}}
        self._derive(r, llama)
        self.res["rows"].append(r)
        self.save()
        log(f"{label}: g906 {r['g906']} {unit}, llama.cpp {r['llama_cpp']}, limit {r['limit']}"
            + (f" ({r['pct_of_limit']}%)" if r["pct_of_limit"] else "") + (f" ERROR {error}" if error else ""))
        return r

    def set_llama(self, r: dict, llama: float | None, raw) -> None:
        r["detail"]["llama_cpp"] = raw
        self._derive(r, llama)
        self.save()
        log(f"{r['label']}: llama.cpp {r['llama_cpp']} (g906 {r['g906']}, x{r['ratio']})")

    def _derive(self, r: dict, llama: float | None) -> None:
        """The fields computed from g906's and llama.cpp's figures and the limit."""
        g906, limit = r["g906"], r["limit"]
        r["llama_cpp"] = _r(llama)
        r["pct_of_limit"] = round(100 * g906 / limit, 1) if g906 and limit else None
        r["llama_cpp_pct_of_limit"] = round(100 * llama / limit, 1) if llama and limit else None
        r["ratio"] = round(g906 / llama, 2) if g906 and llama else None
        goal = GOALS.get(r["id"])
        if goal and g906:
            want_pct, want_ratio = goal
            r["goal"] = " and ".join(x for x in (f">= {want_pct}% of limit" if want_pct else "",
                                                 f">= {want_ratio}x llama.cpp" if want_ratio else "") if x)
            checks = [r["pct_of_limit"] >= want_pct if want_pct and r["pct_of_limit"] is not None else None,
                      r["ratio"] >= want_ratio if want_ratio and r["ratio"] is not None else None]
            wanted = [c for c, w in zip(checks, goal) if w is not None]
            # a missed part fails the goal; it is met only when every part is known and met
            r["met"] = None if self.args.quick else (False if False in wanted else (True if None not in wanted else None))

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    # ---------------------------------------------------------------- llama.cpp

    def start_llama(self) -> None:
        """Find llama.cpp's tools, or build them in a background thread."""
        a = self.args
        tools = LlamaCpp.find(a.llama_bin)
        packed = Path(a.llama_bin).parent / "llama-bin.tar.gz"
        if tools is None and packed.is_file():
            dest = self.work / "llama-bin"
            with tarfile.open(packed) as tar:
                tar.extractall(dest, filter="data")
            tools = LlamaCpp.find(dest)
        if tools is not None:
            self.llama = tools
            self.res["llama_cpp"] = {"bin": str(tools.bin_dir), "version": tools.commit, "built_here": False}
            self.llama_ready.set()
            return
        if not Path(a.llama_src).exists():
            self.llama_error = f"no llama.cpp tools in {a.llama_bin} and no source at {a.llama_src}"
            self.llama_ready.set()
            return

        def build():
            t = time.perf_counter()
            try:
                log("building llama.cpp in the background")
                arch = "native" if self.device.type == "cuda" else "90"
                jobs = max(2, (os.cpu_count() or 4) - 2)
                commit_file = Path(a.llama_src).with_name("COMMIT")
                commit = commit_file.read_text().strip() if commit_file.is_file() else None
                self.llama = LlamaCpp.build(a.llama_src, self.work / "llama", cuda_arch=arch, jobs=jobs, commit=commit,
                                            log=self.work / "llama-build.log")
                self.res["llama_cpp"] = {"bin": str(self.llama.bin_dir), "version": self.llama.commit,
                                         "built_here": True, "build_s": round(time.perf_counter() - t, 1)}
                if self.out_dir:
                    self.llama.pack(self.out_dir, self.work, log)
                log(f"llama.cpp built in {time.perf_counter() - t:.0f} s: {self.llama.commit}")
            except Exception as exc:
                self.llama_error = f"{type(exc).__name__}: {exc}"
                log(f"llama.cpp build failed: {self.llama_error}")
            finally:
                self.save()
                self.llama_ready.set()

        threading.Thread(target=build, daemon=True).start()

    def llama_tools(self) -> LlamaCpp | None:
        self.llama_ready.wait()
        return self.llama

    def llama_call(self, what: str, fn):
        """fn(tools) -> value, or None (the error recorded) when llama.cpp is missing or fails."""
        tools = self.llama_tools()
        if tools is None:
            self.res["llama_cpp"].setdefault("errors", []).append(f"{what}: {self.llama_error}")
            return None
        try:
            return fn(tools)
        except G906Error as exc:
            self.res["llama_cpp"].setdefault("errors", []).append(f"{what}: {exc}")
            log(f"llama.cpp {what}: {exc}")
            return None

    # ---------------------------------------------------------------- files and g906 runs

    def file(self, key: str) -> Path:
        path = self.work / f"{key}.gguf"
        if not path.is_file():
            shape, quant = FILES[key]
            ov = (QUICK_MOE if "a3b" in shape else QUICK) if self.args.quick else None
            t = time.perf_counter()
            info = write_synthetic_gguf(shape, quant, path.with_suffix(".part"), overrides=ov, device=self.device)
            path.with_suffix(".part").rename(path)
            self.res.setdefault("files", {})[key] = {"bytes": info["bytes"], "write_s": round(time.perf_counter() - t, 1)}
            log(f"wrote {path.name}: {info['bytes'] / 1e9:.2f} GB in {time.perf_counter() - t:.0f} s")
        return path

    def drop(self, key: str) -> None:
        (self.work / f"{key}.gguf").unlink(missing_ok=True)

    def g906_engine(self, path: Path, *, seqs: int = 1, longest: int | None = None):
        t = time.perf_counter()
        loaded = open_model(model=str(path), device=str(self.device))
        longest = longest or self.P
        wl = Workload(num_requests=seqs, prompt_len=LengthSpec(longest, longest), output_len=LengthSpec(self.O, self.O),
                      concurrency=seqs)
        engine = make_engine(loaded, wl, max_num_seqs=seqs, max_model_len=longest + self.O + 64,
                             max_num_batched_tokens=longest)
        log(f"g906 loaded {path.name} in {time.perf_counter() - t:.0f} s")
        return loaded, engine

    def decode(self, engine, seqs: int = 1) -> dict:
        wl = Workload(num_requests=seqs if seqs > 1 else 2, prompt_len=LengthSpec(self.P, self.P),
                      output_len=LengthSpec(self.O, self.O), concurrency=seqs)
        return run_offline(engine, wl)

    def prefill(self, engine, n: int, reps: int = 4) -> dict:
        wl = Workload(num_requests=reps, prompt_len=LengthSpec(n, n), output_len=LengthSpec(1, 1), concurrency=1)
        return run_offline(engine, wl)


def _r(x):
    return None if x is None else round(float(x), 2)


# ------------------------------------------------------------------------------------- groups


DENSE = (("9b-q4_k", "9B Q4_K_M"), ("9b-f16", "9B F16"), ("9b-q8_0", "9B Q8_0"), ("0.8b-f16", "0.8B F16"))


def g_dense(run: Run) -> None:
    """g906 on every file first (while llama.cpp may still be building), then llama.cpp on the
    same files; then g906's first row again, as a control for the build's load on the host."""
    P, O, P2 = run.P, run.O, run.P2
    done = []
    for key, label in DENSE:
        if run.args.dense and key not in run.args.dense:
            continue
        if run.elapsed() > run.args.budget_s:
            run.res["skipped"].append(f"{key}: time budget")
            continue
        path = run.file(key)
        building = not run.llama_ready.is_set()
        loaded, engine = run.g906_engine(path, longest=P2 if key == "9b-f16" else P)
        res = run.decode(engine)
        res["llama_cpp_building"] = building
        limit = run.res["copy_bandwidth_bytes_s"] / loaded.info["bytes_per_token"]
        rows = [run.row(f"{key}-decode", f"{label} decode tg{O} after {P}", "tok/s", res["decode_tok_s"], limit=limit,
                        detail={"g906": res, "bytes_per_token": loaded.info["bytes_per_token"]})]
        if key == "9b-f16":
            for n in (P, P2):
                r = run.prefill(engine, n)
                fpt = prefill_flops_per_token(loaded, n)
                rows.append(run.row(f"{key}-pp{n}", f"{label} prefill pp{n}", "tok/s", r["prefill_tok_s"],
                                    limit=run.res["matmul_flops_s"] / fpt, detail={"g906": r, "flops_per_token": fpt}))
        done.append((key, path, rows))
        del engine, loaded
        free()
    for key, path, rows in done:
        for r in rows:
            if r["id"].endswith("-decode"):
                lb = run.llama_call(f"{key} tg{O}@d{P}", lambda t: t.bench(path, n_gen=O, depth=P))
            else:
                n = int(r["id"].rsplit("pp", 1)[1])
                lb = run.llama_call(f"{key} pp{n}", lambda t: t.bench(path, n_prompt=n, n_gen=0))
            run.set_llama(r, lb and lb["tok_s"], lb)
    if done and done[0][2][0]["detail"]["g906"].get("llama_cpp_building"):
        key, path, rows = done[0]
        loaded, engine = run.g906_engine(path)
        res = run.decode(engine)
        rows[0]["detail"]["g906_after_build"] = res
        log(f"{key} again, llama.cpp built: {res['decode_tok_s']:.1f} tok/s (first: {rows[0]['g906']})")
        del engine, loaded
        free()
    for key, _, _ in done:
        if key != "9b-f16" or "c64" not in run.args.groups:
            run.drop(key)


def g_c64(run: Run) -> None:
    """64 concurrent streamed requests through each server, on the 9B F16 file."""
    from g906.bench.online import run_online

    path = run.file("9b-f16")
    N, P, O = run.N64, run.P, run.O64
    wl = Workload(num_requests=N, prompt_len=LengthSpec(P, P), output_len=LengthSpec(O, O), concurrency=N)
    vocab = 2000 if run.args.quick else 150000
    g = None
    try:
        with serve_g906(path, N, P + O + 64, run.work / "g906-up.log") as url:
            g = run_online(url, wl, vocab=vocab)
    except Exception as exc:
        run.res.setdefault("errors", []).append(f"c64 g906: {type(exc).__name__}: {exc}")

    def llama(t: LlamaCpp):
        with t.server(path, parallel=N, ctx=N * (P + O + 64), log=run.work / "llama-server.log") as url:
            return run_online(url, wl, vocab=vocab)

    lr = run.llama_call("c64 llama-server", llama)
    run.row("9b-f16-c64", f"9B F16 {N} x {P}/{O} (server)", "out tok/s", g and g["output_tok_s"],
            lr and lr["output_tok_s"], detail={"g906": g, "llama_cpp": lr})
    run.drop("9b-f16")


def g_moe(run: Run) -> None:
    key = "35b-a3b-q4_k"
    path = run.file(key)
    P, O = run.P, run.O
    lb = run.llama_call(f"{key} tg{O}@d{P}", lambda t: t.bench(path, n_gen=O, depth=P))
    lp = run.llama_call(f"{key} pp{P}", lambda t: t.bench(path, n_prompt=P, n_gen=0))
    lbb = run.llama_call(f"{key} batched", lambda t: t.batched(path, pp=P, tg=O, parallel=[1, 16]))
    loaded, engine = run.g906_engine(path, seqs=16)
    c = loaded.config
    bw = run.res["copy_bandwidth_bytes_s"]
    per_token = loaded.info["bytes_per_token"]
    experts = loaded.info.get("expert_bytes", 0)
    shared = per_token - experts * c.num_experts_per_tok / c.num_experts
    r1 = run.decode(engine, 1)
    run.row(f"{key}-decode", f"35B-A3B Q4_K_M decode b=1 tg{O} after {P}", "tok/s", r1["decode_tok_s"],
            lb and lb["tok_s"], limit=bw / per_token,
            detail={"g906": r1, "llama_cpp": lb, "active_bytes_per_token": per_token, "expert_bytes": experts})
    r16 = run.decode(engine, 16)
    touched = 1 - (1 - c.num_experts_per_tok / c.num_experts) ** 16      # expected share of experts read
    step_bytes = shared + experts * touched
    l16 = next((x["speed_tg"] for x in lbb or [] if x.get("pl") == 16), None)
    run.row(f"{key}-decode-b16", "35B-A3B Q4_K_M decode b=16", "tok/s", r16["decode_tok_s"], l16,
            limit=16 * bw / step_bytes, detail={"g906": r16, "llama_cpp": lbb, "bytes_per_step": step_bytes})
    rp = run.prefill(engine, P)
    fpt = prefill_flops_per_token(loaded, P)
    run.row(f"{key}-pp{P}", f"35B-A3B Q4_K_M prefill pp{P}", "tok/s", rp["prefill_tok_s"], lp and lp["tok_s"],
            limit=run.res["matmul_flops_s"] / fpt, detail={"g906": rp, "llama_cpp": lp, "flops_per_token": fpt})
    del engine, loaded
    free()
    run.drop(key)


def g_27b(run: Run) -> None:
    key = "27b-q4_k"
    path = run.file(key)
    lb = run.llama_call(f"{key} tg{run.O}@d{run.P}", lambda t: t.bench(path, n_gen=run.O, depth=run.P))
    loaded, engine = run.g906_engine(path)
    r = run.decode(engine)
    run.row(f"{key}-decode", f"27B Q4_K_M decode tg{run.O} after {run.P}", "tok/s", r["decode_tok_s"],
            lb and lb["tok_s"], limit=run.res["copy_bandwidth_bytes_s"] / loaded.info["bytes_per_token"],
            detail={"g906": r, "llama_cpp": lb, "bytes_per_token": loaded.info["bytes_per_token"]})
    del engine, loaded
    free()
    run.drop(key)


def prefill_flops_per_token(loaded, context: int) -> float:
    """2 FLOP per matrix weight a prompt token runs through (MoE: top_k of the experts; not the
    embedding, and the LM head runs for the last token only) + causal attention over half the
    context on average."""
    from g906.engine.synthetic import tensor_specs

    c = loaded.config
    weights = 0.0
    for name, kind, shape in tensor_specs(c):
        if kind == "mat" and not name.endswith(("embed_tokens.weight", "lm_head.weight")):
            weights += shape[0] * shape[1]
        elif kind == "experts":
            weights += shape[0] * shape[1] * shape[2] * c.num_experts_per_tok / c.num_experts
    attn = len(c.full_attention_layers) * 2 * 2 * c.num_attention_heads * c.head_dim * (context / 2)
    return 2 * weights + attn


def _script(run: Run, name: str, args: list[str], json_name: str, timeout: float) -> dict | None:
    """A benchmark script of its own (a fresh process), its JSON back."""
    out = run.work / json_name
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(ROOT / "benchmarks" / name), *args]
    log("run " + " ".join(cmd[1:]))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        run.res.setdefault("errors", []).append(f"{name}: ran past {timeout:.0f} s")
        return None
    (run.work / (json_name + ".log")).write_text(r.stdout + r.stderr)
    if r.returncode != 0 or not out.is_file():
        run.res.setdefault("errors", []).append(f"{name} exited {r.returncode}: {(r.stderr or r.stdout)[-600:]}")
        return None
    return json.loads(out.read_text())


def _shape_args(run: Run) -> list[str]:
    if not run.args.quick:
        return ["--shape", "qwen3.5-9b", "--quant", "q4_k", "--device", str(run.device)]
    return ["--quick", "--device", str(run.device)]


def g_spec(run: Run) -> None:
    d = _script(run, "speculative.py", [*_shape_args(run), "--out", str(run.work / "spec.json")], "spec.json", 420)
    for row in (d or {}).get("rows", []):
        if row["method"] == "mtp" and row["k"] == 3 or (run.args.quick and row["k"] == max(r["k"] for r in d["rows"])):
            run.row("9b-q4_k-spec-verify", f"verify k={row['k']} vs one decode step (MTP)", "x decode",
                    row["verify_x_decode"], detail={"rows": d["rows"], "decode_ms": d.get("decode_ms")})
            break
    else:
        run.row("9b-q4_k-spec-verify", "speculative verify cost", "", None, error="speculative.py gave no rows")


def g_prefix(run: Run) -> None:
    args = [*_shape_args(run), "--turns", "10", "--reps", "1", "--out", str(run.work / "prefix.json")]
    if not run.args.quick:
        args += ["--first-len", "4096", "--turn-len", "900", "--output-len", "32"]
    else:
        args = ["--device", str(run.device), "--turns", "4", "--first-len", "64", "--turn-len", "16", "--output-len",
                "4", "--shared-len", "64", "--reps", "1", "--out", str(run.work / "prefix.json")]
    d = _script(run, "prefix_cache.py", args, "prefix.json", 420)
    conv = (d or {}).get("conversation") or {}
    run.row("9b-q4_k-prefix-ttft", "prefix cache: TTFT turns 2..10, on / off", "ratio", conv.get("ratio_turns_2_on"),
            detail=d or {}, error=None if conv else "prefix_cache.py gave no conversation")


def g_structured(run: Run) -> None:
    path = run.file("9b-q4_k")
    tokens = "16" if run.args.quick else "128"
    d = _script(run, "structured.py", ["--model", str(path), "--device", str(run.device), "--tokens", tokens,
                                       "--batches", "1,16", "--repeats", "1", "--json", str(run.work / "structured.json")],
                "structured.json", 420)
    for b in (1, 16):
        row = next((r for r in (d or {}).get("rows", []) if r["batch"] == b and r["constraint"] == "json"), None)
        run.row(f"9b-q4_k-json-b{b}", f"json-schema decode b={b}, of unconstrained", "ratio",
                row and row["of_unconstrained"], detail=d or {}, error=None if row else "structured.py gave no row")
    run.drop("9b-q4_k")


def g_int4(run: Run) -> None:
    """The int4 GEMV over the 9B's projections at T = 1 (bytes over time, all projections
    together), beside the Q4_K kernel on the same shapes."""
    args = ["--json", str(run.work / "int4.json")] + (["--reference", "--shrink", "16", "--quick"] if run.args.quick else [])
    d = _script(run, "int4.py", args, "int4.json", 300)

    def rate(kind):
        rows = [r for r in (d or {}).get("rows", []) if r["T"] == 1 and r["weight"] == kind]
        return sum(r["bytes"] for r in rows) / (sum(r["ms"] for r in rows) * 1e-3) if rows else None

    int4, q4k = rate("int4 g128 sym"), rate("Q4_K")
    run.row("int4-gemv", "int4 g128 GEMV, 9B projections (T=1)", "GB/s", int4 and int4 / 1e9,
            limit=d and d["copy_gbs"], detail={"q4_k_gbs": q4k and q4k / 1e9, "rows": d},
            error=None if int4 else "int4.py gave no rows")


# ------------------------------------------------------------------------------------- table


def table(res: dict) -> str:
    head = ["row", "g906", "llama.cpp", "limit", "% limit (g906)", "% limit (llama.cpp)", "× llama.cpp", "goal", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(x, spec="{:,.1f}"):
        return "—" if x is None else spec.format(x)

    for r in res["rows"]:
        met = "error" if r.get("error") else ("—" if r.get("met") is None else ("yes" if r["met"] else "NO"))
        lines.append("| " + " | ".join([
            r["label"], f(r["g906"]) + (" " + r["unit"] if r["g906"] is not None else ""), f(r["llama_cpp"]),
            f(r["limit"]), f(r["pct_of_limit"], "{:.1f}%"), f(r["llama_cpp_pct_of_limit"], "{:.1f}%"),
            f(r["ratio"], "{:.2f}×"), r.get("goal", "—"), met]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for versus-llama-cpp.json")
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a dry run of every path)")
    ap.add_argument("--groups", default=",".join(GROUPS), help="comma-separated, from: " + ", ".join(GROUPS))
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no group after this many seconds")
    ap.add_argument("--dense", default="", help="only these files of the dense group (e.g. 9b-q4_k,9b-q8_0)")
    ap.add_argument("--llama-bin", default=str(ROOT / ".llama" / "bin"))
    ap.add_argument("--llama-src", default=str(ROOT / ".llama" / "llama.cpp-src.tar.gz"))
    shm = Path("/dev/shm")
    default_work = shm / "g906-vs" if shm.is_dir() and os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize > 40e9 \
        else Path("/tmp/g906-vs")
    ap.add_argument("--work", default=str(default_work), help="files, logs and the llama.cpp build")
    args = ap.parse_args(argv)
    args.groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    args.dense = [k.strip() for k in args.dense.split(",") if k.strip()]
    bad = [g for g in args.groups if g not in GROUPS]
    if bad:
        ap.error(f"unknown group(s) {', '.join(bad)}; choose from {', '.join(GROUPS)}")
    if not args.quick and (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cpu"):
        ap.error("the real shapes need a GPU (files of up to 21 GB, 9B-27B models); "
                 "--quick --device cpu runs every path at tiny shapes")
    run = Run(args)
    run.start_llama()
    log(f"device {run.device}; measuring copy bandwidth and the fp16 matmul rate")
    run.res["copy_bandwidth_bytes_s"] = measure_copy_bandwidth(run.device)
    run.res["matmul_flops_s"] = measure_matmul_flops(run.device)
    run.save()
    fns = {"dense": g_dense, "c64": g_c64, "moe": g_moe, "27b": g_27b, "spec": g_spec, "prefix": g_prefix,
           "structured": g_structured, "int4": g_int4}
    for name in args.groups:
        if run.elapsed() > args.budget_s:
            run.res["skipped"].append(f"{name}: time budget")
            continue
        log(f"group {name} at {run.elapsed():.0f} s")
        try:
            fns[name](run)
        except Exception as exc:
            traceback.print_exc()
            run.res.setdefault("errors", []).append(f"group {name}: {type(exc).__name__}: {exc}")
        free()
        run.save()
    run.res["elapsed_s"] = round(run.elapsed(), 1)
    run.save()
    env = run.res["environment"]
    print(f"\n{env.get('gpu', env['device'])}, driver {env.get('driver')}, g906 {env.get('commit')}, "
          f"llama.cpp {run.res['llama_cpp'].get('version')}; copy {run.res['copy_bandwidth_bytes_s'] / 1e9:,.0f} GB/s, "
          f"fp16 matmul {run.res['matmul_flops_s'] / 1e12:,.0f} TFLOP/s")
    print(table(run.res))
    for e in run.res.get("errors", []) + run.res["llama_cpp"].get("errors", []) + run.res["skipped"]:
        print("note:", e[:300])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
