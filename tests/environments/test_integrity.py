"""A cached environment is reused only while its content is what was built: an edit that keeps the
size and puts the modification time back, bytecode planted where Python would load it instead of
the source, a store copy edited in place, a changed mode, all are damage named by file, and the
environment is rebuilt saying so; what only moves times (a hard link made by another environment,
an import) is not damage."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import venv as venv_module
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import repros
from harness.config.model import Cell
from harness.environments import Environment, Environments, EnvRequest
from harness.environments.cache import STORE
from harness.environments.integrity import MANIFEST, damage, write_manifest
from harness.environments.uv import UvProvider, extensions_dir_for
from repros.runtime.bytecode import STORE_VARIABLE
from tests.environments.test_environments import REQUEST, FakeBuilds

#: What every environment of the same torch holds: shared through the store (16 KiB or more).
TORCH_SO = bytes(range(256)) * 256
MODULES = {
    "peft/__init__.py": "from peft.tuners import LORA\n__version__ = '0.21.2'\n",
    "peft/tuners.py": "LORA = 'lora'\n\n\ndef scale(r: int) -> float:\n    return 1.0 / r\n",
}


def site(env: Environment) -> Path:
    return Path(env.python).parent.parent / "lib" / "python3.11" / "site-packages"


def cached_pyc(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


class RealTreeBuilds(FakeBuilds):
    """Real keying, reuse, sharing, bytecode and manifest; the uv install replaced by writing a small
    package tree, with a real interpreter (this one) as the environment's."""

    def _build(self, request: EnvRequest, key: str, env_dir: Path) -> Environment:
        self.builds += 1
        venv = env_dir / "venv"
        # A real virtual environment (its site-packages processed at start), without pip.
        venv_module.create(venv, with_pip=False, symlinks=True)
        self.lay_out(venv / "lib" / "python3.11" / "site-packages")
        return Environment(
            key=key,
            python=str(venv / "bin" / "python"),
            python_version="3.11.7",
            packages={"peft": "0.21.2"},
            path=str(env_dir),
            extensions_dir=str(extensions_dir_for(env_dir)),
            reused=False,
            build_s=0.0,
        )

    def lay_out(self, packages: Path) -> None:
        """What the install puts in ``site-packages``."""
        for rel, text in MODULES.items():
            (packages / rel).parent.mkdir(parents=True, exist_ok=True)
            (packages / rel).write_text(text)
        (packages / "torch").mkdir()
        (packages / "torch" / "_C.so").write_bytes(TORCH_SO)


def edit_keeping_size_and_mtime(path: Path, offset: int, data: bytes) -> None:
    """Overwrite ``data`` at ``offset`` in place, then put the modification time back (os.utime)."""
    before = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_an_edit_that_keeps_size_and_mtime_is_damage_and_the_environment_is_rebuilt_naming_it(
    tmp_path: Path,
) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    tuners = site(first) / "peft" / "tuners.py"
    edit_keeping_size_and_mtime(tuners, 0, b"LORA = 'pwnd'")
    assert builds.verify(first) == [f"{tuners} was modified (its content differs from the build's)"]
    again = builds.get(REQUEST)
    assert builds.builds == 2 and not again.reused
    assert again.repaired is not None and f"{tuners} was modified" in again.repaired
    assert (site(again) / "peft" / "tuners.py").read_text() == MODULES["peft/tuners.py"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_same_size_edit_with_the_time_put_back_is_named(tmp_path_factory: pytest.TempPathFactory, data) -> None:
    root = tmp_path_factory.mktemp("env")
    tree = root / "venv"
    contents = data.draw(
        st.dictionaries(
            st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}\.py", fullmatch=True),
            st.binary(min_size=1, max_size=300),
            min_size=1,
            max_size=6,
        ).filter(lambda d: not any(a != b and b.startswith(a.removesuffix(".py") + "/") for a in d for b in d))
    )
    for rel, content in contents.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(content)
    write_manifest(root, tree)
    rel = data.draw(st.sampled_from(sorted(contents)))
    old = contents[rel]
    offset = data.draw(st.integers(0, len(old) - 1))
    new = data.draw(
        st.binary(min_size=1, max_size=len(old) - offset).filter(lambda b: b != old[offset : offset + len(b)])
    )
    edit_keeping_size_and_mtime(tree / rel, offset, new)
    assert damage(root) == [f"{tree / rel} was modified (its content differs from the build's)"]


