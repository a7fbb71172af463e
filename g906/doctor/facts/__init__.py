"""Facts: a plain, JSON-serialisable snapshot of the machine that the checks evaluate.

    facts = collect_facts()            # or collect_facts(root=DIR, python=PATH, probe=RECORDED)
    facts.save("facts.json")           # g906 doctor --collect FILE
    facts = Facts.load("facts.json")   # g906 doctor --from FILE: the same verdicts later

One module a subsystem: system (platform, user, device nodes, memory), gpus (KFD topology,
amdgpu, NVIDIA), rocm (/opt/rocm), interpreter (torch and triton, probed in a subprocess with a
time limit, never imported here), rocblas (Tensile), rccl (the library and g906's swap of it);
collect runs them all. Every file-system fact is read under an injectable root (sysroot.Root).
"""

from g906.doctor.facts.collect import ENV_VARS, collect_facts
from g906.doctor.facts.gpus import ARCH_ALIASES, normalise_arch
from g906.doctor.facts.model import FACTS_SCHEMA, Facts, parse_visible
from g906.doctor.facts.sysroot import Root
from g906.kfd import gfx_name

__all__ = ["ARCH_ALIASES", "ENV_VARS", "FACTS_SCHEMA", "Facts", "Root", "collect_facts", "gfx_name",
           "normalise_arch", "parse_visible"]
