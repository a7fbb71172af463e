from __future__ import annotations


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    nb, bs = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    kc = k_cache.view(nb * bs, *k_cache.shape[2:])
    vc = v_cache.view(nb * bs, *v_cache.shape[2:])
    kc[slots] = k[keep].to(k_cache.dtype)
    vc[slots] = v[keep].to(v_cache.dtype)