def planted_bytecode(source: Path, code: str) -> bytes:
    """A .pyc of ``code`` that Python accepts for ``source``: its header carries the hash of the
    source as it is (what a checked-hash .pyc is validated by)."""
    from importlib import _bootstrap_external  # the helpers py_compile itself uses

    compiled = compile(code, str(source), "exec")
    source_hash = importlib.util.source_hash(source.read_bytes())
    return bytes(_bootstrap_external._code_to_hash_pyc(compiled, source_hash, True))


def imported_lora(env: Environment, keep: Path | None = None) -> str:
    """``peft.tuners.LORA`` as the environment's Python imports it, with bytecode writing on (as on a
    user's machine); ``keep``: a bytecode store its imports keep what they compile in, as a rank's do."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", STORE_VARIABLE)}
    out = subprocess.run(
        [
            env.python,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
            "from repros.runtime.bytecode import keep_compiled; keep_compiled(); "
            "import peft.tuners as t; print(t.LORA)",
            str(site(env)),
            str(Path(repros.__file__).parent.parent),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**environ, **({STORE_VARIABLE: str(keep)} if keep else {})},
    )
    return out.stdout.strip()


def test_planted_bytecode_that_python_loads_instead_of_the_source_is_damage(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    tuners = site(first) / "peft" / "tuners.py"
    imported_lora(first, keep=builds.bytecode_store)  # an item's import: its bytecode kept, then placed
    assert builds.verify(first) == []
    pyc = cached_pyc(tuners)
    assert pyc.is_file()
    pyc.write_bytes(planted_bytecode(tuners, "LORA = 'planted'"))
    assert imported_lora(first) == "planted"  # the source is untouched; Python runs the planted code
    (problem,) = builds.verify(first)
    assert problem.startswith(f"{pyc} was modified (")  # the build made one: this replaced it
    again = builds.get(REQUEST)
    assert again.repaired is not None and str(pyc) in again.repaired
    assert imported_lora(again) == "lora"


@pytest.mark.parametrize(
    "where",
    [
        "peft/evil.pyc",  # a module with no source at all: Python imports it as peft.evil
        "peft/__pycache__/tuners.cpython-311.opt-1.pyc",  # what python -O loads
        "peft/__pycache__/new.cpython-311.pyc",
    ],
)
def test_bytecode_the_build_did_not_make_is_damage(tmp_path: Path, where: str) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    planted = site(first) / where
    planted.parent.mkdir(exist_ok=True)
    planted.write_bytes(planted_bytecode(site(first) / "peft" / "tuners.py", "LORA = 'planted'"))
    assert builds.verify(first) == [
        f"{planted} was added (bytecode the build did not make: Python would load it instead of the source)"
    ]


def test_importing_the_environment_writes_no_bytecode_and_is_not_damage(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    assert imported_lora(first) == "lora"  # with bytecode writing on, as on a user's machine
    assert builds.verify(first) == [] and builds.get(REQUEST).reused


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p.chmod(0o777),
        lambda p: (p.unlink(), p.symlink_to("/etc/hostname")),
        lambda p: (p.unlink(), p.write_text(MODULES["peft/tuners.py"].replace("lora", "LORA"))),
    ],
    ids=["mode", "replaced by a link", "replaced by another file of the same size"],
)
def test_a_changed_mode_or_a_replaced_file_is_damage(tmp_path: Path, change) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    tuners = site(first) / "peft" / "tuners.py"
    change(tuners)
    (problem,) = builds.verify(first)
    assert problem.startswith(f"{tuners} was modified")


def test_a_retargeted_link_is_damage(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    lib64 = Path(first.python).parent.parent / "lib64"
    lib64.unlink()
    lib64.symlink_to("/usr/lib")
    assert builds.verify(first) == [f"{lib64} was modified (its link to lib now leads to /usr/lib)"]


def nights(n: int) -> list[EnvRequest]:
    return [dataclasses.replace(REQUEST, packages={**REQUEST.packages, "peft": f"==0.21.{i}"}) for i in range(n)]


def test_a_store_copy_edited_in_place_is_damage_everywhere_and_never_linked_again(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    first, second = (builds.get(r) for r in nights(2))
    so = site(first) / "torch" / "_C.so"
    assert so.stat().st_nlink == 3  # two environments and the store
    edit_keeping_size_and_mtime(so, 100, b"\x00poisoned\x00")
    for env in (first, second):
        assert builds.verify(env) == [
            f"{site(env) / 'torch' / '_C.so'} was modified (its content differs from the build's)"
        ]
    (third_request,) = nights(3)[2:]
    third = builds.get(third_request)
    assert (site(third) / "torch" / "_C.so").read_bytes() == TORCH_SO
    assert builds.verify(third) == []
    stored = [p for p in (tmp_path / STORE).rglob("*") if p.is_file() and p.stat().st_size == len(TORCH_SO)]
    assert [p.read_bytes() == TORCH_SO for p in stored] == [True]


def test_links_made_by_other_environments_are_not_damage_and_are_not_read_again(
    tmp_path: Path, hashed: list[str]
) -> None:
    """The store's copy was sealed as each environment linked it: its seal vouches for it as it is."""
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(nights(1)[0])
    so = site(first) / "torch" / "_C.so"
    ctime = so.stat().st_ctime_ns
    for request in nights(4)[1:]:  # each links the same store copy: its change time moves
        builds.get(request)
    assert so.stat().st_ctime_ns != ctime
    hashed.clear()  # what the builds read; from here, what the checks read
    assert builds.verify(first) == [] and hashed == []
    assert builds.verify(first) == [] and hashed == []  # the manifest now has the new times


