"""Tensor-parallel MoE placement, counted: the expert bytes each rank reads in a decode step and
the bytes the ranks exchange, for g906's placement (every expert split along its intermediate
features, one all-reduce of the hidden state per layer) against expert parallelism (each rank
holds whole experts, E / N of them). A model (not a timing): the decode step of an MoE is bound
by the chosen experts' bytes, and the ranks meet at every layer's all-reduce, so a layer takes
as long as its slowest rank.

    python benchmarks/moe_placement.py --shape qwen3.5-35b-a3b --ranks 2 --bits 4.5

Expert parallelism with the token's hidden state already on every rank (g906's tensor parallelism
replicates it after each all-reduce) needs no dispatch: each rank runs its own chosen experts
and the partial outputs are summed by the same all-reduce of [T, H]. Its cost is the load
imbalance: with top-k of E experts the k chosen fall on the ranks at random (hypergeometric at
one token), and the slowest rank reads more than k / N experts. Batches: the distinct experts
the tokens choose, drawn at random (uniform routing, the best case for balance), Monte Carlo."""

from __future__ import annotations

import argparse
import json
import random
import sys
from math import comb
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from g906 import data  # noqa: E402


def slowest_share_one_token(E: int, k: int, N: int) -> float:
    """E[max over 2 ranks of the chosen experts each holds] for one token (N = 2: exact,
    hypergeometric); other N by simulation."""
    if N != 2:
        return slowest_share(E, k, N, 1)
    half = E // 2
    return sum(comb(half, x) * comb(E - half, k - x) / comb(E, k) * max(x, k - x) for x in range(k + 1))


def slowest_share(E: int, k: int, N: int, T: int, samples: int = 20000, seed: int = 0) -> float:
    """E[max over the N ranks of the distinct chosen experts each holds] for T tokens."""
    rng = random.Random(seed)
    per = E // N
    total = 0
    for _ in range(samples):
        chosen = set()
        for _ in range(T):
            chosen.update(rng.sample(range(E), k))
        counts = [0] * N
        for e in chosen:
            counts[min(e // per, N - 1)] += 1
        total += max(counts)
    return total / samples


def distinct(E: int, k: int, T: int) -> float:
    """Expected distinct experts T tokens choose (uniform routing)."""
    return E * (1 - (1 - k / E) ** T)


def placement(shape: dict, ranks: int, bits: float, batches: list[int], bandwidth: float) -> dict:
    H, E, k = shape["hidden_size"], shape["num_experts"], shape["num_experts_per_tok"]
    inter, shared, L = shape["moe_intermediate_size"], shape["shared_expert_intermediate_size"], \
        shape["num_hidden_layers"]
    expert = 3 * inter * H * bits / 8            # gate, up, down of one expert
    shared_b = 3 * shared * H * bits / 8
    rows = []
    for T in batches:
        d = distinct(E, k, T)
        split = L * (d * expert + shared_b) / ranks
        slow = slowest_share_one_token(E, k, ranks) if T == 1 else slowest_share(E, k, ranks, T)
        ep = L * (slow * expert + shared_b / ranks)     # the shared expert split as today (EP's best)
        reduce_bytes = L * T * H * 2                     # fp16 [T, H] all-reduced per layer, both placements
        rows.append({"tokens": T, "distinct_experts": round(d, 2), "split_experts_per_rank": round(d / ranks, 2),
                     "ep_slowest_rank_experts": round(slow, 2), "split_bytes_per_rank": round(split),
                     "ep_slowest_rank_bytes": round(ep), "ep_over_split": round(ep / split, 3),
                     "split_ms": round(split / bandwidth * 1e3, 3), "ep_ms": round(ep / bandwidth * 1e3, 3),
                     "all_reduce_bytes_per_step": reduce_bytes, "all_reduces_per_step": L})
    return {"expert_bytes": round(expert), "shared_expert_bytes": round(shared_b), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3.5-35b-a3b", help="a shape of g906/data/models.toml with experts")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bits", type=float, default=4.5, help="bits per expert weight (Q4_K: 4.5)")
    ap.add_argument("--batch", default="1,4,16", help="decode batch sizes, comma-separated")
    ap.add_argument("--bandwidth", type=float, default=1.0e12, help="bytes/s of one card's memory (MI50: 1 TB/s)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    shapes = data.load("models")["shapes"]
    if a.shape not in shapes or not shapes[a.shape].get("num_experts"):
        moe = sorted(m for m, s in shapes.items() if s.get("num_experts"))
        ap.error(f"--shape {a.shape!r} is not an MoE shape of g906/data/models.toml (those: {', '.join(moe)})")
    if a.ranks < 2 or shapes[a.shape]["num_experts"] % a.ranks:
        ap.error(f"--ranks {a.ranks}: need 2 or more ranks dividing the {shapes[a.shape]['num_experts']} experts")
    res = placement(shapes[a.shape], a.ranks, a.bits, [int(b) for b in a.batch.split(",")], a.bandwidth)
    if a.json:
        print(json.dumps(res))
        return 0
    print(f"{a.shape}, {a.ranks} ranks, {a.bits} bits a weight: one expert {res['expert_bytes'] / 1e6:.2f} MB, "
          f"the shared expert {res['shared_expert_bytes'] / 1e6:.2f} MB")
    print("tokens | experts/rank split | EP slowest rank | MB/rank split | MB EP slowest | EP/split | "
          "ms split | ms EP | all-reduce KiB/step (both)")
    for r in res["rows"]:
        print(f"{r['tokens']:6} | {r['split_experts_per_rank']:17} | {r['ep_slowest_rank_experts']:15} | "
              f"{r['split_bytes_per_rank'] / 1e6:13.1f} | {r['ep_slowest_rank_bytes'] / 1e6:13.1f} | "
              f"{r['ep_over_split']:8} | {r['split_ms']:8} | {r['ep_ms']:5} | "
              f"{r['all_reduce_bytes_per_step'] / 1024:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
