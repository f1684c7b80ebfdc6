"""``costs``: what every workaround the field recommends costs, and whether it trains at all.

For each selected repro in each selected cell, the documented scenario runs as users wrote it
(``as-documented``), through the fixed trainer's guards (``fixed-trainer``), and as each variant
the repro declares (``SPEC.variants``: ZeRO-2 instead of ZeRO-3, checkpointing off, reentrant
checkpointing...), at the ``small`` model by default. Each is classified as users would meet it
(PASS, a known failure by signature, SILENT_FAILURE, NEW_FAILURE...) and measured: the training's
peak memory above its baseline, CPU and wall time per step. Where the documented scenario runs
clean in a cell, every variant there is priced against it, with the noise: twice the larger
step-time IQR, and with several rounds the run-to-run spread. A claim in the field that does not
hold (ZeRO-2 does not avoid F3's refusal) shows as the variant's outcome.

``costs.json`` keeps one entry per repro x variant x cell.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.figures import memory
from harness.planning import Plan, PlannedItem, RunOptions, plan_items
from harness.records import ItemRecord
from repros.common.spec import AS_DOCUMENTED, FIXED_TRAINER, ReproSpec

COSTS_FILE = "costs.json"


def plan_costs(opts: RunOptions, variants: Sequence[str] = ()) -> Plan:
    """Every variant (or those named) of every selected repro in every selected cell (the cells
    and excludes of the repros' ``bug`` mode)."""
    base = plan_items(dataclasses.replace(opts, modes=("bug",)))
    plan = Plan(excluded=base.excluded, broken=base.broken)
    known = {name for item in base.items for name in opts.discovery.repros[item.repro_id].spec.variant_names()}
    for wanted in variants:
        if wanted not in known:
            raise UserError("--variants", wanted, "no selected repro has this variant", f"use one of: {', '.join(sorted(known))}")
    for item in base.items:
        spec = opts.discovery.repros[item.repro_id].spec
        for name in spec.variant_names():
            if variants and name not in variants:
                continue
            plan.items.append(
                PlannedItem(
                    item.cell,
                    item.repro_id,
                    item.module,
                    name,
                    item.world_size,
                    params={"variant": name},
                    rank_mode="fixed" if name == FIXED_TRAINER else "bug",
                    explore=True,  # a variant has no expectation: what it does is the finding
                )
            )
    return plan


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: Sequence[float]) -> float | None:
    """Run to run: (max - min) / median, over the rounds."""
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else None


def _figures(records: Sequence[ItemRecord]) -> dict[str, Any]:
    mems = [m.bytes for m in (memory(r) for r in records) if m is not None and m.what == "training peak"]
    cpu = [r["step_cpu_time_s"]["median"] for r in records if r.get("step_cpu_time_s")]
    wall = [r["step_time_s"]["median"] for r in records if r.get("step_time_s")]
    cpu_iqr = [r["step_cpu_time_s"]["iqr"] for r in records if r.get("step_cpu_time_s")]
    return {
        "train_peak_mem_bytes": _median(mems),
        "train_peak_mem_kind": next((r.get("train_peak_mem_kind") for r in records if r.get("train_peak_mem_kind")), None),
        "step_cpu_time_s": _median(cpu),
        "step_time_s": _median(wall),
        "step_cpu_iqr_s": max(cpu_iqr) if cpu_iqr else None,
        "spread": {"train_peak_mem": _spread(mems), "step_cpu_time": _spread(cpu), "step_time": _spread(wall)},
    }


