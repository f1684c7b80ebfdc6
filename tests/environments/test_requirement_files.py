"""What ``atlas check --requirements FILE [--as-of DAY]`` reads: pip requirements (``-r``, markers, hashes), uv and
poetry locks, a project's ``pyproject.toml``; a file that does not pin everything resolved as of a day."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.core.errors import UserError
from harness.environments.stacks import read_requirement_file, read_requirements, resolve_requirements
from tests.analysis.test_atlas import cli

DECIDING = {"torch", "deepspeed", "peft", "transformers", "accelerate", "bitsandbytes", "trl", "torchao"}


def atlas(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("check", *args)


def test_pip_requirements_with_includes_markers_hashes_and_ranges(tmp_path: Path) -> None:
    (tmp_path / "base.txt").write_text("accelerate>=0.34.0,<=1.0.1\n")
    top = tmp_path / "requirements.txt"
    top.write_text(
        "--extra-index-url https://example.invalid/simple\n"
        "-r base.txt\n"
        "torch==2.5.1 \\\n    --hash=sha256:0123 \\\n    --hash=sha256:4567\n"
        "deepspeed==0.15.3 ; sys_platform == 'linux'\n"
        "deepspeed==0.15.4 ; sys_platform == 'darwin'\n"
        "transformers>=4.41.2,<=4.46.1  # a range\n"
        "transformers!=4.46.0\n"
        "datasets\n"
        "olmo-core @ git+https://github.com/allenai/OLMo-core.git@76c239c ; sys_platform == 'linux'\n"
    )
    found = read_requirement_file(top)
    assert dict(found.pins) == {"torch": "2.5.1", "deepspeed": "0.15.3"}
    assert {name: spec for name, (spec, _) in found.ranges.items()} == {
        "accelerate": "<=1.0.1,>=0.34.0",
        "transformers": "<=4.46.1,>=4.41.2,!=4.46.0",
        "datasets": "",
    }
    assert sorted(found.wanted(DECIDING)) == sorted(
        ["torch==2.5.1", "deepspeed==0.15.3", "accelerate<=1.0.1,>=0.34.0", "transformers<=4.46.1,>=4.41.2,!=4.46.0"]
    )


def test_a_range_without_a_day_is_refused_naming_its_line_and_the_day_that_would_resolve_it(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text("torch==2.5.1\ntransformers>=4.41\n")
    with pytest.raises(UserError) as raised:
        read_requirements(path)
    assert raised.value.line().startswith(f"{path}: line 2: 'transformers>=4.41' is not a pinned version")
    assert "--as-of DAY" in raised.value.line()


def test_a_pin_outside_a_range_of_the_same_package_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text("torch>=2.6\ntorch==2.5.1\n")
    with pytest.raises(UserError, match="pins torch at 2.5.1, outside"):
        read_requirement_file(path)


def test_a_projects_dependencies_every_group_and_marker(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(
        '[project]\nname = "x"\nversion = "1"\n'
        'dependencies = ["torch>=2.9.0,<2.10", "transformers==4.57.6",\n'
        "  \"bitsandbytes>=0.44 ; sys_platform == 'win32'\"]\n"
        '[project.optional-dependencies]\ndeepspeed = ["deepspeed>=0.18.3"]\n'
        '[dependency-groups]\ndev = ["peft==0.18.1", {include-group = "lint"}]\nlint = ["ruff"]\n'
    )
    found = read_requirement_file(path)
    assert dict(found.pins) == {"transformers": "4.57.6", "peft": "0.18.1"}
    assert {n: s for n, (s, _) in found.ranges.items()} == {
        "torch": "<2.10,>=2.9.0",
        "deepspeed": ">=0.18.3",
        "ruff": "",
    }
    assert not found.complete


def test_a_poetry_project_without_pep_621_is_refused_with_its_lock_as_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.poetry]\nname = "x"\n[tool.poetry.dependencies]\ntorch = "^2.5"\n')
    with pytest.raises(UserError, match=r"a Poetry project's \[tool.poetry\] is not read.*poetry.lock"):
        read_requirement_file(path)


def test_a_poetry_lock_is_the_stack_it_installs(tmp_path: Path) -> None:
    path = tmp_path / "poetry.lock"
    path.write_text(
        '[[package]]\nname = "torch"\nversion = "2.5.1"\ndescription = ""\noptional = false\n'
        'python-versions = ">=3.8"\nfiles = []\n\n'
        '[[package]]\nname = "DeepSpeed"\nversion = "0.15.3"\noptional = false\npython-versions = "*"\nfiles = []\n\n'
        '[metadata]\nlock-version = "2.0"\npython-versions = "^3.11"\ncontent-hash = "00"\n'
    )
    stack = read_requirements(path)
    assert dict(stack.versions) == {"torch": "2.5.1", "deepspeed": "0.15.3"} and stack.complete


def test_resolving_as_of_a_day_resolves_the_deciding_packages_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text("flash-attn==2.6.3\ntransformers>=4.41.2,<=4.46.1\ndeepspeed==0.15.3\n")
    asked: list[list[str]] = []

    def resolve(lines: list[str]) -> dict[str, str]:
        asked.append(lines)
        return {"transformers": "4.46.1", "deepspeed": "0.15.3", "torch": "2.5.1", "numpy": "2.1.3"}

    stack = resolve_requirements(read_requirement_file(path), "2024-11-25", DECIDING, resolve)
    assert asked == [["deepspeed==0.15.3", "transformers<=4.46.1,>=4.41.2"]]  # flash-attn takes no part
    assert stack.versions["torch"] == "2.5.1" and not stack.complete  # what they bring in, and not complete
    assert stack.source == f"{path} as of 2024-11-25"


def test_the_day_needs_a_requirements_file_and_a_range_needs_the_day(tmp_path: Path) -> None:
    alone = atlas("--stack", "torch==2.5.1", "--as-of", "2024-11-25")
    assert alone.returncode == 2 and "--as-of: 2024-11-25: resolves a requirements file" in alone.stderr
    path = tmp_path / "requirements.txt"
    path.write_text("torch==2.5.1\ntransformers>=4.41\n")
    ranged = atlas("--requirements", str(path), "--repros", "F8")
    assert ranged.returncode == 2 and "pass --as-of DAY" in ranged.stderr
    bad_day = atlas("--requirements", str(path), "--as-of", "last tuesday")
    assert bad_day.returncode == 2 and "--as-of takes a day" in bad_day.stderr
