"""A tiny installable package that extends the harness through entry points, built as a real wheel
(a zip with its ``.dist-info``: no build backend needed, so no download) and installed by pip into a
folder a test puts on ``PYTHONPATH``.

``ft_regress_tiny`` declares a repro (``T100``, in its ``repros`` package: ``ft_regress.repros``) and
an executor (``tiny``: ``ft_regress.executors``), the local executor counting its attempts and
saying so in ``run.json``, with an option of its own (``--tiny-label``). A package that gives a
name already taken is made with ``clash``.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Mapping
from pathlib import Path

REPRO = """
from repros.runtime.spec import Expectation, ReproSpec, Signature

SPEC = ReproSpec(
    id="T100",
    title="a repro shipped in an installed package",
    upstream=(),
    signatures=(Signature(id="T100.sig", exception="ValueError", pattern="shipped symptom"),),
    expectations=(Expectation(mode="bug", outcome="REPRODUCED"),),
    modes=("bug",),
    world_size=1,
)


def run(ctx):
    raise ValueError("the shipped symptom, on rank %d" % ctx.rank)
"""

EXECUTOR = '''
from harness.core.option import Option
from harness.pipeline.executors.local import LocalExecutor


class TinyExecutor(LocalExecutor):
    """The local executor, counting the attempts it ran and saying the label it was given
    (``--tiny-label``, its own option; ``run.json`` says both)."""

    name = "tiny"
    options = (Option("tiny_label", ("--tiny-label",), "with --executor tiny: a label run.json shows"),)

    def __init__(self, context, launcher=None):
        super().__init__(context, launcher)
        self.attempts = 0

    def attempt(self, job, resolved, gpus):
        self.attempts += 1
        return super().attempt(job, resolved, gpus)

    def describe(self):
        label = self.context.choice.executor_options.get("tiny_label")
        return {**super().describe(), "name": self.name, "attempts_by_tiny": self.attempts, "label": label}
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel(directory: Path, name: str, files: Mapping[str, str], entry_points: Mapping[str, Mapping[str, str]]) -> Path:
    """A wheel of ``files`` (path in the wheel -> text) declaring ``entry_points`` (group -> name -> value)."""
    dist = f"{name.replace('-', '_')}-0.1"
    points = "".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in entries.items()) + "\n"
        for group, entries in entry_points.items()
    )
    contents = {
        **{path: textwrap.dedent(text) for path, text in files.items()},
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}.dist-info/entry_points.txt": points,
    }
    record = [_record_line(path, text.encode()) for path, text in contents.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    contents[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in contents.items():
            archive.writestr(member, text)
    return path


def pip_install(wheel_path: Path, target: Path) -> Path:
    """``pip install`` the wheel into ``target`` (a folder for ``PYTHONPATH``), offline."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            str(wheel_path),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return target


def tiny(directory: Path) -> Path:
    """The ``ft_regress_tiny`` wheel: repro T100 and executor ``tiny``."""
    return wheel(
        directory,
        "ft-regress-tiny",
        {
            "ft_regress_tiny/__init__.py": "",
            "ft_regress_tiny/repros/__init__.py": "",
            "ft_regress_tiny/repros/t100_shipped.py": REPRO,
            "ft_regress_tiny/executor.py": EXECUTOR,
        },
        {
            "ft_regress.repros": {"tiny": "ft_regress_tiny.repros"},
            "ft_regress.executors": {"tiny": "ft_regress_tiny.executor:TinyExecutor"},
        },
    )


def clash(directory: Path) -> Path:
    """A package whose executor takes a built-in's name (``local``)."""
    return wheel(
        directory,
        "ft-regress-clash",
        {"ft_regress_clash/__init__.py": "class Local:\n    pass\n"},
        {"ft_regress.executors": {"local": "ft_regress_clash:Local"}},
    )
