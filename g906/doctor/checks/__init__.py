"""The check registry: pure functions Facts (+ an optional Plan) -> Finding.

Each check is registered with a stable id (``rocblas.tensile``), a group and a title. A check
returns a Result (status, summary, detail, fix); the registry turns it into a Finding. A check
that raises becomes a ``fail`` row naming the crash, and the other checks still run.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal

from g906.doctor.facts import Facts, normalise_arch
from g906.errors import UsageError

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[str, ...] = ("ok", "warn", "fail", "skip")

GROUPS: tuple[str, ...] = ("System", "Access", "ROCm", "Python", "Libraries", "Engine", "Recipe", "Deep")


@dataclass
class Finding:
    id: str
    status: Status
    summary: str
    detail: str = ""
    fix: str | None = None
    group: str = ""
    title: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Finding":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class Result:
    status: Status
    summary: str
    detail: str = ""
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


def ok(summary: str, detail: str = "", **data: Any) -> Result:
    return Result("ok", summary, detail, None, data)


def warn(summary: str, detail: str = "", fix: str | None = None, **data: Any) -> Result:
    return Result("warn", summary, detail, fix, data)


def fail(summary: str, detail: str = "", fix: str | None = None, **data: Any) -> Result:
    return Result("fail", summary, detail, fix, data)


def skip(summary: str, detail: str = "", **data: Any) -> Result:
    return Result("skip", summary, detail, None, data)


@dataclass
class CheckSpec:
    id: str
    group: str
    title: str
    fn: Callable[["Ctx"], Result]
    needs_plan: bool = False      # only listed when a recipe is given
    deep: bool = False            # only listed when --deep facts exist
    preflight: bool = True        # run by `g906 up` preflight


REGISTRY: dict[str, CheckSpec] = {}


def check(id: str, group: str, title: str, *, needs_plan: bool = False, deep: bool = False,
          preflight: bool = True) -> Callable:
    def deco(fn: Callable[["Ctx"], Result]) -> Callable[["Ctx"], Result]:
        if id in REGISTRY:
            raise RuntimeError(f"duplicate check id {id}")
        REGISTRY[id] = CheckSpec(id, group, title, fn, needs_plan, deep, preflight)
        return fn

    return deco


class Ctx:
    """What a check sees: the facts, the plan (or None) and views derived from both."""

    def __init__(self, facts: Facts, plan: Any = None):
        self.facts = facts
        self.plan = plan

    # -- GPUs -------------------------------------------------------------------------------------
    @functools.cached_property
    def amd(self) -> list[dict[str, Any]]:
        return self.facts.amd_gpus()

    @functools.cached_property
    def visible(self) -> list[dict[str, Any]]:
        return self.facts.visible_amd_gpus()

    @functools.cached_property
    def gfx906_all(self) -> list[dict[str, Any]]:
        return [g for g in self.amd if normalise_arch(g.get("gfx")) == "gfx906"]

    @functools.cached_property
    def gfx906_visible(self) -> list[dict[str, Any]]:
        return [g for g in self.visible if normalise_arch(g.get("gfx")) == "gfx906"]

    @property
    def has_amd(self) -> bool:
        return bool(self.amd)

    @property
    def has_gfx906(self) -> bool:
        return bool(self.gfx906_all)

    @property
    def nvidia(self) -> bool:
        return bool(self.facts.nvidia.get("present")) or (
            self.torch_backend == "cuda" and int(self.facts.torch.get("device_count") or 0) > 0)

    # -- torch ------------------------------------------------------------------------------------
    @property
    def torch(self) -> dict[str, Any]:
        return self.facts.torch

    @property
    def torch_ok(self) -> bool:
        return bool(self.torch.get("found")) and bool(self.torch.get("import_ok"))

    @property
    def torch_backend(self) -> str | None:
        return self.torch.get("backend") if self.torch_ok else None

    @property
    def torch_inspected(self) -> bool:
        return not self.torch.get("skipped")

    @functools.cached_property
    def engine_device(self) -> str:
        """Where the embedded engine will run: "rocm", "cuda" or "cpu"."""
        if self.torch_ok and self.torch_backend in ("rocm", "cuda") and int(self.torch.get("device_count") or 0) > 0:
            return self.torch_backend  # type: ignore[return-value]
        if not self.torch_inspected:
            if self.visible:
                return "rocm"
            if self.facts.nvidia.get("present"):
                return "cuda"
        return "cpu"

    @functools.cached_property
    def target_device(self) -> str:
        """The device the stack is meant for, even when torch cannot use it yet (permissions...):
        recipe checks are judged against it, so fixing access does not reveal new failures."""
        if self.engine_device != "cpu":
            return self.engine_device
        if self.visible and self.torch_backend in ("rocm", None):
            return "rocm"
        if self.facts.nvidia.get("present") and self.torch_backend in ("cuda", None):
            return "cuda"
        return "cpu"

    # -- plan -------------------------------------------------------------------------------------
    @property
    def tp(self) -> int:
        return int(getattr(self.plan, "tensor_parallel_size", 1) or 1) if self.plan is not None else 1

    def plan_gpus(self) -> list[dict[str, Any]]:
        """The visible AMD GPUs the plan uses (parallel.devices, else the first TP)."""
        vis = self.visible
        if self.plan is None:
            return vis
        devs = getattr(self.plan, "devices", None)
        if devs:
            return [vis[i] for i in devs if 0 <= i < len(vis)]
        return vis[: self.tp]

    @property
    def target_arch(self) -> str | None:
        gpus = self.plan_gpus() if self.plan is not None else self.visible
        archs = {normalise_arch(g.get("gfx")) for g in gpus}
        if "gfx906" in archs:
            return "gfx906"
        return next(iter(sorted(a for a in archs if a)), None)


def _run_one(spec: CheckSpec, ctx: Ctx) -> Finding:
    try:
        res = spec.fn(ctx)
        if not isinstance(res, Result) or res.status not in STATUSES:
            raise TypeError(f"check returned {res!r}")
    except Exception as exc:  # noqa: BLE001 - a crashing check is a row, never a traceback
        res = fail(
            f"the check crashed: {type(exc).__name__}: {exc}",
            "This is a bug in g906 doctor; the other checks still ran.",
            "report it with the facts attached: g906 doctor --collect facts.json",
        )
    if res.status in ("warn", "fail") and not res.fix:  # every problem gets an action
        res.fix = f"run `g906 doctor {spec.id} -v` for the details (docs/doctor.md explains the check)"
    return Finding(id=spec.id, status=res.status, summary=res.summary, detail=res.detail, fix=res.fix,
                   group=spec.group, title=spec.title, data=res.data)


def _load_all() -> None:
    from g906.doctor.checks import recipe, stack, system  # noqa: F401 - registers the checks


def all_checks() -> list[CheckSpec]:
    _load_all()
    order = {g: i for i, g in enumerate(GROUPS)}
    return sorted(REGISTRY.values(), key=lambda s: (order.get(s.group, 99), list(REGISTRY).index(s.id)))


def select(ids: list[str] | None) -> list[CheckSpec]:
    """Checks named by id or by prefix ("rccl" -> rccl.*); UsageError for unknown names."""
    specs = all_checks()
    if not ids:
        return specs
    chosen: list[CheckSpec] = []
    for name in ids:
        hits = [s for s in specs if s.id == name or s.id.startswith(name.rstrip(".") + ".")]
        if not hits:
            close = difflib.get_close_matches(name, [s.id for s in specs], n=3)
            raise UsageError(
                f"no check named {name!r}",
                hint=(f"did you mean {', '.join(close)}? " if close else "") + "see: g906 doctor --list-checks",
            )
        chosen.extend(h for h in hits if h not in chosen)
    return chosen


def run_checks(facts: Facts, plan: Any = None, *, only: list[str] | None = None,
               preflight_only: bool = False) -> list[Finding]:
    """Run the checks (all, or those named in `only`) against the facts and the optional plan.
    Recipe checks run only with a plan; deep checks only when the facts hold --deep results."""
    ctx = Ctx(facts, plan)
    has_deep = isinstance(facts.torch.get("deep"), dict)
    out = []
    for spec in select(only):
        if spec.needs_plan and plan is None and not only:
            continue
        if spec.deep and not has_deep and not only:
            continue
        if preflight_only and not spec.preflight:
            continue
        out.append(_run_one(spec, ctx))
    return out


def summarize(findings: list[Finding]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for f in findings:
        counts[f.status] += 1
    return counts


def exit_code(findings: list[Finding], *, strict: bool = False) -> int:
    c = summarize(findings)
    if c["fail"] or (strict and c["warn"]):
        return 1
    return 0


__all__ = [
    "Finding", "Result", "CheckSpec", "Ctx", "REGISTRY", "check", "ok", "warn", "fail", "skip",
    "all_checks", "select", "run_checks", "summarize", "exit_code", "GROUPS", "STATUSES",
]
