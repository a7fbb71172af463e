"""The hostile-input audit as a script (not part of the test run: minutes, not seconds).

    python -m tests.fuzz                       # everything, default sizes
    python -m tests.fuzz --only http --http-cases 2000

Prints one JSON object: per part, the cases run and what came out — server errors (5xx), bad
error shapes, hangs and tracebacks in the server's log for HTTP; unhandled exceptions and wrongly
accepted files for recipes and model files. Exit status 1 when any of those is not 0."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

RECIPE = """
[model]
source = "builtin:tiny-qwen35"
name = "tiny"

[limits]
max_model_len = 256
max_num_seqs = 4
max_num_batched_tokens = 128

[engine.embedded]
max_waiting_requests = 32

[server]
api_key_env = "G906_TEST_API_KEY"
body_timeout_s = 20
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["http", "recipes", "files"], action="append")
    ap.add_argument("--http-cases", type=int, default=1500)
    ap.add_argument("--recipe-cases", type=int, default=2000)
    ap.add_argument("--gguf-cases", type=int, default=150)
    ap.add_argument("--safetensors-cases", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    parts = set(args.only or ["http", "recipes", "files"])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report: dict = {}
    bad = 0
    with tempfile.TemporaryDirectory(prefix="g906-fuzz-") as tmp:
        work = Path(tmp)
        if "recipes" in parts:
            from tests.fuzz.file_fuzz import fuzz_recipes

            t0 = time.monotonic()
            report["recipes"] = r = fuzz_recipes(args.recipe_cases, args.seed)
            r["seconds"] = round(time.monotonic() - t0, 1)
            bad += r.get("unhandled", 0)
            print(json.dumps({"recipes": r}), file=sys.stderr, flush=True)
        if "files" in parts:
            from tests.fuzz.file_fuzz import fuzz_model_files

            t0 = time.monotonic()
            report["model_files"] = r = fuzz_model_files(work / "files", args.gguf_cases, args.safetensors_cases,
                                                         args.seed)
            (work / "files").mkdir(exist_ok=True)
            r["seconds"] = round(time.monotonic() - t0, 1)
            bad += sum(v.get("unhandled", 0) + v.get("wrongly_accepted", 0) for v in r.values() if isinstance(v, dict))
            print(json.dumps({"model_files": r}), file=sys.stderr, flush=True)
        if "http" in parts:
            from tests.fuzz.http_fuzz import run_http
            from tests.server.conftest import API_KEY, start_server, stop_server

            (work / "http").mkdir()
            t0 = time.monotonic()
            s = start_server(work / "http", RECIPE)
            try:
                r = run_http(s.url, API_KEY, cases=args.http_cases, seed=args.seed)
            finally:
                code = stop_server(s)
            err = s.stderr_path.read_text()
            r["tracebacks_in_server_log"] = err.count("Traceback")
            r["server_exit_status"] = code
            r["seconds"] = round(time.monotonic() - t0, 1)
            report["http"] = r
            bad += r["server_errors"] + r["bad_error_shape"] + r["hangs"] + r["tracebacks_in_server_log"] + (code != 0)
    print(json.dumps(report, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
