"""Load a repro by reference, on either side of the process boundary. Standard library only.

A reference is a dotted module name (a built-in repro of the ``repros`` package) or the path of
a user's repro file, loaded by the kind that claims it (``repros/runtime/kinds``).
"""

from __future__ import annotations

from repros.runtime.kinds import LoadedRepro, load_repro

__all__ = ["LoadedRepro", "load_repro"]
