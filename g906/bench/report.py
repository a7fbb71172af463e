"""Rendering of benchmark results: one rich table per run, and a compact many-row table."""

from __future__ import annotations

from typing import Any


def _f(x, fmt: str = "{:,.1f}") -> str:
    return "—" if x is None else fmt.format(x)


def _gib(x) -> str:
    if not x:
        return "—"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x} B"


def result_rows(res: dict[str, Any]) -> list[tuple[str, str]]:
    w = res.get("workload", {})
    rows = [
        ("target", str(res.get("target", ""))),
        ("requests", f"{res.get('completed')} ok, {res.get('failed')} failed"
         + (f" ({'; '.join(res['errors'])})" if res.get("errors") else "")),
        ("prompt / output tokens", f"{w.get('prompt_len')} / {w.get('output_len')}"),
        ("concurrency / rate", f"{w.get('concurrency')} / {w.get('request_rate') or 'inf'} req/s"),
        ("duration", _f(res.get("duration_s"), "{:,.2f} s")),
        ("output tok/s", _f(res.get("output_tok_s"))),
        ("prefill tok/s", _f(res.get("prefill_tok_s"))),
        ("decode tok/s", _f(res.get("decode_tok_s"))),
        ("TTFT p50 / p99", f"{_f(res['ttft_ms']['p50'], '{:,.2f}')} / {_f(res['ttft_ms']['p99'], '{:,.2f}')} ms"),
        ("ITL p50 / p99", f"{_f(res['itl_ms']['p50'], '{:,.2f}')} / {_f(res['itl_ms']['p99'], '{:,.2f}')} ms"),
    ]
    if res.get("peak_memory_bytes") is not None:
        rows.append(("peak device memory", _gib(res["peak_memory_bytes"])))
    bw = res.get("bandwidth")
    if bw:
        rows.append(("weights read / token", _gib(bw.get("bytes_per_token"))))
        rows.append(("copy bandwidth", _f(bw.get("copy_gb_s"), "{:,.0f} GB/s")))
        rows.append(("decode limit", _f(bw.get("limit_tok_s"), "{:,.1f} tok/s")))
        if bw.get("pct_of_limit") is not None:
            rows.append(("% of bandwidth limit", _f(bw["pct_of_limit"], "{:.1f}%")))
    sp = res.get("speculative")
    if sp:
        c = sp["config"]
        rows.append(("speculative", f"{c['method']}, k = {c['num_speculative_tokens']}"))
        rows.append(("mean acceptance length", _f(sp.get("mean_acceptance_length"), "{:.2f}")
                     + f" (drafts accepted {_f(sp.get('acceptance_rate'), '{:.1%}')})"))
        rows.append(("without speculation", _f(sp.get("baseline_output_tok_s")) + " output tok/s"))
        rows.append(("speedup", _f(sp.get("speedup"), "{:.2f}x")))
    eng = res.get("engine") or {}
    g = eng.get("graphs")
    if g is not None:
        rows.append(("decode graphs", ("on, sizes " + ",".join(map(str, g.get("captured", []))))
                     if g.get("graphs") else "off (eager)"))
    pg = eng.get("prefill_graphs")
    if pg is not None:
        rows.append(("prefill graphs", (f"on, up to {max(pg['token_sizes'])} tokens, {pg.get('replays', 0)} replays"
                                        if pg.get("graphs") else "off (eager)")))
    return rows


def print_result(res: dict[str, Any], console=None) -> None:
    """One rich table on `console` (default: a rich Console on stdout)."""
    from rich.console import Console
    from rich.table import Table

    con = console or Console(highlight=False)
    t = Table(title=f"g906 bench ({res.get('mode', '')})", show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    for k, v in result_rows(res):
        t.add_row(k, v)
    con.print(t)


def table_text(headers: list[str], rows: list[list[str]]) -> str:
    """A plain Markdown table (for logs and docs/PERF.md)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] * len(headers)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
