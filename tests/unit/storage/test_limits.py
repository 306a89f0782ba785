"""Least privilege and bounded work, the pure parts: the input allow-list, INPUT_CONTAINERS and
MAX_GROUPS settings, capped reads, the group cap in the engine and the result document's bytes."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from azure.core.exceptions import HttpResponseError

from shared.aggregation import (
    AggregateResult,
    EngineOptions,
    TooManyGroups,
    aggregate_stream,
    aggregate_table,
    parse_aggregate_payload,
)
from shared.aggregation.result import result_json
from shared.config.settings import DEFAULT_MAX_GROUPS, Settings
from shared.core.errors import LimitExceeded, PayloadError, SettingsError
from shared.jobs.aggregate import result_document
from shared.storage.limits import (
    BlobTooLarge,
    input_refusal,
    read_capped,
    result_limit_bytes,
)

CONN = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/x;"


def settings(**env: str) -> Settings:
    return Settings.from_env({"AzureWebJobsStorage": CONN, **env})


# --- the allow-list ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "setting"),
    [
        ("ledger", "LEDGER_CONTAINER"),
        ("results", "RESULTS_CONTAINER"),
        ("payloads", "PAYLOADS_CONTAINER"),
        ("poison-archive", "POISON_ARCHIVE_CONTAINER"),
    ],
)
def test_the_apps_own_containers_are_never_input(container: str, setting: str) -> None:
    refusal = input_refusal(container, settings())
    assert refusal == (
        f"payload.input: container {container!r} is this app's {setting} "
        "(the app's own containers are never job input)"
    )


def test_the_apps_containers_are_the_configured_ones() -> None:
    custom = settings(
        LEDGER_CONTAINER="my-ledger",
        RESULTS_CONTAINER="my-results",
        PAYLOADS_CONTAINER="my-payloads",
        POISON_ARCHIVE_CONTAINER="my-archive",
    )
    for name in ("my-ledger", "my-results", "my-payloads", "my-archive"):
        assert input_refusal(name, custom) is not None
    assert input_refusal("ledger", custom) is None  # no longer the app's: an ordinary container


@pytest.mark.parametrize(
    "container", ["azure-webjobs-hosts", "azure-webjobs-secrets", "$logs", "$web", "$root"]
)
def test_the_hosts_containers_are_never_input(container: str) -> None:
    for s in (settings(), settings(INPUT_CONTAINERS="data")):
        assert input_refusal(container, s) == (
            f"payload.input: container {container!r} belongs to the Functions host "
            "(azure-webjobs-* and $-prefixed containers are never job input)"
        )


def test_any_other_container_is_allowed_when_input_containers_is_unset() -> None:
    s = settings()
    assert s.input_containers is None
    for name in ("data", "sales-2024", "webjobs", "azure-web"):
        assert input_refusal(name, s) is None


def test_input_containers_narrows_the_allowed_containers() -> None:
    s = settings(INPUT_CONTAINERS=" data , uploads,,data ")
    assert s.input_containers == ("data", "uploads")
    assert input_refusal("data", s) is None
    assert input_refusal("uploads", s) is None
    assert input_refusal("other", s) == (
        "payload.input: container 'other' is not in INPUT_CONTAINERS (allowed: data, uploads)"
    )
    assert input_refusal("ledger", s) is not None and "LEDGER_CONTAINER" in str(input_refusal("ledger", s))


@pytest.mark.parametrize(
    ("value", "env", "expected"),
    [
        ("data,ledger", {}, "INPUT_CONTAINERS lists 'ledger', which is this app's LEDGER_CONTAINER"),
        ("my-ledger", {"LEDGER_CONTAINER": "my-ledger"}, "which is this app's LEDGER_CONTAINER"),
        ("results", {}, "which is this app's RESULTS_CONTAINER"),
        ("payloads", {}, "which is this app's PAYLOADS_CONTAINER"),
        ("poison-archive", {}, "which is this app's POISON_ARCHIVE_CONTAINER"),
        ("azure-webjobs-secrets", {}, "INPUT_CONTAINERS lists 'azure-webjobs-secrets', which belongs to the"),
        ("$logs", {}, "INPUT_CONTAINERS lists '$logs', which belongs to the Functions host"),
        ("Data", {}, "INPUT_CONTAINERS: 'Data' is not a valid container name"),
        (" , ", {}, "INPUT_CONTAINERS lists no container names"),
    ],
)
def test_input_containers_may_not_name_an_internal_container(
    value: str, env: dict[str, str], expected: str
) -> None:
    with pytest.raises(SettingsError, match="INPUT_CONTAINERS") as info:
        settings(INPUT_CONTAINERS=value, **env)
    assert expected in str(info.value)


def test_host_containers_are_refused_at_validation() -> None:
    """No settings are needed for the host's names: the payload is refused before it is queued."""
    base = {"format": "csv", "metrics": [{"op": "count"}]}
    for container in ("azure-webjobs-secrets", "azure-webjobs-hosts", "$logs"):
        with pytest.raises(PayloadError) as info:
            parse_aggregate_payload({**base, "input": f"{container}/x.csv"})
        assert info.value.problems == [
            f"payload.input: container {container!r} belongs to the Functions host "
            "(azure-webjobs-* and $-prefixed containers are never job input)"
        ]