def test_a_manifest_without_content_digests_is_not_trusted(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    manifest = Path(str(first.path)) / MANIFEST
    payload = json.loads(manifest.read_text())
    old = {"tree": payload["tree"], "files": {rel: row[:2] for rel, row in payload["files"].items()}}
    manifest.write_text(json.dumps(old))  # what an older checkout wrote: sizes and times
    (problem,) = builds.verify(first)
    assert "without content digests" in problem
    again = builds.get(REQUEST)
    assert builds.builds == 2 and again.repaired is not None and "without content digests" in again.repaired


def test_before_an_item_a_damaged_environment_is_rebuilt_and_the_item_says_which_file(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    envs = Environments(tmp_path, providers={"uv": UvProvider(builder=builds)})
    cell = Cell(
        name="c",
        packages=dict(REQUEST.packages),
        lanes=("ci",),
        world_size=2,
        python="3.11",
        timeout_s=60.0,
        exclude_newer=None,
        provider="uv",
        repros=None,
    )
    with envs.ready_for_item(cell) as ready:
        assert ready.env is not None and ready.env.repaired is None
        pyc = cached_pyc(site(ready.env) / "peft" / "__init__.py")
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(planted_bytecode(site(ready.env) / "peft" / "__init__.py", "__version__ = 'planted'"))
    with envs.ready_for_item(cell) as ready:
        assert ready.env is not None and not ready.env.reused and builds.builds == 2
        assert ready.env.repaired is not None
        assert "damaged before an item of c" in ready.env.repaired and str(pyc) in ready.env.repaired


def test_a_check_seals_a_shared_file_it_verified_so_no_other_environment_reads_it_again(
    tmp_path: Path, hashed: list[str]
) -> None:
    builds = RealTreeBuilds(tmp_path)
    first, second = (builds.get(r) for r in nights(2))
    for name in ("seals.sqlite3", "seals.sqlite3-wal", "seals.sqlite3-shm"):
        (tmp_path / name).unlink(missing_ok=True)  # environments built before any seal was kept
    so = site(first) / "torch" / "_C.so"
    os.link(so, tmp_path / "elsewhere")  # a link made outside: the change time moves, nothing sealed
    hashed.clear()  # what the builds read; from here, what the checks read
    assert builds.verify(first) == [] and hashed == [str(so)]
    assert builds.verify(second) == [] and hashed == [str(so)]  # the first check's seal vouches for it
