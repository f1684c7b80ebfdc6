"""One bad neighbour breaks nothing else (issue 50, class 5): a verb plugin (entry point ``ft_regress.commands``)
that raises as it is imported leaves every other verb and ``--help`` working, with a one-line warning naming it;
the verb itself exits 2 naming the plugin and what it raised."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_bad_options import cli
from tests.support.paths import REPO_ROOT


@pytest.fixture
def broken_plugin(tmp_path: Path) -> Path:
    """A package on the import path declaring a verb whose module raises at import."""
    where = tmp_path / "site"
    info = where / "broken_verb-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-verb\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ft_regress.commands]\nfrobnicate = broken_verb:FrobnicateCommand\n")
    (where / "broken_verb.py").write_text('raise ImportError("no module named frobnicator_core")\n')
    return where


def run(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(where, *args, env={"PYTHONPATH": os.pathsep.join([str(where), str(REPO_ROOT)])})


WARNING = (
    "warning: the verb 'frobnicate' (broken_verb:FrobnicateCommand from broken-verb 1.0 (entry point group "
    "ft_regress.commands)) could not be loaded (ImportError: no module named frobnicator_core); the other verbs work"
)


def test_the_other_verbs_work_and_a_warning_names_the_plugin(broken_plugin: Path) -> None:
    done = run(broken_plugin, "list")
    assert done.returncode == 0, done.stderr
    assert "F1 " in done.stdout and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0] == WARNING


def test_help_still_lists_every_verb(broken_plugin: Path) -> None:
    done = run(broken_plugin, "--help")
    assert done.returncode == 0 and "atlas" in done.stdout and "frobnicate" in done.stdout, done.stderr
    assert WARNING in done.stderr


def test_the_broken_verb_itself_exits_2_naming_the_plugin_and_its_error(broken_plugin: Path) -> None:
    done = run(broken_plugin, "frobnicate", "--anything", "x")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: frobnicate: the plugin that gives this verb (broken_verb:FrobnicateCommand")
    assert "raised as it was loaded: ImportError: no module named frobnicator_core" in last
