"""Mutated recipes and model files. A recipe must load and resolve, or fail with RecipeError /
UsageError / G906Error; a model file must load exactly as the original did, or fail with
G906Error. Any other exception is a finding (a user would see "internal error"), and so is a file
whose structure was damaged but which loads with different tensors ("wrongly accepted")."""

from __future__ import annotations

import json
import random
import shutil
import struct
import traceback
from collections import Counter
from pathlib import Path

from g906.errors import G906Error

REPO = Path(__file__).resolve().parents[2]


# -- recipes ---------------------------------------------------------------------------------------

_RECIPE_VALUES = ['"x"', "0", "-1", "1e400", "nan", "inf", "[]", "{}", "true", '"' + "a" * 300 + '"',
                  '"/dev/null"', '"/proc/self/mem"', '"builtin:tiny-qwen35"', '"~root/x"', '"\\u0000"',
                  '"' + "\u00e9" * 200 + '"', str(2**64), '"../../../../etc/passwd"', '"/tmp/' + "b/" * 900 + 'm"',
                  '["*"]', '["http://x"]', '{count = 99}', '"32k"', "0x7fffffffffffffff"]


def _mutate_recipe(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        i = rng.randrange(len(lines)) if lines else 0
        if op < 0.35 and lines and "=" in lines[i]:
            key = lines[i].split("=", 1)[0]
            lines[i] = f"{key}= {rng.choice(_RECIPE_VALUES)}"
        elif op < 0.5 and lines:
            del lines[i]
        elif op < 0.6 and lines:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op < 0.75 and lines:
            s = lines[i]
            j = rng.randrange(len(s) + 1)
            lines[i] = s[:j] + rng.choice(["\x00", '"', "[", "]", "=", "\\", "\u00ff", "\n", "#", "."]) + s[j:]
        elif op < 0.85:
            lines.insert(i, rng.choice(["[multimodal.image_fetch]", "[server]", "[limits]", "[engine.embedded]",
                                        "[model]", "[[model]]", "[parallel]"]))
        else:
            lines.insert(i, rng.choice(["allowed_hosts = [\"*\"]", "header_timeout_s = -1", "max_connections = 0",
                                        "body_timeout_s = 1e9", "max_model_len = \"99999999999999999\"",
                                        "source = \"builtin:nope\"", "chat_template = \"" + "c" * 400 + "\""]))
    return "\n".join(lines) + "\n"


def fuzz_recipes(cases: int, seed: int = 0) -> dict:
    from g906.recipe.load import loads_recipe
    from g906.recipe.resolve import resolve

    rng = random.Random(seed)
    seeds = [p.read_text() for p in sorted((REPO / "recipes").glob("*.toml"))]
    out = Counter()
    examples = []
    for _ in range(cases):
        text = _mutate_recipe(rng.choice(seeds), rng)
        try:
            recipe = loads_recipe(text, file="fuzz.toml", path=REPO / "recipes" / "fuzz.toml")
            resolve(recipe, REPO / "recipes" / "fuzz.toml", check_files=False)
            out["accepted"] += 1
        except G906Error:
            out["refused"] += 1
        except Exception as exc:  # noqa: BLE001 - the finding
            out["unhandled"] += 1
            examples.append(f"{type(exc).__name__}: {exc} <- {text[:200]!r}")
    return {"cases": cases, **out, "examples": examples[:5]}


# -- model files -----------------------------------------------------------------------------------

def build_models(work: Path) -> tuple[Path, Path]:
    """A tiny GGUF (with tokenizer) and the same model as an HF directory (safetensors)."""
    from tests.engine.conftest import build_tiny_qwen35
    from tests.engine.gguf_writer import write_gguf
    from tests.engine.qwen_tokenizer import save_hf_tokenizer

    model = build_tiny_qwen35(seed=0)
    hf = work / "hf"
    model.save_pretrained(hf)
    tok = save_hf_tokenizer(work / "tok")
    for f in tok.iterdir():
        shutil.copy(f, hf / f.name)
    gguf = write_gguf(model, work / "tiny.gguf", qtype="Q8_0", tokenizer_dir=tok)[0]
    return gguf, hf


def _load(path: Path):
    """Everything `g906 up` reads from a model: config, weights (dense), tokenizer."""
    from g906.engine.loader import load_model

    loaded = load_model(str(path), dtype="float32", device="cpu", progress=False, max_model_len=64)
    tensors = {k: v.detach().clone() for k, v in loaded.model.state_dict().items()}
    if loaded.tokenizer is not None:
        loaded.tokenizer.encode("hello world")
    return tensors


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _gguf_mutation(src: Path, dst: Path, rng: random.Random) -> str:
    import gguf

    data = bytearray(src.read_bytes())
    r = gguf.GGUFReader(src, "r")
    start = int(r.data_offset)
    t = r.tensors[rng.randrange(len(r.tensors))]

    def at(part) -> int:
        return part.ctypes.data - r.data.ctypes.data

    op = rng.choice(["flip", "u64", "offset", "dims", "type", "truncate", "count"])
    if op == "flip":             # random bytes in the header, metadata and tensor infos
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(start)] = rng.randrange(256)
    elif op == "u64":
        pos = rng.randrange(0, start - 8)
        data[pos:pos + 8] = struct.pack("<Q", rng.choice([0, 1, 2**31, 2**32 + 1, 2**63, 2**64 - 1]))
    elif op == "offset":
        rel = int(t.field.parts[-1][0])
        value = rng.choice([rel + 1, rel + 32, 2**64 - start, 2**64 - 1, 2**63, 0, len(data), rel - 32])
        data[at(t.field.parts[-1]):at(t.field.parts[-1]) + 8] = struct.pack("<Q", value % 2**64)
    elif op == "dims":
        dims = t.field.parts[3]
        k = rng.randrange(len(dims))
        pos = at(dims) + 8 * k
        data[pos:pos + 8] = struct.pack("<Q", rng.choice([0, 1, int(dims[k]) * 2, 2**32, 2**62, 2**64 - 1]))
    elif op == "type":
        pos = at(t.field.parts[4])
        data[pos:pos + 4] = struct.pack("<I", rng.choice([0, 1, 2, 8, 12, 14, 30, 39, 1000]))
    elif op == "count":          # tensor / metadata counts in the header
        pos = rng.choice([8, 16])
        data[pos:pos + 8] = struct.pack("<Q", rng.choice([0, 2**20, 2**63, 2**64 - 1]))
    else:
        data = data[:rng.randrange(len(data))]
    del r
    dst.write_bytes(bytes(data))
    return op


