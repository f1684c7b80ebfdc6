"""DeepSpeed's CPU shm comm op, compiled once per distinct build and placed into every environment
that would compile the same thing.

Every ``deepspeed.init_distributed`` on a CPU accelerator loads the op (``ShareMemCommBuilder``:
``csrc/cpu/comm/shm_interface.cpp`` and ``shm.cpp``, both over torch's headers). DeepSpeed ships
only its sources, so each release compiled it again (a minute or more on two cores), though
releases often carry it unchanged: 0.17.6 and 0.18.0 have the same sources, builders and flags.

What a build reads, and so what its result is keyed by (``op_key``): the op's sources and headers
as the installed package ships them, the Python files that choose its flags (the op builders and
the CPU accelerator), the interpreter, torch, the platform, the compiler and the build switches
(``ops_pair_key`` holds the interpreter, torch, platform and switches). Two releases with the same
key would compile the same files with the same command against the same torch: the module is
the same, so it is built once (by DeepSpeed's own ``setup.py``, ``DS_BUILD_SHM_COMM=1``, into the
first environment that needs it) and copied into the others as DeepSpeed's own pre-built op:
its file at the module path DeepSpeed imports a pre-built op from, and ``installed_ops`` saying so
(``git_version_info_installed.py``, which ``OpBuilder.load`` reads), with the wheel's ``RECORD``
updated to match.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

#: The op's name (``ShareMemCommBuilder.NAME``) and where a pre-built one lives in the package
#: (``absolute_name``: ``deepspeed.ops.comm.deepspeed_shm_comm_op``).
SHM_OP = "deepspeed_shm_comm"
SHM_OP_DIR = Path("deepspeed/ops/comm")
SHM_OP_GLOB = f"{SHM_OP}_op.*.so"
#: What the op's compile reads, relative to the installed ``deepspeed`` package: its sources and
#: headers (whole directories), and the Python files that choose its sources, flags and extension.
SHM_OP_INPUTS = (
    "ops/csrc/cpu/comm",
    "ops/csrc/cpu/includes",
    "ops/op_builder/builder.py",
    "ops/op_builder/cpu/__init__.py",
    "ops/op_builder/cpu/builder.py",
    "ops/op_builder/cpu/comm.py",
    "accelerator/cpu_accelerator.py",
)
#: The file ``setup.py`` writes with what was compiled in, and the line ``OpBuilder.load`` reads.
INSTALLED_INFO = Path("deepspeed/git_version_info_installed.py")
READY = "READY"


def site_packages(python: str) -> Path | None:
    """The venv's ``site-packages`` (``python`` is ``<venv>/bin/python``)."""
    found = sorted(Path(python).parent.parent.glob("lib/python*/site-packages"))
    return found[0] if found else None


def op_inputs(site: Path) -> dict[str, str] | None:
    """Each file the op's build reads (relative path -> sha256), or None where the package has no
    shm comm op (an old release: nothing to build, nothing to share)."""
    package = site / "deepspeed"
    if not (package / "ops/op_builder/cpu/comm.py").is_file() or not (package / "ops/csrc/cpu/comm").is_dir():
        return None
    if "ShareMemCommBuilder" not in (package / "ops/op_builder/cpu/comm.py").read_text(encoding="utf-8"):
        return None
    digests: dict[str, str] = {}
    for name in SHM_OP_INPUTS:
        path = package / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if not file.is_file() or "__pycache__" in file.parts:
                continue
            digests[file.relative_to(package).as_posix()] = hashlib.sha256(file.read_bytes()).hexdigest()
    return digests


def op_key(site: Path, pair: str, compiler: str) -> str | None:
    """What a build of the shm comm op from ``site``'s DeepSpeed is only right for: the files it
    reads, the (interpreter, torch, platform, switches) ``pair`` and the ``compiler``; None where the
    release has no such op. The DeepSpeed version is not in it: releases that would compile the same
    thing share one build."""
    inputs = op_inputs(site)
    if inputs is None:
        return None
    material = {"op": SHM_OP, "inputs": inputs, "pair": pair, "compiler": compiler}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def built_op(op_dir: Path) -> list[Path]:
    """The op's module in a finished shared build (none while it is being made, or if it failed)."""
    if not (op_dir / READY).is_file():
        return []
    return sorted(op_dir.glob(SHM_OP_GLOB))


