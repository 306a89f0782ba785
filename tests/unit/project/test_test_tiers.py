"""The test tiers: resource markers come from fixtures, and the fast tier refuses to start resources."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.azurite import Azurite
from devstack.hostproc import HostProcess
from tests.conftest import ResourceInFastTier, fewer_examples, resource_markers, resources_refused


def test_markers_follow_the_fixtures_a_test_uses() -> None:
    assert resource_markers(["tmp_path", "storage_env", "azurite"]) == {"azurite"}
    assert resource_markers(["spark_cluster", "browser"]) == {"spark", "browser"}
    assert resource_markers(["tmp_path", "monkeypatch"]) == set()


def test_the_fast_tier_runs_a_fifth_of_the_examples_but_at_least_twenty() -> None:
    assert fewer_examples(600) == 120
    assert fewer_examples(50) == 20
    assert fewer_examples(10) == 10


def test_starting_azurite_or_a_host_in_the_fast_tier_fails_and_is_restored_after(tmp_path: Path) -> None:
    original = Azurite.start
    with resources_refused():
        with pytest.raises(ResourceInFastTier, match=r"Azurite\.start"):
            Azurite(blob_port=1, queue_port=2, table_port=3, location=tmp_path).start()
        with pytest.raises(ResourceInFastTier, match=r"HostProcess\.start"):
            HostProcess(env={}).start()
    assert Azurite.start is original
