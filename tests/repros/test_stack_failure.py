"""A rank's import error that is the cell's stack failing (a package that does not import, one the cell
lacks) is told apart from an error of the scenario: the rank says which, and why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from repros.runtime.context import imported_versions
from repros.runtime.record import ImportedPackage
from repros.runtime.stack_failure import stack_failure


def _package(site: Path, name: str, version: str, body: str) -> None:
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(body)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n")


def _raised(action) -> BaseException:
    try:
        action()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("nothing raised")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("ftr_")]:
        del sys.modules[name]


def test_a_package_whose_own_imports_fail_does_not_import(site: Path) -> None:
    # deepspeed 0.19.2 on Python 3.12 without setuptools' shim: its own import of distutils fails.
    _package(site, "ftr_deepspeed", "0.19.2", "from ftr_runtime import engine\n")
    (site / "ftr_runtime").mkdir()
    (site / "ftr_runtime" / "__init__.py").write_text("")
    (site / "ftr_runtime" / "engine.py").write_text("import ftr_distutils_gone\n")

    def repro() -> None:
        import ftr_deepspeed  # noqa: F401

    reason = stack_failure(_raised(repro))
    assert reason == (
        "ftr_deepspeed does not import in this cell: ModuleNotFoundError: No module named 'ftr_distutils_gone'"
    )


def test_a_package_whose_module_level_code_raises_another_error_does_not_import(site: Path) -> None:
    # DeepSpeed 0.16.3 with triton 3.2 on a CPU: triton's autotuner, built as deepspeed imports, finds no driver.
    _package(site, "ftr_triton_user", "0.16.3", "from ftr_kernels import matmul\n")
    (site / "ftr_kernels").mkdir()
    (site / "ftr_kernels" / "__init__.py").write_text("")
    (site / "ftr_kernels" / "matmul.py").write_text(
        "def autotune():\n    raise RuntimeError('0 active drivers ([]). There should only be one.')\nautotune()\n"
    )

    def repro() -> None:
        import ftr_triton_user  # noqa: F401

    reason = stack_failure(_raised(repro))
    assert reason == (
        "ftr_triton_user does not import in this cell: RuntimeError: 0 active drivers ([]). There should only be one."
    )


def test_an_error_a_librarys_function_raises_is_the_scenarios(site: Path) -> None:
    _package(
        site, "ftr_engine", "1.0", "def step():\n    raise RuntimeError('element 0 of tensors does not require grad')\n"
    )

    def repro() -> None:
        import ftr_engine

        ftr_engine.step()

    assert stack_failure(_raised(repro)) is None


def test_a_package_the_cell_lacks_is_named(site: Path) -> None:
    def repro() -> None:
        import ftr_bitsandbytes  # noqa: F401

    reason = stack_failure(_raised(repro))
    assert reason is not None and reason.startswith("ftr_bitsandbytes is not installed in this cell")


def test_a_librarys_import_inside_a_function_is_the_scenarios_error(site: Path) -> None:
    # PEFT's dispatcher importing a class a newer torchao removed: a documented failure, not the stack.
    _package(site, "ftr_peft", "0.21.2", "def dispatch():\n    from ftr_peft import LinearActivationQuantizedTensor\n")

    def repro() -> None:
        import ftr_peft

        ftr_peft.dispatch()

    assert stack_failure(_raised(repro)) is None


def test_other_errors_are_the_scenarios() -> None:
    assert stack_failure(ValueError("boom")) is None


def test_a_rank_records_the_version_it_imported_not_the_first_listed(site: Path, tmp_path: Path) -> None:
    # A runner's PYTHONPATH puts another release first: the rank imports that one.
    first = tmp_path / "first"
    _package(first, "ftr_peft", "9.9.9", "")
    sys.path.insert(0, str(first))
    try:
        _package(site, "ftr_peft", "0.21.2", "")
        found = imported_versions(("ftr_peft", "ftr_absent"))
        assert found["ftr_peft"] == ImportedPackage(version="9.9.9", path=str(first / "ftr_peft"), imported=False)
        import ftr_peft  # noqa: F401

        assert imported_versions(("ftr_peft",))["ftr_peft"].imported is True
        assert found["ftr_absent"].version is None
    finally:
        sys.path.remove(str(first))
