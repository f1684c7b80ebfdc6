"""What a repro declares about itself: standard library only.

Both sides of the process boundary read these objects. The orchestrator imports a
repro module to read its ``SPEC`` (so a repro module must keep its heavy imports
inside functions); the worker imports the same module to run it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from repros.runtime import patterns
from repros.runtime.families import FAMILIES
from repros.runtime.outcomes import BY_MODE

#: Modes a repro can run in. ``bug`` runs the documented configuration, ``fixed``
#: runs the fixed trainer on the same scenario.
MODES = ("bug", "fixed")
#: Devices an expectation can be limited to (a rank's ``device.type``).
DEVICES = ("cpu", "cuda")
#: What a repro id may look like: it names directories and files of a run, so no path parts.
#: Checked with ``fullmatch`` (``$`` would let a trailing newline through).
REPRO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: What a signature id may look like (``F1.recompute-shape-0``): records and rules name it.
SIGNATURE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: A package's name as an expectation's ``when`` names it (PEP 508).
PACKAGE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
#: The most ranks a repro may ask for.
MAX_WORLD_SIZE = 1024
#: What makes a ``fixed`` run a PASS: ``trained`` (the fixed trainer's rule, judged from the
#: training facts every rank records in ``ctx.facts["train"]``), ``clean-exit`` (every rank ran
#: to its end without an error: a user's script with a workaround, which records no facts) or ``agrees``
#: (every rank ran to its end and the training agreed with one process training the same adapter: a
#: failure that trains, only otherwise than it should, raises ``TrainsUnlikeOneProcess`` where it does not).
PASS_RULES = ("trained", "clean-exit", "agrees")

#: A check on the full text of an exception message; True when the text shows
#: the documented symptom.
MessageCheck = Callable[[str], bool]
#: A check on the facts the failing rank recorded about its scenario (``scenario_facts``
#: in its record, e.g. how many parameters were trainable); True when they fit the failure. It
#: tells apart failures that raise the same text for different reasons.
FactsCheck = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Signature:
    """How a documented failure shows itself.

    ``exception`` is the fully qualified type name the rank recorded (its module
    plus qualified name); ``aliases`` lists other names the same class is known by
    in other library versions. ``pattern`` is a regular expression searched in the
    message, within a bound (``repros/runtime/patterns.py``); every one of ``checks`` must
    also hold for the signature to count, and every one of ``facts_checks`` on the scenario
    facts the failing rank recorded.
    """

    id: str
    exception: str
    pattern: str
    checks: tuple[MessageCheck, ...] = ()
    aliases: tuple[str, ...] = ()
    description: str = ""
    facts_checks: tuple[FactsCheck, ...] = ()
    #: Read from data (a user's repro, described in a child process): its checks are code that
    #: only the rank that raised ran, so the rank's recorded verdict stands in for them.
    verdict_from_rank: bool = False
    #: What to write instead, read from the message (a configuration error: the names a model has): ``explain``
    #: says it beside the match. None: the workaround is the fixed trainer's guard.
    advice: Callable[[str], str | None] | None = None

    @property
    def declarative(self) -> bool:
        """Matched on the exception type and the pattern alone (no code of the repro's)."""
        return not (self.checks or self.facts_checks or self.verdict_from_rank)

    def matches(
        self,
        exception_type: str,
        message: str,
        facts: Mapping[str, Any] | None = None,
        rank_verdicts: Mapping[str, bool] | None = None,
    ) -> bool:
        if exception_type != self.exception and exception_type not in self.aliases:
            return False
        # Bounded: a pattern that backtracks without end raises ``PatternRunaway``, said as such.
        if not patterns.search(self.pattern, message):
            return False
        if self.verdict_from_rank:
            return bool((rank_verdicts or {}).get(self.id))
        if not all(check(message) for check in self.checks):
            return False
        return all(check(facts or {}) for check in self.facts_checks)


@dataclass(frozen=True)
class WorldSizes:
    """A range of world sizes (ranks in the item): ``minimum`` .. ``maximum`` (``None``: no bound)."""

    minimum: int = 1
    maximum: int | None = None

    def __post_init__(self) -> None:
        for value in (self.minimum, self.maximum):
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WORLD_SIZE:
                raise ValueError(f"world size bound {value!r} must be a whole number from 1 to {MAX_WORLD_SIZE}")
        if self.maximum is not None and self.maximum < self.minimum:
            raise ValueError(f"world sizes {self.minimum}..{self.maximum}: the maximum is below the minimum")

    def __contains__(self, world_size: object) -> bool:
        if not isinstance(world_size, int):
            return False
        return self.minimum <= world_size and (self.maximum is None or world_size <= self.maximum)

    @property
    def unbounded(self) -> bool:
        return self.minimum == 1 and self.maximum is None

    def __str__(self) -> str:
        if self.maximum is None:
            return "any" if self.minimum == 1 else f">={self.minimum}"
        if self.maximum == self.minimum:
            return f"=={self.minimum}"
        return f"{self.minimum}..{self.maximum}"

    @classmethod
    def parse(cls, text: str) -> WorldSizes:
        """The inverse of ``str``: ``any``, ``>=N``, ``==N``, ``N..M``."""
        text = text.strip()
        if text == "any":
            return cls()
        if text.startswith(">="):
            return cls(int(text[2:]))
        if text.startswith("=="):
            return cls(int(text[2:]), int(text[2:]))
        low, sep, high = text.partition("..")
        if not sep:
            raise ValueError(f"world sizes {text!r}: use 'any', '>=N', '==N' or 'N..M'")
        return cls(int(low), int(high))


#: Every world size.
ANY_WORLD_SIZE = WorldSizes()

#: The packages whose versions every record carries (``repros/runtime/context.py`` reads them).
TRACKED_PACKAGES = ("torch", "deepspeed", "peft", "transformers", "accelerate", "bitsandbytes", "torchao", "trl")
#: What a stack's specifier may look like here (``packaging`` checks it on the orchestrator's side).
_SPECIFIER = re.compile(r"[=<>!~][=<>!~]?=?\s*[A-Za-z0-9.*+!_-]+(\s*,\s*[=<>!~][=<>!~]?=?\s*[A-Za-z0-9.*+!_-]+)*")


def _check_stacks(repro_id: str, stacks: object) -> None:
    """Each of an expectation's ``under`` stacks maps package names to version specifiers."""
    if not isinstance(stacks, tuple):
        raise ValueError(f"{repro_id}: an expectation's under must be a tuple of stacks, found {stacks!r}")
    for stack in stacks:
        if not isinstance(stack, Mapping) or not stack:
            raise ValueError(f"{repro_id}: each stack of an expectation's under must map packages to specifiers")
        for name, spec in stack.items():
            if not isinstance(name, str) or not PACKAGE_NAME.fullmatch(name):
                raise ValueError(f"{repro_id}: a stack of an expectation's under names {name!r}, not a package")
            if not isinstance(spec, str) or not _SPECIFIER.fullmatch(spec.strip()):
                raise ValueError(f"{repro_id}: under {name}: {spec!r} is not a version specifier (write ==2.13.0)")


_VERSION = re.compile(r"[0-9][A-Za-z0-9.+!_-]*")


def _check_observed(repro_id: str, expectation: Expectation) -> None:
    """An expectation's ``observed`` names packages of its ``when``, each with releases (version text)."""
    observed = expectation.observed
    if not isinstance(observed, Mapping):
        raise ValueError(f"{repro_id}: an expectation's observed must map packages to releases, found {observed!r}")
    for name, versions in observed.items():
        if name not in expectation.when:
            raise ValueError(f"{repro_id}: observed names {name!r}, which the expectation's when does not")
        if (
            not isinstance(versions, tuple)
            or not versions
            or not all(isinstance(v, str) and _VERSION.fullmatch(v) for v in versions)
        ):
            raise ValueError(f"{repro_id}: observed {name}: {versions!r} is not a tuple of releases")


@dataclass(frozen=True)
class Expectation:
    """What a mode is expected to observe where ``when`` holds.

    ``when`` maps package names to PEP 440 specifier strings that the cell's
    resolved versions must all satisfy (an empty mapping holds everywhere).
    ``device``, where given, limits it to ranks on that device type (``cpu`` or
    ``cuda``): what a CPU cannot run may well reproduce on a GPU runner.
    ``world_sizes``, where given, limits it to items launched with that many ranks (a failure
    whose form depends on the ranks, a boundary proven at one world size only).
    ``established_by`` is the command whose run established the range. The first
    expectation of a mode that holds is the one used. Expectations are only
    compared with observations after the fact; they never decide an outcome.
    """

    mode: str
    outcome: str
    when: Mapping[str, str] = field(default_factory=dict)
    established_by: str = ""
    note: str = ""
    device: str | None = None
    world_sizes: WorldSizes = ANY_WORLD_SIZE
    #: The stacks the range was established on (package -> specifier, as a matrix cell writes them): the
    #: compatibility atlas holds a stack to one of them in every package the failure depends on
    #: (``ReproSpec.depends_on``) that ``when`` does not name. () : not recorded (only runs' evidence counts).
    under: tuple[Mapping[str, str], ...] = ()
    #: For each package ``when`` names, the releases at which ``established_by``'s runs observed this outcome:
    #: the compatibility atlas answers for a release between the lowest and the highest of them (inside one
    #: stretch of ``when``: ``!=0.19.2`` has two), never for the rest of the range. {} : not recorded (the range
    #: answers for no release of those packages until runs' evidence does).
    observed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The device ``established_by``'s runs ran on (``device`` where that is given): the atlas answers for that
    #: device only. None: not recorded (it answers for no device).
    established_on: str | None = None


@dataclass(frozen=True)
class Variant:
    """A workaround the field recommends, as a change to the repro's documented scenario
    (``overrides``: ``Scenario`` fields), run as users would (no guards unless ``guards``), so
    ``costs`` can say whether it trains and what it costs. ``claim`` cites where it is advised."""

    name: str
    description: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    guards: bool = False
    claim: str = ""


@dataclass(frozen=True)
class Diverges:
    """``crosscheck`` strategies (names, or shell-style patterns such as ``zero[12]-*-accum-manual``) a documented
    failure makes train otherwise than one process, where ``when`` holds (package -> specifier, as an
    expectation's), with the command whose run established it: those items are expected to DIVERGE, named by one
    of the failure's signatures."""

    strategies: tuple[str, ...]
    when: Mapping[str, str] = field(default_factory=dict)
    established_by: str = ""
    device: str | None = None

    def names(self, strategy: str) -> bool:
        return any(fnmatch.fnmatchcase(strategy, pattern) for pattern in self.strategies)


#: The two variants every repro with a documented scenario has.
AS_DOCUMENTED = "as-documented"
FIXED_TRAINER = "fixed-trainer"


@dataclass(frozen=True)
class ReproSpec:
    id: str
    title: str
    upstream: tuple[str, ...]
    signatures: tuple[Signature, ...]
    expectations: tuple[Expectation, ...]
    modes: tuple[str, ...] = MODES
    #: Ranks to launch; ``None`` takes the cell's world size.
    world_size: int | None = None
    #: Steps the scenario trains for, the first ``warmup_steps`` not timed.
    steps: int = 5
    warmup_steps: int = 1
    description: str = ""
    #: Workarounds to price (``costs``), beyond the documented scenario and the fixed trainer.
    variants: tuple[Variant, ...] = ()
    #: What makes a ``fixed`` run a PASS (one of ``PASS_RULES``).
    pass_rule: str = "trained"
    #: Model families (``repros/runtime/families.py``) where the failure cannot occur, each with why
    #: (a dense model has no experts to route; a model without fused projections...). Items of such a
    #: family are excluded with that reason; every other family runs.
    impossible_in: Mapping[str, str] = field(default_factory=dict)
    #: The world sizes at which the failure can occur, and why not elsewhere (``world_sizes_why``): a
    #: failure of a collective between ranks cannot occur on one. Items launched outside them are
    #: excluded with that reason (in both modes: the scenario is the failure's).
    world_sizes: WorldSizes = ANY_WORLD_SIZE
    world_sizes_why: str = ""
    #: The packages whose versions can change whether the failure occurs (``depends_on_why`` says why no
    #: other can: its mechanism runs through these alone). The compatibility atlas holds a stack to what
    #: was proven in these and no others; () : every tracked package (``TRACKED_PACKAGES``) may matter.
    depends_on: tuple[str, ...] = ()
    depends_on_why: str = ""
    #: The ``crosscheck`` strategies this failure makes train otherwise than one process, and where.
    diverges: tuple[Diverges, ...] = ()

    def __post_init__(self) -> None:
        """Refuse what would misreport or write outside a run's directory: a path in the id,
        a world size that launches no rank, an expectation no mode can observe."""
        if not isinstance(self.id, str) or not REPRO_ID.fullmatch(self.id):
            raise ValueError(
                f"repro id {self.id!r} is not allowed: use up to 64 letters, digits, '.', '_' and '-', "
                "starting with a letter or digit (it names the item's directory)"
            )
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise ValueError(f"{self.id}: unknown modes {unknown}; known: {MODES}")
        if self.world_size is not None and (
            not isinstance(self.world_size, int)
            or isinstance(self.world_size, bool)
            or not 1 <= self.world_size <= MAX_WORLD_SIZE
        ):
            raise ValueError(
                f"{self.id}: world_size {self.world_size!r} must be a whole number from 1 to {MAX_WORLD_SIZE}"
            )
        for sig in self.signatures:
            if not isinstance(sig.id, str) or not SIGNATURE_ID.fullmatch(sig.id):
                raise ValueError(
                    f"{self.id}: signature id {sig.id!r} is not a plain name: use up to 128 letters, digits, "
                    "'.', '_' and '-', starting with a letter or digit"
                )
        for exp in self.expectations:
            bad = [p for p in exp.when if not isinstance(p, str) or not PACKAGE_NAME.fullmatch(p)]
            if bad:
                raise ValueError(f"{self.id}: expectation 'when' names {bad[0]!r}, which is not a package name")
            if exp.mode not in self.modes:
                raise ValueError(f"{self.id}: expectation for mode {exp.mode!r} it does not run")
            if exp.outcome not in BY_MODE[exp.mode]:
                raise ValueError(
                    f"{self.id}: {exp.mode} mode cannot observe {exp.outcome!r}; "
                    f"use one of {', '.join(BY_MODE[exp.mode])}"
                )
            if exp.device is not None and exp.device not in DEVICES:
                raise ValueError(f"{self.id}: expectation device {exp.device!r} is not one of {DEVICES}")
            if exp.established_on is not None and exp.established_on not in DEVICES:
                raise ValueError(f"{self.id}: established_on {exp.established_on!r} is not one of {DEVICES}")
            if None not in (exp.device, exp.established_on) and exp.device != exp.established_on:
                raise ValueError(f"{self.id}: an expectation for {exp.device} established on {exp.established_on}")
            _check_observed(self.id, exp)
            _check_stacks(self.id, exp.under)
        if not isinstance(self.world_sizes, WorldSizes) or any(
            not isinstance(e.world_sizes, WorldSizes) for e in self.expectations
        ):
            raise ValueError(f"{self.id}: world_sizes must be a WorldSizes (repros/runtime/spec.py)")
        if not self.world_sizes.unbounded and not self.world_sizes_why:
            raise ValueError(f"{self.id}: world_sizes {self.world_sizes} needs world_sizes_why (why not elsewhere)")
        if self.world_size is not None and self.world_size not in self.world_sizes:
            raise ValueError(f"{self.id}: world_size {self.world_size} is outside its world_sizes {self.world_sizes}")
        if not isinstance(self.steps, int) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"{self.id}: steps and warmup_steps must be whole numbers, warmup_steps >= 0")
        if self.steps <= self.warmup_steps:
            raise ValueError(f"{self.id}: steps must exceed warmup_steps")
        unknown_families = [f for f in self.impossible_in if f not in FAMILIES]
        if unknown_families:
            raise ValueError(
                f"{self.id}: impossible_in names unknown families {unknown_families}; known: {list(FAMILIES)}"
            )
        if not isinstance(self.depends_on, tuple) or any(
            not isinstance(p, str) or not PACKAGE_NAME.fullmatch(p) for p in self.depends_on
        ):
            raise ValueError(f"{self.id}: depends_on must be a tuple of package names, found {self.depends_on!r}")
        if self.depends_on and not self.depends_on_why:
            raise ValueError(f"{self.id}: depends_on {list(self.depends_on)} needs depends_on_why (why no other can)")
        for where in self.diverges:
            if not isinstance(where, Diverges) or not where.strategies:
                raise ValueError(f"{self.id}: diverges must be Diverges(strategies, when, established_by) entries")
            bad = [p for p in where.when if not isinstance(p, str) or not PACKAGE_NAME.fullmatch(p)]
            if bad:
                raise ValueError(f"{self.id}: diverges 'when' names {bad[0]!r}, which is not a package name")
        if self.pass_rule not in PASS_RULES:
            raise ValueError(f"{self.id}: pass_rule {self.pass_rule!r} is not one of {PASS_RULES}")
        names = [v.name for v in self.variants]
        reserved = {AS_DOCUMENTED, FIXED_TRAINER}
        if len(set(names)) != len(names) or reserved & set(names):
            raise ValueError(f"{self.id}: variant names must be unique and not {sorted(reserved)}")
        for variant in self.variants:
            if not isinstance(variant.name, str) or not REPRO_ID.fullmatch(variant.name):
                raise ValueError(f"{self.id}: variant name {variant.name!r} is not a plain name")

    @property
    def deciding_packages(self) -> tuple[str, ...]:
        """The packages whose versions can decide the failure: ``depends_on``, else every tracked one."""
        return self.depends_on or TRACKED_PACKAGES

    def variant_names(self) -> list[str]:
        """Every variant ``costs`` runs: the documented scenario, the fixed trainer, then the declared ones."""
        return [AS_DOCUMENTED, FIXED_TRAINER, *(v.name for v in self.variants)]

    def variant(self, name: str) -> Variant:
        if name == AS_DOCUMENTED:
            return Variant(AS_DOCUMENTED, "the documented configuration, as users wrote it")
        if name == FIXED_TRAINER:
            return Variant(FIXED_TRAINER, "the fixed trainer's guards", guards=True)
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise KeyError(f"{self.id} has no variant {name!r}; it has {', '.join(self.variant_names())}")

    def signature(self, signature_id: str) -> Signature | None:
        return next((s for s in self.signatures if s.id == signature_id), None)

    def world_size_exclusion(self, world_size: int) -> str | None:
        """Why the failure cannot occur with ``world_size`` ranks, or None where it can."""
        if world_size in self.world_sizes:
            return None
        return f"{self.id} cannot occur at world size {world_size} (only {self.world_sizes}): {self.world_sizes_why}"


