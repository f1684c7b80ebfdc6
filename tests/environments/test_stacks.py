"""A stack read from what users have: pins on the command line, a pip or uv lock, the running interpreter; the
same reading as the passthrough provider's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.core.errors import UserError
from harness.environments import stacks
from harness.environments.inventory import Listing
from harness.environments.passthrough import passthrough_environment
from harness.environments.stacks import parse_stack_text, pins_from_freeze, read_requirements, stack_here


def test_pins_on_the_command_line_are_a_stack_with_names_canonical() -> None:
    stack = parse_stack_text("torch==2.5.1 DeepSpeed==0.15.3, peft===0.14.0 python==3.11.7")
    assert dict(stack.versions) == {"torch": "2.5.1", "deepspeed": "0.15.3", "peft": "0.14.0"}
    assert stack.python == "3.11.7" and not stack.complete
    assert str(stack.version("DeepSpeed")) == "0.15.3" and stack.version("accelerate") is None
    assert parse_stack_text(stack.text()).versions == stack.versions


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("torch>=2.5", "torch>=2.5: is not an exact pin"),
        ("torch==2.5.1 torch==2.6.0", "names torch twice (2.5.1 and 2.6.0)"),
        ("torch==two", "'two' is not a version"),
        ("   ", "names no package"),
    ],
)
def test_a_malformed_stack_is_one_line_naming_the_option(text: str, words: str) -> None:
    with pytest.raises(UserError) as raised:
        parse_stack_text(text)
    assert raised.value.line().startswith("--stack:") and words in raised.value.line()


def test_pip_freeze_output_is_read_and_a_range_in_a_lock_is_refused_with_its_line(tmp_path: Path) -> None:
    freeze = (
        "# comment\n-e git+https://x/y#egg=z\ndeepspeed==0.19.2\n"
        "torch @ file:///wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl\n"
        "peft==0.21.2 \\\n    --hash=sha256:00\n"
    )
    assert pins_from_freeze(freeze, strict=True) == {"deepspeed": "0.19.2", "torch": "2.13.0+cpu", "peft": "0.21.2"}
    lock = tmp_path / "requirements.txt"
    lock.write_text(freeze + "accelerate>=1.0\n")
    with pytest.raises(UserError) as raised:
        read_requirements(lock)
    assert raised.value.line() == (
        f"{lock}: line 7: 'accelerate>=1.0' is not a pinned version; pass --as-of DAY to resolve it as of a day, "
        "or a lock (pip freeze > FILE, uv pip compile, uv.lock), or pin it (name==version)"
    )
    assert pins_from_freeze("accelerate>=1.0\n") == {}  # explain reads what it can


def test_a_uv_lock_and_a_pylock_are_the_stacks_they_install(tmp_path: Path) -> None:
    uv = tmp_path / "uv.lock"
    uv.write_text(
        'version = 1\n\n[[package]]\nname = "mine"\nversion = "0.1.0"\nsource = { editable = "." }\n\n'
        '[[package]]\nname = "Torch"\nversion = "2.5.1"\n\n[[package]]\nname = "peft"\nversion = "0.14.0"\n'
    )
    stack = read_requirements(uv)
    assert dict(stack.versions) == {"mine": "0.1.0", "torch": "2.5.1", "peft": "0.14.0"} and stack.complete
    pylock = tmp_path / "pylock.toml"
    pylock.write_text('lock-version = "1.0"\n\n[[packages]]\nname = "deepspeed"\nversion = "0.15.3"\n')
    assert dict(read_requirements(pylock).versions) == {"deepspeed": "0.15.3"}


TWICE = '[[package]]\nname = "torch"\nversion = "2.5.1"\n[[package]]\nname = "torch"\nversion = "2.6.0"\n'


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[[package]]\nname = "torch"\n', "package[0] (torch): has no version"),
        (TWICE, "locks torch at 2.5.1 and 2.6.0"),
        ("version = 1\n", "package: is missing"),
        ("[[package\n", "is not TOML"),
    ],
)  # fmt: skip
def test_a_damaged_lock_is_named_with_its_field(tmp_path: Path, text: str, words: str) -> None:
    lock = tmp_path / "uv.lock"
    lock.write_text(text)
    with pytest.raises(UserError) as raised:
        read_requirements(lock)
    assert raised.value.line().startswith(str(lock)) and words in raised.value.line()


def test_the_running_interpreter_is_read_as_the_passthrough_provider_reads_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[str, bool]] = []

    def listing(python: str, timeout_s: float = 120.0, isolated: bool = True) -> Listing:
        seen.append((python, isolated))
        return Listing(python_version="3.12.3", packages={"torch": "2.11.0+cu130", "Flash_Attn": "2.8.0"})

    monkeypatch.setattr(stacks, "list_distributions", listing)
    here = stack_here("/usr/bin/python3")
    environment = passthrough_environment(tmp_path, "/usr/bin/python3")
    assert seen == [("/usr/bin/python3", False)] * 2  # one reading, the caller's PYTHONPATH kept, both times
    assert here.versions["torch"] == environment.packages["torch"] == "2.11.0+cu130"
    assert here.python == environment.python_version == "3.12.3" and here.complete
    assert "flash-attn" in here.versions


# -- markers, duplicates and includes (issue 50, class 1) ------------------------------------------------------------

#: The red team's file: two pins of one package, each for another platform.
MARKERS = 'deepspeed==0.19.2 ; sys_platform == "linux"\ndeepspeed==0.19.8 ; sys_platform == "darwin"\n'


def test_a_pin_for_another_platform_is_left_out_not_taken_over_this_ones(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.txt"
    lock.write_text("torch==2.13.0\n" + MARKERS if sys.platform == "linux" else MARKERS.replace("linux", sys.platform))
    assert read_requirements(lock).versions["deepspeed"] == "0.19.2"
    # A pin whose marker holds nowhere here leaves the package out altogether.
    lock.write_text('torch==2.13.0\ndeepspeed==0.19.8 ; sys_platform == "nowhere"\n')
    assert "deepspeed" not in read_requirements(lock).versions


def test_a_package_pinned_twice_for_this_platform_is_refused_naming_both_lines(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.txt"
    lock.write_text("deepspeed==0.19.2\ntorch==2.13.0\ndeepspeed==0.19.8 ; python_version >= '3'\n")
    with pytest.raises(UserError) as raised:
        read_requirements(lock)
    line = raised.value.line()
    assert line.startswith(f"{lock}: line 3: pins deepspeed at 0.19.8, and {lock} line 1 pins it at 0.19.2"), line
    with pytest.raises(UserError):  # explain's lenient reading does not pick one either
        pins_from_freeze("deepspeed==0.19.2\ndeepspeed==0.19.8\n")
    lock.write_text("deepspeed==0.19.2\ndeepspeed==0.19.2\n")  # the same pin twice is one pin
    assert dict(read_requirements(lock).versions) == {"deepspeed": "0.19.2"}


def test_an_included_file_is_read_beside_the_one_that_includes_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.txt").write_text("torch==2.13.0\n-r more.txt\n")
    (tmp_path / "sub" / "more.txt").write_text("peft==0.21.2\n")
    top = tmp_path / "requirements.txt"
    top.write_text("-r sub/base.txt\n--requirement=sub/more.txt\ndeepspeed==0.19.2\n")
    assert dict(read_requirements(top).versions) == {"torch": "2.13.0", "peft": "0.21.2", "deepspeed": "0.19.2"}


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"a.txt": "-r b.txt\n", "b.txt": "-r a.txt\n"}, "(a cycle)"),
        ({"a.txt": "-r a.txt\n"}, "(a cycle)"),
        ({"a.txt": "-r https://example.org/r.txt\n"}, "includes https://example.org/r.txt by URL"),
        ({"a.txt": "-r missing.txt\n"}, "missing.txt: --requirements: no such file"),
        ({f"{i}.txt": f"-r {i + 1}.txt\n" for i in range(40)}, "levels deep"),
    ],
    ids=["cycle", "itself", "url", "missing", "deep"],
)
def test_an_include_that_cannot_be_followed_is_refused_never_skipped(
    tmp_path: Path, files: dict[str, str], words: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    first = tmp_path / next(iter(files))
    with pytest.raises(UserError) as raised:
        read_requirements(first)
    assert words in raised.value.line()