# --- MAX_GROUPS and the result limit -----------------------------------------------------------


def test_max_groups_setting() -> None:
    assert settings().max_groups == DEFAULT_MAX_GROUPS == 50_000
    assert settings(MAX_GROUPS="10").max_groups == 10
    with pytest.raises(SettingsError, match="MAX_GROUPS=0 must be >= 1"):
        settings(MAX_GROUPS="0")
    with pytest.raises(SettingsError, match="MAX_GROUPS='many' is not an integer"):
        settings(MAX_GROUPS="many")


def test_result_limit_is_derived_from_max_groups() -> None:
    assert result_limit_bytes(50_000) == 50_000 * 512 + 64 * 1024
    assert result_limit_bytes(1) == 512 + 65536


# --- capped reads ------------------------------------------------------------------------------


@dataclass
class Props:
    content_range: str | None


@dataclass
class Downloader:
    data: bytes
    total: int
    read: list[int]

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def properties(self) -> Props:
        return Props(f"bytes 0-{max(0, len(self.data) - 1)}/{self.total}")

    def readall(self) -> bytes:
        self.read.append(len(self.data))
        return self.data


@dataclass
class Blob:
    data: bytes
    requests: list[tuple[int, int]] = field(default_factory=list)
    read: list[int] = field(default_factory=list)

    def download_blob(self, offset: int, length: int, **_: Any) -> Downloader:
        self.requests.append((offset, length))
        if not self.data:
            exc = HttpResponseError(message="InvalidRange")
            exc.status_code = 416
            raise exc
        return Downloader(self.data[offset : offset + length], len(self.data), self.read)


def test_read_capped_reads_a_blob_within_the_limit() -> None:
    blob = Blob(b"x" * 100)
    assert read_capped(blob, 100) == b"x" * 100  # type: ignore[arg-type]
    assert blob.requests == [(0, 101)]  # one ranged GET, never more than limit + 1 bytes
    assert read_capped(Blob(b""), 100) == b""  # type: ignore[arg-type]


def test_read_capped_refuses_a_larger_blob_from_its_size() -> None:
    blob = Blob(b"x" * 10_000)
    with pytest.raises(BlobTooLarge) as info:
        read_capped(blob, 100)  # type: ignore[arg-type]
    assert (info.value.size, info.value.limit) == (10_000, 100)
    assert blob.requests == [(0, 101)] and blob.read == []  # refused before reading on


# --- the group cap in the engine ---------------------------------------------------------------


def spec(fmt: str = "csv") -> Any:
    return parse_aggregate_payload(
        {
            "input": "data/x",
            "format": fmt,
            "group_by": ["k"],
            "metrics": [{"op": "count"}, {"op": "sum", "column": "v"}],
        }
    )


def distinct(n: int, fmt: str) -> bytes:
    if fmt == "csv":
        return ("k,v\n" + "".join(f"key{i},{i}\n" for i in range(n))).encode()
    return "".join(json.dumps({"k": f"key{i}", "v": i}) + "\n" for i in range(n)).encode()


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_cap_allows_exactly_max_groups(fmt: str) -> None:
    result = aggregate_stream(io.BytesIO(distinct(10, fmt)), spec(fmt), max_groups=10)
    assert result.groups == 10


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("block_size", [64, 4 * 1024 * 1024])
def test_one_group_over_the_cap_raises(fmt: str, block_size: int) -> None:
    with pytest.raises(TooManyGroups) as info:
        aggregate_stream(
            io.BytesIO(distinct(11, fmt)),
            spec(fmt),
            max_groups=10,
            options=EngineOptions(block_size=block_size),
        )
    assert info.value.limit == 10 and info.value.seen > 10
    assert isinstance(info.value, LimitExceeded) and info.value.reason_code == "over_limit"


def test_the_cap_counts_distinct_groups_not_rows() -> None:
    data = ("k,v\n" + "".join(f"key{i % 5},{i}\n" for i in range(10_000))).encode()
    assert (
        aggregate_stream(io.BytesIO(data), spec(), max_groups=5, options=EngineOptions(block_size=256)).groups
        == 5
    )


