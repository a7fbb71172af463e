# The body of the fake `vllm` program the tests write onto PATH (with a #! line for this Python).
# It behaves like vLLM where g906 looks: `vllm --version`, `vllm serve --help[=all]` in argparse's
# format, `vllm serve MODEL ...` parsing its flags (unknown ones exit 2, like vLLM), logging start-up
# phases, and serving GET /v1/models and /health on --host/--port. FAKE_VLLM_* variables steer it:
#   FAKE_VLLM_FLAVOR   fork (default: reasoning choices incl. qwen3_5, mm options), upstream (no
#                      reasoning choices), legacy (vLLM 0.8: --help lists all, --help=all fails,
#                      --enable-reasoning, key=value mm limits, no --skip-mm-profiling), broken
#   FAKE_VLLM_VERSION  what --version prints
#   FAKE_VLLM_MODE     ok | crash (exit before serving) | hang (never serve) | exit (serve, then exit)
#   FAKE_VLLM_EXIT_CODE, FAKE_VLLM_EXIT_AFTER, FAKE_VLLM_DELAY (seconds of "loading" before serving)
#   FAKE_VLLM_RECORD   file: JSON with argv, env, pid, pgid (and worker_pid) at serve start
#   FAKE_VLLM_SIGNAL_LOG file: one line per signal received
#   FAKE_VLLM_SIGNAL_EXIT exit status after SIGINT/SIGTERM (default 0)
#   FAKE_VLLM_IGNORE_SIGNALS=1  log signals but keep running
#   FAKE_VLLM_WORKER=1 start a child process (like an engine core) in the same process group
#   FAKE_VLLM_CALLS    file: one line per invocation ("version", "help", "help=all", "serve")
import argparse
import json
import os
import signal
import subprocess
import sys
import time

FLAVOR = os.environ.get("FAKE_VLLM_FLAVOR", "fork")
VERSION = os.environ.get("FAKE_VLLM_VERSION", "0.11.1.dev7+gfx906")


def note(what):
    path = os.environ.get("FAKE_VLLM_CALLS")
    if path:
        with open(path, "a") as fh:
            fh.write(what + "\n")