# -- as data: what a child process describing a user's repro hands back --------------------------------


def spec_to_data(spec: ReproSpec) -> dict[str, Any]:
    return {
        "id": spec.id,
        "title": spec.title,
        "upstream": list(spec.upstream),
        "signatures": [
            {
                "id": s.id,
                "exception": s.exception,
                "pattern": s.pattern,
                "aliases": list(s.aliases),
                "description": s.description,
                "has_checks": bool(s.checks or s.facts_checks or s.verdict_from_rank),
            }
            for s in spec.signatures
        ],
        "expectations": [
            {
                "mode": e.mode,
                "outcome": str(e.outcome),
                "when": dict(e.when),
                "established_by": e.established_by,
                "note": e.note,
                "device": e.device,
                "world_sizes": str(e.world_sizes),
                "under": [dict(u) for u in e.under],
            }
            for e in spec.expectations
        ],
        "modes": list(spec.modes),
        "world_size": spec.world_size,
        "world_sizes": str(spec.world_sizes),
        "world_sizes_why": spec.world_sizes_why,
        "steps": spec.steps,
        "warmup_steps": spec.warmup_steps,
        "description": spec.description,
        "variants": [
            {
                "name": v.name,
                "description": v.description,
                "overrides": dict(v.overrides),
                "guards": v.guards,
                "claim": v.claim,
            }
            for v in spec.variants
        ],
        "pass_rule": spec.pass_rule,
        "depends_on": list(spec.depends_on),
        "depends_on_why": spec.depends_on_why,
    }