def entries(rounds: Sequence[Sequence[ItemRecord]], specs: Mapping[str, ReproSpec] | None = None) -> list[dict[str, Any]]:
    """One entry per repro x variant x cell, its figures the median over the rounds, priced
    against the documented scenario in the same cell where that ran clean."""
    by_key: dict[tuple[str, str, str], list[ItemRecord]] = {}
    for records in rounds:
        for record in records:
            if record.get("variant"):
                by_key.setdefault((record["repro"], record["variant"], record["cell"]), []).append(record)
    found: list[dict[str, Any]] = []
    for (repro, variant, cell), records in by_key.items():
        spec = (specs or {}).get(repro)
        try:
            declared = spec.variant(variant) if spec is not None else None
        except KeyError:
            declared = None
        outcomes = [r["outcome"] for r in records]
        entry: dict[str, Any] = {
            "repro": repro,
            "variant": variant,
            "cell": cell,
            "description": declared.description if declared else "",
            "claim": declared.claim if declared else "",
            "overrides": dict(declared.overrides) if declared else {},
            "outcome": max(set(outcomes), key=outcomes.count),
            "outcomes": outcomes,
            "signature": next((r.get("signature") for r in records if r.get("signature")), None),
            "reasons": next((r.get("reasons") for r in records if r.get("reasons")), []),
            "model": records[0].get("model"),
            "versions": records[0].get("versions"),
            "rounds": len(records),
            **_figures(records),
        }
        found.append(entry)
    _price(found)
    order = {name: i for i, name in enumerate([AS_DOCUMENTED, FIXED_TRAINER])}
    found.sort(key=lambda e: (e["repro"], order.get(e["variant"], 2), e["variant"], e["cell"]))
    return found


def _priced(entry: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``entry``'s figures as multiples of ``base``'s, with the noise (twice the larger IQR)."""
    priced: dict[str, Any] = {}
    if entry["train_peak_mem_bytes"] is not None and base["train_peak_mem_bytes"] is not None:
        priced["train_peak_mem_delta_bytes"] = entry["train_peak_mem_bytes"] - base["train_peak_mem_bytes"]
        if base["train_peak_mem_bytes"]:
            priced["train_peak_mem_ratio"] = entry["train_peak_mem_bytes"] / base["train_peak_mem_bytes"]
    for field in ("step_cpu_time_s", "step_time_s"):
        if entry[field] is not None and base[field]:
            priced[f"{field}_ratio"] = entry[field] / base[field]
    if entry["step_cpu_iqr_s"] is not None and base["step_cpu_iqr_s"] is not None and base["step_cpu_time_s"]:
        priced["step_cpu_noise_ratio"] = 2 * max(entry["step_cpu_iqr_s"], base["step_cpu_iqr_s"]) / base["step_cpu_time_s"]
    return priced


def _price(found: list[dict[str, Any]]) -> None:
    """Each variant against the documented scenario in its cell where that trains; and, where it
    does not (the failure is there), against the fixed trainer: which workaround is cheapest."""
    documented = {(e["repro"], e["cell"]): e for e in found if e["variant"] == AS_DOCUMENTED}
    fixed = {(e["repro"], e["cell"]): e for e in found if e["variant"] == FIXED_TRAINER}
    for entry in found:
        base = documented.get((entry["repro"], entry["cell"]))
        entry["against_fixed_trainer"] = None
        if base is None or entry is base:
            entry["against_documented"] = None
            continue
        if base["outcome"] == "PASS":
            entry["against_documented"] = _priced(entry, base)
            continue
        entry["against_documented"] = {"why_not": f"the documented scenario ended {base['outcome']} in this cell"}
        reference = fixed.get((entry["repro"], entry["cell"]))
        if reference is not None and reference is not entry and reference["outcome"] == "PASS" and entry["outcome"] == "PASS":
            entry["against_fixed_trainer"] = _priced(entry, reference)


def write_costs(path: Path, found: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**meta, "entries": found}, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_costs(path: Path) -> list[dict[str, Any]]:
    """The entries of a ``costs.json``; a ``UserError`` naming the file where it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(path, "", "no such costs file", "pass the costs.json a 'costs' run wrote") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(path, "", f"cannot be read as JSON ({exc})",
                        "pass the costs.json a 'costs' run wrote") from None
    found = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(found, list) or not all(isinstance(e, dict) and "repro" in e and "variant" in e for e in found):
        raise UserError(path, "entries", "is not a costs table", "pass the costs.json a 'costs' run wrote")
    return found


def newest_costs(reports_dir: Path) -> Path | None:
    """The newest ``costs.json`` in a run directory of ``reports_dir`` (where ``costs`` writes them)."""
    found = [p for p in Path(reports_dir).glob(f"*/{COSTS_FILE}") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None