def _safetensors_mutation(src: Path, dst: Path, rng: random.Random) -> str:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    st_file = next(dst.glob("*.safetensors"))
    raw = bytearray(st_file.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    op = rng.choice(["offsets", "dtype", "shape", "length", "json", "truncate", "config", "flip"])
    if op == "config":
        cfg_path = dst / "config.json"
        cfg = json.loads(cfg_path.read_text())
        text = cfg.get("text_config", cfg)
        key = rng.choice([k for k, v in text.items() if isinstance(v, (int, float)) and not isinstance(v, bool)])
        text[key] = rng.choice([0, -1, 2**62, 1.5, "x", None, [], 10**30])
        cfg_path.write_text(json.dumps(cfg))
        return f"config:{key}"
    if op == "flip":
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(8, 8 + n)] = rng.randrange(32, 127)
    elif op == "length":
        raw[:8] = struct.pack("<Q", rng.choice([0, n - 1, n + 1, 2**63, len(raw) + 10]))
    elif op == "truncate":
        raw = raw[:rng.randrange(len(raw))]
    elif op == "json":
        raw[8:8 + n] = (b"{" + b" " * (n - 1))
    else:
        entry = header[name]
        if op == "offsets":
            lo, hi = entry["data_offsets"]
            entry["data_offsets"] = rng.choice([[lo, hi + 4], [lo + 2, hi + 2], [0, hi - lo], [hi, lo],
                                                [lo, 2**64 - 1], [2**63, 2**63 + hi - lo]])
        elif op == "dtype":
            entry["dtype"] = rng.choice(["F16", "I64", "BOOL", "F8_E4M3", "Q4", "BF16"])
        else:
            entry["shape"] = rng.choice([[], [0], [2**31, 2**31], [-1], list(reversed(entry["shape"]))])
        body = json.dumps(header).encode()
        body += b" " * ((8 - len(body) % 8) % 8)
        raw = bytearray(struct.pack("<Q", len(body))) + bytearray(body) + raw[8 + n:]
    st_file.write_bytes(bytes(raw))
    return op


def fuzz_model_files(work: Path, gguf_cases: int, st_cases: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    gguf, hf = build_models(work)
    ref_gguf, ref_hf = _load(gguf), _load(hf)
    results = {}
    for kind, n, src, ref, mutate, dst in (
            ("gguf", gguf_cases, gguf, ref_gguf, _gguf_mutation, work / "m.gguf"),
            ("safetensors", st_cases, hf, ref_hf, _safetensors_mutation, work / "m-hf")):
        out: Counter = Counter()
        examples: list[str] = []
        for _ in range(n):
            op = mutate(src, dst, rng)
            try:
                tensors = _load(dst)
            except G906Error:
                out["refused"] += 1
                continue
            except Exception as exc:  # noqa: BLE001 - the finding
                out["unhandled"] += 1
                tb = traceback.extract_tb(exc.__traceback__)[-1]
                examples.append(f"{op}: {type(exc).__name__}: {str(exc)[:150]} at {tb.filename}:{tb.lineno}")
                continue
            if _same(tensors, ref):
                out["loaded_same"] += 1        # the damage was in something that does not matter here
            elif op.startswith("config:"):
                out["loaded_other_config"] += 1   # a different but valid config: not a file error
            else:
                out["wrongly_accepted"] += 1
                examples.append(f"{op}: loaded with different tensors")
        results[kind] = {"cases": n, **out, "examples": examples[:6]}
    return results