def spec_from_data(data: Mapping[str, Any]) -> ReproSpec:
    """A ``ReproSpec`` from ``spec_to_data``'s output (validated again on the way in)."""
    return ReproSpec(
        id=data["id"],
        title=str(data["title"]),
        upstream=tuple(str(u) for u in data["upstream"]),
        signatures=tuple(
            Signature(
                id=str(s["id"]),
                exception=str(s["exception"]),
                pattern=str(s["pattern"]),
                aliases=tuple(str(a) for a in s["aliases"]),
                description=str(s["description"]),
                verdict_from_rank=bool(s["has_checks"]),
            )
            for s in data["signatures"]
        ),
        expectations=tuple(
            Expectation(
                mode=str(e["mode"]),
                outcome=str(e["outcome"]),
                when={str(k): str(v) for k, v in dict(e["when"]).items()},
                established_by=str(e["established_by"]),
                note=str(e["note"]),
                device=e["device"],
                world_sizes=WorldSizes.parse(str(e.get("world_sizes") or "any")),
                under=tuple({str(k): str(v) for k, v in dict(u).items()} for u in e.get("under") or []),
            )
            for e in data["expectations"]
        ),
        modes=tuple(data["modes"]),
        world_size=data["world_size"],
        world_sizes=WorldSizes.parse(str(data.get("world_sizes") or "any")),
        world_sizes_why=str(data.get("world_sizes_why") or ""),
        steps=data["steps"],
        warmup_steps=data["warmup_steps"],
        description=str(data["description"]),
        variants=tuple(
            Variant(str(v["name"]), str(v["description"]), dict(v["overrides"]), bool(v["guards"]), str(v["claim"]))
            for v in data.get("variants") or []
        ),
        pass_rule=str(data.get("pass_rule") or "trained"),
        depends_on=tuple(str(p) for p in data.get("depends_on") or []),
        depends_on_why=str(data.get("depends_on_why") or ""),
    )
