"""A build does not hash again what uv copied unchanged from its cache: each file of uv's cache is
hashed once (and sealed), every environment that copies it takes its digest; the store's copies are
verified by their seals. What the cache promises holds: an environment edited after its build, a
file of uv's cache edited, a copy that is not what the cache holds, are all found, and the digests
in the manifest are the files' own."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import shutil
from pathlib import Path

from harness.environments import Environment, EnvRequest
from harness.environments.integrity import MANIFEST, digest_of
from tests.environments.test_environments import REQUEST
from tests.environments.test_integrity import RealTreeBuilds, edit_keeping_size_and_mtime

#: A wheel as uv unpacks it into its cache: a shared library (16 KiB or more: shared through the
#: store) and two modules.
WHEEL = {
    "torch/_C.so": bytes(range(256)) * 256,
    "torch/__init__.py": b"from torch._C import *\n__version__ = '2.13.0'\n",
    "torch/nn.py": b"class Module: ...\n",
}
DIST_INFO = "torch-2.13.0.dist-info"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def unpack_into_uv_cache(uv_cache: Path, archive_id: str = "AbCdEf012345") -> Path:
    archive = uv_cache / "archive-v0" / archive_id
    lines = []
    for rel, data in WHEEL.items():
        (archive / rel).parent.mkdir(parents=True, exist_ok=True)
        (archive / rel).write_bytes(data)
        lines.append(f"{rel},{_record_hash(data)},{len(data)}")
    (archive / DIST_INFO).mkdir()
    (archive / DIST_INFO / "METADATA").write_text("Name: torch\nVersion: 2.13.0\n")
    lines += [f"{DIST_INFO}/METADATA,,", f"{DIST_INFO}/RECORD,,"]
    (archive / DIST_INFO / "RECORD").write_text("\n".join(lines) + "\n")
    return archive


class CopiesFromUvCache(RealTreeBuilds):
    """Real sharing, seals and manifest; uv's install replaced by what it does with ``--link-mode copy``:
    each file of the unpacked wheel copied in, and ``RECORD`` written with ``INSTALLER`` added."""

    def __init__(self, cache: Path, uv_cache: Path, archive_id: str = "AbCdEf012345") -> None:
        super().__init__(cache)
        self._uv_cache_dir = uv_cache
        self.archive = uv_cache / "archive-v0" / archive_id

    def lay_out(self, packages: Path) -> None:
        for rel in [*WHEEL, f"{DIST_INFO}/METADATA"]:
            (packages / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.archive / rel, packages / rel)
        record = (self.archive / DIST_INFO / "RECORD").read_text()
        (packages / DIST_INFO / "INSTALLER").write_text("uv\n")
        installer = _record_hash(b"uv\n")
        (packages / DIST_INFO / "RECORD").write_text(record + f"{DIST_INFO}/INSTALLER,{installer},3\n")


def site(env: Environment) -> Path:
    return Path(env.python).parent.parent / "lib" / "python3.11" / "site-packages"


def requests(n: int) -> list[EnvRequest]:
    return [dataclasses.replace(REQUEST, packages={**REQUEST.packages, "peft": f"==0.21.{i}"}) for i in range(n)]


def test_each_file_of_uvs_cache_is_hashed_once_not_once_per_environment(tmp_path: Path, hashed: list[str]) -> None:
    archive = unpack_into_uv_cache(tmp_path / "uv")
    builds = CopiesFromUvCache(tmp_path / "cache", tmp_path / "uv")
    first = builds.get(requests(1)[0])
    copied = {str(site(first) / rel) for rel in WHEEL}
    assert copied.isdisjoint(hashed)  # the environment's copies are not read...
    assert {str(archive / rel) for rel in WHEEL} <= set(hashed)  # ... uv's cache's files are, once
    hashed.clear()
    for request in requests(3)[1:]:
        env = builds.get(request)
        assert {str(site(env) / rel) for rel in WHEEL}.isdisjoint(hashed)
        assert builds.verify(env) == []
    # Neither uv's cache (sealed) nor the store's copy (sealed as it was linked) is read again.
    assert not any(p.startswith((str(archive), str(tmp_path / "cache" / "store"))) for p in hashed), hashed
    # The manifest holds each file's own digest.
    manifest = (Path(str(first.path)) / MANIFEST).read_text()
    assert all(hashlib.sha256(data).hexdigest() in manifest for data in WHEEL.values())


def test_an_environment_edited_after_its_build_is_still_damage(tmp_path: Path) -> None:
    unpack_into_uv_cache(tmp_path / "uv")
    builds = CopiesFromUvCache(tmp_path / "cache", tmp_path / "uv")
    first, second = (builds.get(r) for r in requests(2))
    edit_keeping_size_and_mtime(site(second) / "torch" / "nn.py", 0, b"#")
    assert builds.verify(second) == [
        f"{site(second) / 'torch' / 'nn.py'} was modified (its content differs from the build's)"
    ]
    so = site(first) / "torch" / "_C.so"  # the store's copy, linked from both
    edit_keeping_size_and_mtime(so, 100, b"\x00poisoned\x00")
    for env in (first, second):
        assert f"{site(env) / 'torch' / '_C.so'} was modified (its content differs from the build's)" in builds.verify(
            env
        )
    third = builds.get(requests(3)[2])  # never linked to the poisoned copy
    assert (site(third) / "torch" / "_C.so").read_bytes() == WHEEL["torch/_C.so"]
    assert builds.verify(third) == []


def test_a_file_of_uvs_cache_edited_since_it_was_hashed_is_hashed_again(tmp_path: Path) -> None:
    archive = unpack_into_uv_cache(tmp_path / "uv")
    builds = CopiesFromUvCache(tmp_path / "cache", tmp_path / "uv")
    builds.get(requests(1)[0])
    edit_keeping_size_and_mtime(archive / "torch" / "nn.py", 0, b"#")  # uv's cache changed under us
    env = builds.get(requests(2)[1])  # copies the edited file: its digest is that file's, no false damage
    assert builds.verify(env) == []
    manifest = (Path(str(env.path)) / MANIFEST).read_text()
    assert digest_of(site(env) / "torch" / "nn.py") in manifest


def test_a_distribution_two_unpacked_wheels_could_be_is_hashed(tmp_path: Path, hashed: list[str]) -> None:
    archive = unpack_into_uv_cache(tmp_path / "uv")
    other = archive.with_name("ZzZz98765432")  # another unpacked wheel with the same RECORD: which one is it?
    (other / DIST_INFO).mkdir(parents=True)
    shutil.copyfile(archive / DIST_INFO / "RECORD", other / DIST_INFO / "RECORD")
    builds = CopiesFromUvCache(tmp_path / "cache", tmp_path / "uv")
    env = builds.get(requests(1)[0])
    assert str(site(env) / "torch" / "nn.py") in hashed
    assert builds.verify(env) == []
