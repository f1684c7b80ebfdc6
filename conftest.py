"""pytest glue for the harness's own tests, and the repros as test items.

Options:
  --no-integration   skip the tests that build real environments and launch real ranks
  --harness-cache    environment cache for those tests (default: the harness's own default,
                     so `make run` and `make test` share environments)

The repros become test items only when asked for (``pytest repros/ --cell passthrough``,
``pytest --lane ci -n 2``): see harness/pytest_plugin.py for its options and markers.
"""

from __future__ import annotations

import os

import pytest

# harness.pytest_plugin is a pytest11 entry point (pyproject.toml), so its options parse
# even when the first path on the command line lies outside this repository (a matrix
# file of one's own); where plugin autoload is off, this conftest registers it instead.
if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
    pytest_plugins = ["harness.pytest_plugin"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ft-regress")
    group.addoption("--no-integration", action="store_true", help="skip tests marked integration")
    group.addoption("--harness-cache", default=None, help="environment cache dir for integration tests")


def pytest_configure(config: pytest.Config) -> None:
    cache = config.getoption("--harness-cache")
    if cache:
        # Read by harness.environments.default_cache_dir() in every subprocess the tests start.
        os.environ["FT_REGRESS_CACHE"] = os.path.abspath(cache)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--no-integration"):
        return
    skip = pytest.mark.skip(reason="--no-integration")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)
