"""DeepSpeed's CPU shared-memory comm op, left unbuilt: no item's training uses it. Standard library only.

On a CPU accelerator, ``deepspeed.comm``'s ``TorchBackend.__init__`` calls ``build_shm_op()``
(``deepspeed/comm/torch.py``), which compiles ``ShareMemCommBuilder`` (two C++ files over torch's
headers, a minute or more on two cores) the first time an environment starts DeepSpeed's comm
backend. In every release the matrix holds (0.17.6 to 0.19.8) only ``inference_all_reduce`` (AutoTP
inference's ``module_inject`` layers) calls into it, and that falls back to
``torch.distributed.all_reduce`` where the op is not loaded, as it does where the CPU lacks the
op's instructions; training's collectives (ZeRO's gathers and reductions, the engine's
all-reduces) go through ``torch.distributed`` whether it is loaded or not. So a rank replaces
``build_shm_op`` with one that builds nothing and says so (``None``, which is what it returns where
the op is not compatible), and the rank's record says what became of it.

``FT_REGRESS_DEEPSPEED_SHM_COMM=build`` in the environment (the run's, or a script repro's
``env:``) leaves DeepSpeed as it is: it compiles the op at first use, in the environment's own
``TORCH_EXTENSIONS_DIR``, and loads it.

The replacement is made where ``deepspeed.comm.torch`` is imported: at once if it is already (a
cell's pre-imported worker), else by an import hook that patches it as it is first imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

#: The module whose ``build_shm_op`` is replaced.
COMM_MODULE = "deepspeed.comm.torch"
#: Set to ``build`` to let DeepSpeed build and load the op as it would on its own.
SWITCH = "FT_REGRESS_DEEPSPEED_SHM_COMM"
BUILD = "build"
#: What a rank's record says when DeepSpeed asked for the op and was given none.
LEFT_UNBUILT = (
    "not built: training's collectives go through torch.distributed; only inference_all_reduce "
    f"(AutoTP inference) would use it ({SWITCH}=build builds it)"
)
LOADED = "built and loaded by DeepSpeed"

#: What became of the op in this process (None: DeepSpeed's comm backend never asked for it).
state: dict[str, str] = {}


def wanted() -> bool:
    """Whether DeepSpeed is to build the op as it would on its own."""
    return os.environ.get(SWITCH, "").strip().lower() == BUILD


def _patch(module: ModuleType) -> None:
    original = getattr(module, "build_shm_op", None)
    if original is None or getattr(original, "_ft_regress", False):
        return  # a release without the op, or patched already

    def build_shm_op() -> Any:
        if wanted():
            op = original()
            state["deepspeed_shm_comm"] = LOADED if op is not None else "not compatible here (DeepSpeed's own check)"
            return op
        state["deepspeed_shm_comm"] = LEFT_UNBUILT
        return None

    build_shm_op.__doc__ = original.__doc__
    setattr(build_shm_op, "_ft_regress", True)  # noqa: B010 - a function's own mark
    setattr(module, "build_shm_op", build_shm_op)  # noqa: B010 - the module's function, replaced


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``deepspeed.comm.torch`` as the other finders would, with a loader that patches it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != COMM_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def leave_unbuilt() -> None:
    """Make DeepSpeed's comm backend in this process (and its forks) start without building the op."""
    module = sys.modules.get(COMM_MODULE)
    if module is not None:
        _patch(module)
        return
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def recorded() -> dict[str, str]:
    """For the rank's record: what became of the op, where DeepSpeed's comm backend asked for it."""
    return dict(state)


def forget() -> None:
    """What this process said of the op is not its forks' to say (a worker that loaded it ahead)."""
    state.clear()