def test_many_distinct_keys_stop_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partials are combined (and the cap checked) once they hold more than max_groups rows."""
    from shared.aggregation import plan

    combined: list[int] = []
    real = plan.Accumulator.combine

    def spy(self: Any) -> None:
        combined.append(self.pending_rows)
        real(self)

    monkeypatch.setattr(plan.Accumulator, "combine", spy)
    with pytest.raises(TooManyGroups):
        aggregate_stream(
            io.BytesIO(distinct(50_000, "csv")),
            spec(),
            max_groups=1000,
            options=EngineOptions(block_size=4096),
        )
    assert len(combined) == 1 and combined[0] <= 1000 + 400  # one block's partials past the cap


# --- the result document, a batch at a time ----------------------------------------------------


def table_of(text: str, group_by: list[str], metrics: list[dict[str, str]]) -> tuple[pa.Table, int, Any]:
    s = parse_aggregate_payload(
        {"input": "data/x", "format": "csv", "group_by": group_by, "metrics": metrics}
    )
    table, rows = aggregate_table(io.BytesIO(text.encode()), s)
    return table, rows, s


@pytest.mark.parametrize("batch", [1, 3, 8192])
def test_result_json_is_the_documents_json(batch: int) -> None:
    text = 'k,g,v\na,x,1.5\nb,x,\n,y,2\n"é ""q""",x,1e300\nb,y,-0.1\n\\,x,NA\n'
    metrics = [
        {"op": "count"},
        {"op": "count", "column": "v"},
        {"op": "sum", "column": "v"},
        {"op": "mean", "column": "v"},
        {"op": "min", "column": "v"},
        {"op": "max", "column": "v", "as": "ü"},
    ]
    for group_by in (["k"], ["k", "g"], []):
        table, input_rows, _ = table_of(text, group_by, metrics)
        expected = result_document("job-é", AggregateResult(table.to_pylist(), input_rows), "inline", 1.23456)
        data = result_json("job-é", table, input_rows, "inline", 1.23456, batch_rows=batch)
        assert data == json.dumps(expected, separators=(",", ":"), ensure_ascii=False).encode()
    empty, _, _ = table_of("k,v\n", ["k"], [{"op": "count"}])
    assert json.loads(result_json("j", empty, 0, "inline", 0)) == {
        "id": "j",
        "rows": [],
        "input_rows": 0,
        "engine": "inline",
        "elapsed_s": 0,
    }


def test_result_json_stops_at_the_limit() -> None:
    table, rows, _ = table_of(
        "k\n" + "".join(f"{'x' * 100}{i}\n" for i in range(1000)), ["k"], [{"op": "count"}]
    )
    with pytest.raises(
        LimitExceeded, match=r"more than \d+ bytes, over the 5000 that MAX_GROUPS allows"
    ) as info:
        result_json("j", table, rows, "inline", 0, max_bytes=5000, batch_rows=10)
    assert "narrow group_by" in str(info.value)
    assert len(result_json("j", table, rows, "inline", 0, max_bytes=10**6, batch_rows=10)) < 10**6


# --- the Spark offload path --------------------------------------------------------------------


class Untouchable:
    """Storage or a backend that must not be used."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} used before the input was checked")


@pytest.mark.parametrize("container", ["ledger", "poison-archive", "azure-webjobs-secrets", "other"])
def test_offload_refuses_a_forbidden_input_before_submitting(container: str) -> None:
    import logging

    from shared.core.errors import InputRefused
    from shared.jobs.base import JobContext
    from shared.jobs.offload.aggregate_spark import offload

    spark_env = {
        "SPARK_BACKEND": "standalone",
        "SPARK_URL": "http://127.0.0.1:9",
        "SPARK_MASTER_UI_URL": "http://127.0.0.1:9",
        "SPARK_JOB_FILE": "/x.py",
    }
    ctx = JobContext(
        job_id="j1",
        kind="aggregate",
        attempt=0,
        payload={
            "input": f"{container}/x.csv",
            "format": "csv",
            "metrics": [{"op": "count"}],
            "engine": "spark",
        },
        settings=settings(INPUT_CONTAINERS="data", **spark_env),
        storage=Untouchable(),
        log=logging.LoggerAdapter(logging.getLogger("test"), {}),
        checkpoint=lambda progress: None,
    )
    with pytest.raises(InputRefused, match=rf"^payload.input: container '{container}' "):
        offload(ctx, backend=Untouchable())


def test_the_offload_reason_is_kept_across_polls() -> None:
    from dataclasses import replace

    from shared.spark.tracking import OffloadState

    state = OffloadState("standalone", "d1", "n-s1", 1000.0, reason="max_groups")
    polled = replace(OffloadState.from_dict(state.to_dict()), polls=3)
    assert OffloadState.from_dict(polled.to_dict()).reason == "max_groups"
    assert (
        OffloadState.from_dict(
            {"backend": "livy", "submission_id": "1", "name": "n", "submitted_at": 1}
        ).reason
        == ""
    )