def harvest(site: Path, op_dir: Path) -> list[Path]:
    """Keep the op DeepSpeed's ``setup.py`` just compiled into ``site`` as the shared build of its key
    (written whole, then marked ready). [] when the environment has no compiled op to keep."""
    modules = sorted((site / SHM_OP_DIR).glob(SHM_OP_GLOB))
    if not modules or SHM_OP not in installed_ops(site):
        return []
    partial = op_dir.with_name(op_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for module in modules:
        shutil.copy2(module, partial / module.name)
    (partial / READY).write_text(json.dumps({"from": str(site)}) + "\n")
    shutil.rmtree(op_dir, ignore_errors=True)
    os.replace(partial, op_dir)
    return built_op(op_dir)


_INSTALLED_OPS_LINE = re.compile(r"^installed_ops\s*=", re.MULTILINE)
_OP_ENTRY = re.compile(rf"(['\"]{SHM_OP}['\"]\s*:\s*)(False|0)\b")
_INSTALLED_OP = re.compile(r"'(?P<op>[\w]+)':\s*(?:True|1)\b")


def installed_ops(site: Path) -> list[str]:
    """The ops DeepSpeed's setup compiled into ``site`` (its ``installed_ops``)."""
    info = site / INSTALLED_INFO
    if not info.is_file():
        return []
    for line in info.read_text(encoding="utf-8").splitlines():
        if line.startswith("installed_ops"):
            return sorted(m["op"] for m in _INSTALLED_OP.finditer(line))
    return []


class GraftFailed(Exception):
    """The installed DeepSpeed is not laid out as expected: the shared op was not placed."""


def graft(site: Path, op_dir: Path) -> list[str]:
    """Place the shared build ``op_dir`` into ``site``'s DeepSpeed (installed without ops) as its
    pre-built op: the module where ``OpBuilder.load`` imports it from, ``installed_ops`` saying it
    is there, and the wheel's ``RECORD`` listing both as they now are. Returns the module paths
    written, relative to ``site``."""
    modules = built_op(op_dir)
    info = site / INSTALLED_INFO
    if not modules:
        raise GraftFailed(f"no finished build in {op_dir}")
    if not info.is_file():
        raise GraftFailed(f"{INSTALLED_INFO} is missing")
    text = info.read_text(encoding="utf-8")
    line = _INSTALLED_OPS_LINE.search(text)
    if line is None:
        raise GraftFailed(f"{INSTALLED_INFO} has no installed_ops")
    end = text.find("\n", line.start())
    end = len(text) if end < 0 else end
    entry, count = _OP_ENTRY.subn(r"\g<1>1", text[line.start() : end])  # as setup.py writes it
    if count != 1:
        raise GraftFailed(f"{INSTALLED_INFO}'s installed_ops does not name {SHM_OP} once")
    written = []
    (site / SHM_OP_DIR).mkdir(parents=True, exist_ok=True)  # a namespace package where no op is built
    for module in modules:
        target = site / SHM_OP_DIR / module.name
        shutil.copyfile(module, target)
        os.chmod(target, 0o755)
        written.append(target.relative_to(site).as_posix())
    info.write_text(text[: line.start()] + entry + text[end:], encoding="utf-8")
    _update_record(site, [*written, INSTALLED_INFO.as_posix()])
    return written


def _record_hash(path: Path) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{path.stat().st_size}"


def _update_record(site: Path, paths: list[str]) -> None:
    """The installed wheel's ``RECORD`` with ``paths`` (relative to ``site``) listed as they are now."""
    records = sorted(site.glob("deepspeed-*.dist-info/RECORD"))
    if not records:
        return
    record = records[0]
    lines = record.read_text(encoding="utf-8").splitlines()
    wanted = set(paths)
    kept = [ln for ln in lines if ln.split(",", 1)[0] not in wanted]
    kept += [f"{path},{_record_hash(site / path)}" for path in paths]
    record.write_text("\n".join(kept) + "\n", encoding="utf-8")