def build_parser():
    legacy = FLAVOR == "legacy"
    fmt = argparse.HelpFormatter if legacy else argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(prog="vllm serve", formatter_class=fmt,
                                description="Launch a local OpenAI-compatible API server.")
    p.add_argument("model_tag", nargs="?", help="The model to serve (path or hub id).")
    fe = p.add_argument_group("Frontend", "Arguments of the HTTP server.")
    fe.add_argument("--host", default=None, help="Address to listen on.")
    fe.add_argument("--port", type=int, default=8000, help="Port to listen on.")
    fe.add_argument("--api-key", default=None, help="When set, requests must carry this key.")
    fe.add_argument("--uvicorn-log-level", choices=["debug", "info", "warning", "error", "critical", "trace"],
                    default="info", help="Log level of the web server.")
    fe.add_argument("--enable-auto-tool-choice", action="store_true", help="Let the model pick tools.")
    fe.add_argument("--tool-call-parser", metavar="{hermes,qwen3_coder} or name registered in --tool-parser-plugin",
                    default=None, help="Which tool call format to parse.")
    fe.add_argument("--chat-template", default=None, help="A chat template file.")
    if legacy:
        fe.add_argument("--enable-reasoning", action="store_true",
                        help="Return the model's reasoning in reasoning_content. Needs --reasoning-parser.")
    mc = p.add_argument_group("ModelConfig", "How the model is loaded.")
    mc.add_argument("--model", default=None, help="Model (prefer the positional form).")
    mc.add_argument("--served-model-name", nargs="+", default=None, help="Names the API answers to.")
    mc.add_argument("--tokenizer", default=None, help="Tokenizer name or path.")
    mc.add_argument("--hf-config-path", default=None, help="Where the HF config lives.")
    mc.add_argument("--trust-remote-code", action="store_true", help="Run code shipped with the model.")
    mc.add_argument("--dtype", choices=["auto", "bfloat16", "float", "float16", "float32", "half"],
                    default="auto", help="Data type of weights and activations.\n- auto: from the config\n- half: fp16")
    mc.add_argument("--max-model-len", default=None, help="Context length (1k/32K accepted).")
    mc.add_argument("--quantization", "-q", default=None, help="Quantization method.")
    mc.add_argument("--seed", type=int, default=0, help="Random seed.")
    if legacy:
        mc.add_argument("--enforce-eager", action="store_true", help="Always run eagerly.")
    else:
        mc.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False,
                        help="Always run eagerly (no graphs).")
    cc = p.add_argument_group("CacheConfig", "KV cache.")
    cc.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="Fraction of GPU memory to use.")
    cc.add_argument("--kv-cache-dtype", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"], default="auto",
                    help="KV cache data type.")
    cc.add_argument("--block-size", type=int, default=None, help="Tokens per block.")
    pc = p.add_argument_group("ParallelConfig", "Parallelism.")
    pc.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="Tensor parallel ranks.")
    pc.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1, help="Pipeline stages.")
    pc.add_argument("--distributed-executor-backend", choices=["mp", "ray", "uni"], default=None,
                    help="How workers are started.")
    sc = p.add_argument_group("SchedulerConfig", "Batching.")
    sc.add_argument("--max-num-seqs", type=int, default=None, help="Sequences per step.")
    sc.add_argument("--max-num-batched-tokens", default=None, help="Tokens per step.")
    mm = p.add_argument_group("MultiModalConfig", "Multimodal inputs.")
    if legacy:
        mm.add_argument("--limit-mm-per-prompt", default=None,
                        help="Per-prompt limit of each modality as a comma-separated list, e.g. image=16,video=2.")
    else:
        mm.add_argument("--limit-mm-per-prompt", default="{}",
                        help='Most items per prompt for each modality. Counts only: {"image": 16, "video": 2}. '
                             'With options: {"image": {"count": 5, "width": 512, "height": 512}}. '
                             "Give JSON or keys one by one.")
        mm.add_argument("--skip-mm-profiling", action=argparse.BooleanOptionalAction, default=False,
                        help="Skip the multimodal memory profiling at start-up.")
    mm.add_argument("--mm-processor-kwargs", default=None, help="Processor overrides (JSON).")
    so = p.add_argument_group("StructuredOutputsConfig", "Structured outputs and reasoning.")
    if FLAVOR == "upstream":
        so.add_argument("--reasoning-parser", default="", help="Parser that splits reasoning from content.")
    elif legacy:
        so.add_argument("--reasoning-parser", choices=["deepseek_r1", "granite", "qwen3"], default=None,
                        help="Parser that splits reasoning from content.")
    else:
        so.add_argument("--reasoning-parser", choices=["deepseek_r1", "glm45", "qwen3", "qwen3_5"], default="",
                        help="Parser that splits reasoning from content.")
    co = p.add_argument_group("CompilationConfig", "torch.compile and graphs.")
    co.add_argument("--compilation-config", "-O", default=None, help="Compilation settings (JSON or level).")
    return p


def groups_summary(parser):
    lines = ["usage: vllm serve [model_tag] [options]", "", parser.description, "", "Config Groups:"]
    for g in parser._action_groups:
        if g._group_actions:
            lines.append(f"  {g.title:<24} {g.description or ''}")
    lines += ["", "Tip: use --help=<group or keyword>, or --help=all for every flag."]
    return "\n".join(lines)


def normalise(argv):
    out = []
    for a in argv:
        if a.startswith("--") and not a.startswith("--help"):
            key, eq, val = a.partition("=")
            key = key.split(".", 1)[0].replace("_", "-")
            a = key + eq + val
        out.append(a)
    return out


