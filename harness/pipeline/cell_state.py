"""A cell's environment as a run found it: its entry in ``run.json``'s ``cells`` (and ``cells.jsonl``)."""

from __future__ import annotations

from harness.config.matrix import Cell
from harness.environments import Resolved
from harness.records.run_meta import CellMeta


def cell_meta(cell: Cell, resolved: Resolved) -> CellMeta:
    env = resolved.env
    if env is None:
        return CellMeta(unavailable=resolved.reason, requested=cell.packages, floating=cell.floating)
    repaired = {"repaired": env.repaired} if env.repaired else {}
    meta = CellMeta(
        key=env.key,
        provider=env.provider,
        reused=env.reused,
        build_s=env.build_s,
        **({"build_cpu_s": env.build_cpu_s} if not env.reused and env.build_cpu_s is not None else {}),
        python=env.python_version,
        requested=cell.packages,
        packages=env.packages,
        extensions_dir=env.extensions_dir,
        **repaired,
    )
    if env.lock is None:
        return meta
    return meta.model_copy(update={"floating": cell.floating, "lock": list(env.lock), "resolution": env.resolution})
