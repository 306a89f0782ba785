"""Shared fixtures (a real Azurite process on free ports, or an in-memory account) and the test tiers.

Each test is marked by the resources it needs, from the fixtures it uses (`RESOURCE_FIXTURES`):
`azurite`, `spark`, `browser`. A test on `storage_backend` runs twice, on an in-memory account and
on Azurite, and only its Azurite variant is marked. `make test-fast` deselects the marked tests and
sets `JOBS_TEST_TIER=fast`, which makes starting Azurite, a local host process or a Spark cluster
fail the test at once: a test that needs one without saying so through its fixtures cannot hide in
the fast tier.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import hypothesis
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from devstack.azurite import Azurite, start_azurite  # noqa: E402
from tests.storage_params import STORAGE_BACKENDS  # noqa: E402

pytest_plugins = ("tests.handlerkit",)
"""The handler test kit's fixtures (`receiver`)."""

if TYPE_CHECKING:
    from tests.integration.backends import Backend

RESOURCE_FIXTURES = {
    "azurite": "azurite",
    "storage_env": "azurite",
    "spark_cluster": "spark",
    "browser": "browser",
}
"""Fixture -> resource marker. A fixture that needs one of these lists it as an argument, so
pytest's closure of a test's fixtures carries it."""
FAST_TIER = os.environ.get("JOBS_TEST_TIER") == "fast"
DEPLOY_TESTS = REPO_ROOT / "tests" / "deploy"
"""Packaging, templates and deploy scripts: marked `deploy`, left to `make test`."""


def resource_markers(fixturenames: Iterator[str] | list[str] | tuple[str, ...]) -> set[str]:
    """The resource markers a test with these fixtures (their closure) needs."""
    return {RESOURCE_FIXTURES[name] for name in fixturenames if name in RESOURCE_FIXTURES}


FAST_TIER_EXAMPLES = 5
"""The fast tier runs each property test with 1/5 of its examples (at least 20); `make test` runs them all."""


def fewer_examples(count: int) -> int:
    return min(count, max(20, count // FAST_TIER_EXAMPLES))


def tier_cases(count: int) -> int:
    """Cases a seeded loop runs: all of them in `make test`, a fifth (at least 20) in the fast tier."""
    return fewer_examples(count) if FAST_TIER else count


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in sorted(resource_markers(getattr(item, "fixturenames", ()))):
            item.add_marker(marker)
        if DEPLOY_TESTS in item.path.parents:
            item.add_marker("deploy")
        if item.get_closest_marker("spark") is not None:
            item.add_marker("integration")
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if FAST_TIER:
            _shorten_property_test(item)


RESOURCE_MARKERS = ("integration", "azurite", "spark", "browser", "deploy")


def xdist_group(item: pytest.Item) -> str | None:
    """Which worker-sharing group a resource test belongs to under `--dist loadgroup`.

    The Spark tests share one cluster (a session fixture: one per worker) and the browser tests
    one Chromium, so each kind stays on one worker; every other module keeps its tests together,
    so its module-scoped Azurite and host start once. Resource-free tests take no group."""
    if item.get_closest_marker("spark") is not None:
        return "spark"
    if item.get_closest_marker("browser") is not None:
        return "browser"
    if any(item.get_closest_marker(name) is not None for name in RESOURCE_MARKERS):
        return str(item.path)
    return None


def _shorten_property_test(item: pytest.Item) -> None:
    """Hypothesis reads a test's settings when it runs: give it fewer examples, nothing else changed."""
    test = getattr(item, "obj", None)
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if test is None or not isinstance(current, hypothesis.settings):
        return
    test._hypothesis_internal_use_settings = hypothesis.settings(
        current, max_examples=fewer_examples(current.max_examples)
    )


class ResourceInFastTier(RuntimeError):
    """A fast-tier test started a process the fast tier must not need: give it the resource's fixture."""


@contextlib.contextmanager
def resources_refused() -> Iterator[None]:
    """While open, starting Azurite, a host process or a Spark cluster raises ResourceInFastTier."""
    from devstack.hostproc import HostProcess
    from devstack.spark_cluster import SparkCluster

    def refuse(what: str) -> object:
        def start(*_: object, **__: object) -> None:
            raise ResourceInFastTier(f"{what} started in the fast tier (JOBS_TEST_TIER=fast)")

        return start

    patched = [
        (Azurite, "start"),
        (HostProcess, "start"),
        (SparkCluster, "start"),
        (SparkCluster, "start_master"),
    ]
    saved = [(cls, name, getattr(cls, name)) for cls, name in patched]
    for cls, name in patched:
        setattr(cls, name, refuse(f"{cls.__name__}.{name}"))
    try:
        yield
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


@pytest.fixture(autouse=FAST_TIER, scope="session")
def _no_resources_in_fast_tier() -> Iterator[None]:
    with resources_refused():
        yield


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """A fresh Azurite for each test module (tests use unique queue/container names).

    Not one for the whole session: Azurite keeps every blob, queue and table row in one LokiJS
    database and writes it out whole every few seconds, and some of its lookups scan it, so a
    shared instance slowed down as the session went on: a poison replay test took 11-18 s on
    its own and 200-300 s late in `make test`. A start costs about 2-4 s."""
    log = tmp_path_factory.mktemp("azurite-log") / "azurite.log"
    az = start_azurite(log_path=log)
    try:
        yield az
    finally:
        az.cleanup()


@pytest.fixture(params=STORAGE_BACKENDS)
def storage_backend(request: pytest.FixtureRequest) -> Backend:
    """The test's storage account: `shared.storage.memory_account.MemoryAccount`, or the module's Azurite
    (asked for only by that variant, so the memory one needs no Azurite). The app's modules are
    imported here, not with this file: a test that needs no storage does not load them."""
    from tests.integration.backends import Backend

    if request.param == "azurite":
        return Backend.on_azurite(request.getfixturevalue("azurite"))
    return Backend.in_memory()


@pytest.fixture
def storage_env(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment pointing the app's settings at the test Azurite."""
    env = {"AzureWebJobsStorage": azurite.connection_string}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return dict(os.environ)