def serve(args):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    delay = float(os.environ.get("FAKE_VLLM_DELAY", "0.2"))
    sig_exit = int(os.environ.get("FAKE_VLLM_SIGNAL_EXIT", "0"))
    ignore = os.environ.get("FAKE_VLLM_IGNORE_SIGNALS") == "1"

    def on_signal(signum, _frame):
        path = os.environ.get("FAKE_VLLM_SIGNAL_LOG")
        if path:
            with open(path, "a") as fh:
                fh.write(signal.Signals(signum).name + "\n")
        if not ignore:
            print(f"INFO fake-vllm: got {signal.Signals(signum).name}, shutting down", flush=True)
            os._exit(sig_exit)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    record = {"argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid(), "pgid": os.getpgid(0)}
    if os.environ.get("FAKE_VLLM_WORKER") == "1":
        worker = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
        record["worker_pid"] = worker.pid
    path = os.environ.get("FAKE_VLLM_RECORD")
    if path:
        with open(path + ".tmp", "w") as fh:
            json.dump(record, fh)
        os.replace(path + ".tmp", path)

    model = args.model_tag or args.model
    print(f"INFO fake-vllm {VERSION}: non-default args: {{'model': {model!r}, 'compilation_config': None}}", flush=True)
    print(f"INFO fake-vllm: Starting to load model {model}...", flush=True)
    if mode == "crash":
        time.sleep(delay / 2)
        print("ERROR fake-vllm: RuntimeError: HIP error: invalid device function", flush=True)
        print("ERROR fake-vllm: Engine core initialization failed.", flush=True)
        sys.exit(int(os.environ.get("FAKE_VLLM_EXIT_CODE", "1")))
    time.sleep(delay / 3)
    print("INFO fake-vllm: Loading weights took 0.01 seconds", flush=True)
    print("INFO fake-vllm: torch.compile takes 0.01 s in total", flush=True)
    print("INFO fake-vllm: Available KV cache memory: 1.00 GiB", flush=True)
    if mode == "hang":
        while True:
            time.sleep(1)
    time.sleep(delay / 3)
    print("INFO fake-vllm: Capturing CUDA graphs: 100%", flush=True)
    time.sleep(delay / 3)

    served = (args.served_model_name or [model])[0]
    key = args.api_key

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, {})
            if self.path == "/v1/models":
                if key and self.headers.get("Authorization") != f"Bearer {key}":
                    return self._send(401, {"error": "Unauthorized"})
                return self._send(200, {"object": "list", "data": [{"id": served, "object": "model"}]})
            return self._send(404, {"detail": "Not Found"})

    host = args.host or "0.0.0.0"
    server = ThreadingHTTPServer((host, args.port), Handler)
    print(f"INFO:     Uvicorn running on http://{host}:{args.port} (Press CTRL+C to quit)", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    if mode == "exit":
        import threading
        threading.Thread(target=server.serve_forever, daemon=True).start()
        time.sleep(float(os.environ.get("FAKE_VLLM_EXIT_AFTER", "0.5")))
        print("ERROR fake-vllm: engine died", flush=True)
        os._exit(int(os.environ.get("FAKE_VLLM_EXIT_CODE", "3")))
    server.serve_forever()


def main():
    argv = sys.argv[1:]
    if FLAVOR == "broken":
        print("Traceback (most recent call last):\nImportError: libamdhip64.so: cannot open shared object file",
              file=sys.stderr)
        sys.exit(1)
    if argv[:1] in (["--version"], ["-v"]):
        note("version")
        print("INFO 11-30 12:00:00 [__init__.py:216] Automatically detected platform rocm.", file=sys.stderr)
        print(VERSION)
        return
    if not argv or argv[0] != "serve":
        print("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...", file=sys.stderr)
        sys.exit(2)
    rest = argv[1:]
    parser = build_parser()
    if FLAVOR != "legacy":
        if "--help=all" in rest:
            note("help=all")
            print(parser.format_help())
            return
        if "--help" in rest or "-h" in rest:
            note("help")
            print(groups_summary(parser))
            return
    elif any(a.startswith("--help") or a == "-h" for a in rest):
        note("help" if "--help=all" not in rest else "help=all")
    args = parser.parse_args(normalise(rest))
    note("serve")
    serve(args)


main()
