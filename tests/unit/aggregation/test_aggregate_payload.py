"""Validation of the `aggregate` payload (pure): every problem listed, each naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from shared.aggregation import AggregateSpec, MetricSpec, parse_aggregate_payload
from shared.aggregation.payload import check_blob_path, check_container_name
from shared.core.errors import PayloadError, PermanentError
from shared.jobs.aggregate import HANDLER


def payload(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "input": "data/2024/sales.csv",
        "format": "csv",
        "group_by": ["region"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "qty"}],
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


def problems(value: object) -> list[str]:
    with pytest.raises(PayloadError) as info:
        parse_aggregate_payload(value)
    assert isinstance(info.value, PermanentError)
    assert info.value.reason_code == "bad_payload"
    return info.value.problems


def test_valid_payload_with_defaults() -> None:
    spec = parse_aggregate_payload(payload())
    assert spec == AggregateSpec(
        container="data",
        blob="2024/sales.csv",
        format="csv",
        group_by=("region",),
        metrics=(MetricSpec("count", None, "count"), MetricSpec("sum", "qty", "sum_qty")),
        engine="auto",
        null_values=("", "NA"),
    )
    assert spec.input == "data/2024/sales.csv"


def test_full_payload() -> None:
    spec = parse_aggregate_payload(
        payload(
            format="jsonl",
            group_by=[],
            metrics=[
                {"op": "count", "column": "qty", "as": "n_qty"},
                {"op": "mean", "column": "price"},
                {"op": "min", "column": "price", "as": "cheapest"},
                {"op": "max", "column": "price"},
            ],
            engine="inline",
            null_values=["-", "null"],
        )
    )
    assert spec.format == "jsonl" and spec.group_by == () and spec.engine == "inline"
    assert [m.name for m in spec.metrics] == ["n_qty", "mean_price", "cheapest", "max_price"]
    assert spec.null_values == ("-", "null")


def test_group_by_is_optional_and_null_values_may_be_empty() -> None:
    spec = parse_aggregate_payload(payload(group_by=..., null_values=[]))
    assert spec.group_by == () and spec.null_values == ()


def test_spec_is_frozen() -> None:
    spec = parse_aggregate_payload(payload())
    with pytest.raises(AttributeError):
        spec.format = "jsonl"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("x", "payload: must be an object, got string"),
        ([], "payload: must be an object, got array"),
        (None, "payload: must be an object, got null"),
    ],
)
def test_payload_must_be_an_object(value: object, expected: str) -> None:
    assert problems(value) == [expected]


def test_unknown_top_level_key() -> None:
    assert problems(payload(where="x > 1")) == [
        "payload.where: unknown key (allowed: input, format, group_by, metrics, engine, null_values, output)"
    ]


def test_required_fields() -> None:
    found = problems({})
    assert "payload.input: required ('<container>/<blob path>')" in found
    assert "payload.format: required (one of csv, jsonl, parquet)" in found
    assert any(p.startswith("payload.metrics: required") for p in found)
    assert len(found) == 3


def test_all_problems_are_listed_at_once() -> None:
    found = problems(
        {
            "input": 7,
            "format": "xml",
            "group_by": "region",
            "metrics": [{"op": "median", "column": "x"}, {"op": "sum"}],
            "engine": "gpu",
            "null_values": "NA",
            "extra": 1,
        }
    )
    assert found == [
        "payload.extra: unknown key (allowed: input, format, group_by, metrics, engine, null_values, output)",
        "payload.input: must be a string, got number",
        "payload.format: 'xml' is not one of csv, jsonl, parquet",
        "payload.group_by: must be a list of strings, got string",
        "payload.metrics[0].op: 'median' is not one of count, sum, mean, min, max",
        "payload.metrics[1].column: required for op 'sum'",
        "payload.engine: 'gpu' is not one of auto, inline, spark",
        "payload.null_values: must be a list of strings, got string",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("sales.csv", "payload.input: must be '<container>/<blob path>', got 'sales.csv'"),
        ("/data/sales.csv", "payload.input: must be '<container>/<blob path>', got '/data/sales.csv'"),
        ("Data/sales.csv", "payload.input: container 'Data' is not a valid container name"),
        ("ab/sales.csv", "payload.input: container 'ab' is not a valid container name"),
        ("da--ta/sales.csv", "payload.input: container 'da--ta' is not a valid container name"),
        ("data/", "payload.input (blob path): must not be empty"),
        ("data//sales.csv", "payload.input (blob path): must not start with '/'"),
        ("data/a//b.csv", "payload.input (blob path): must not contain '//'"),
        ("data/../ledger/x.json", "payload.input (blob path): must not contain '.' or '..' segments"),
        ("data/a/./b.csv", "payload.input (blob path): must not contain '.' or '..' segments"),
        ("data/a\\b.csv", "payload.input (blob path): must not contain a backslash"),
        ("data/a\nb.csv", "payload.input (blob path): must not contain control characters"),
        ("data/a\x00b.csv", "payload.input (blob path): must not contain control characters"),
        ("data/a/", "payload.input (blob path): must not end with '/'"),
        ("data/" + "a" * 1025, "payload.input (blob path): longer than 1024 characters (1025)"),
    ],
)
def test_input_path_tricks(value: str, expected: str) -> None:
    found = problems(payload(input=value))
    assert any(p.startswith(expected) for p in found), found


def test_check_blob_path_is_reusable() -> None:
    assert check_blob_path("claims/2024/abc.json", "payload_ref") == []
    assert check_blob_path("a" * 1024, "payload_ref") == []
    assert check_blob_path(None, "payload_ref") == ["payload_ref: must be a string, got null"]
    assert check_blob_path("", "payload_ref") == ["payload_ref: must not be empty"]
    assert check_blob_path("../x", "payload_ref") == ["payload_ref: must not contain '.' or '..' segments"]
    found = check_blob_path("/a//..\\\x7f", "f")
    assert len(found) == 4 and all(p.startswith("f: ") for p in found)


def test_check_container_name() -> None:
    assert check_container_name("results-2024", "f") == []
    assert check_container_name("-bad", "f") != []
    assert check_container_name("x" * 64, "f") != []


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ([], "payload.metrics: must not be empty"),
        ({"op": "count"}, "payload.metrics: must be a list, got object"),
        (["count"], "payload.metrics[0]: must be an object, got string"),
        ([{}], "payload.metrics[0].op: required (one of count, sum, mean, min, max)"),
        ([{"op": 1}], "payload.metrics[0].op: must be a string, got number"),
        ([{"op": "median"}], "payload.metrics[0].op: 'median' is not one of count, sum, mean, min, max"),
        ([{"op": "mean"}], "payload.metrics[0].column: required for op 'mean'"),
        ([{"op": "min"}], "payload.metrics[0].column: required for op 'min'"),
        ([{"op": "max"}], "payload.metrics[0].column: required for op 'max'"),
        ([{"op": "sum", "column": 3}], "payload.metrics[0].column: must be a string, got number"),
        ([{"op": "sum", "column": ""}], "payload.metrics[0].column: a column name must not be empty"),
        ([{"op": "count", "as": True}], "payload.metrics[0].as: must be a string, got boolean"),
        ([{"op": "count", "as": ""}], "payload.metrics[0].as: a column name must not be empty"),
        ([{"op": "count", "by": "x"}], "payload.metrics[0].by: unknown key (allowed: op, column, as)"),
        (
            [{"op": "count"}, {"op": "count"}],
            "payload.metrics[1]: output name 'count' is already used by payload.metrics[0]",
        ),
        (
            [{"op": "sum", "column": "qty"}, {"op": "count", "as": "sum_qty"}],
            "payload.metrics[1].as: output name 'sum_qty' is already used by payload.metrics[0]",
        ),
        (
            [{"op": "count", "as": "region"}],
            "payload.metrics[0].as: output name 'region' collides with a group_by column",
        ),
    ],
)
def test_metric_problems(metrics: object, expected: str) -> None:
    assert expected in problems(payload(metrics=metrics))


def test_default_name_colliding_with_group_column() -> None:
    found = problems(payload(group_by=["count"], metrics=[{"op": "count"}]))
    assert found == ["payload.metrics[0]: output name 'count' collides with a group_by column"]


@pytest.mark.parametrize(
    ("group_by", "expected"),
    [
        (["region", "region"], "payload.group_by[1]: 'region' is listed twice"),
        (["region", 3], "payload.group_by[1]: must be a string, got number"),
        ([""], "payload.group_by[0]: a column name must not be empty"),
        (["x" * 257], "payload.group_by[0]: a column name must be at most 256 characters"),
        ({"a": 1}, "payload.group_by: must be a list of strings, got object"),
    ],
)
def test_group_by_problems(group_by: object, expected: str) -> None:
    assert problems(payload(group_by=group_by)) == [expected]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"format": None}, "payload.format: required (one of csv, jsonl, parquet)"),
        ({"format": "CSV"}, "payload.format: 'CSV' is not one of csv, jsonl, parquet"),
        ({"engine": 1}, "payload.engine: must be a string, got number"),
        ({"null_values": ["", 0]}, "payload.null_values[1]: must be a string, got number"),
        ({"null_values": ["x"] * 101}, "payload.null_values: at most 100 values"),
    ],
)
def test_other_field_problems(changes: dict[str, Any], expected: str) -> None:
    assert problems(payload(**changes)) == [expected]


def test_handler_validate_is_the_parser() -> None:
    HANDLER.validate(payload())
    with pytest.raises(PayloadError) as info:
        HANDLER.validate(payload(metrics=[]))
    assert info.value.problems == ["payload.metrics: must not be empty"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"\x1f": None}, 'payload["\\u001f"]: unknown key'),
        ({"a.b": 1}, 'payload["a.b"]: unknown key'),
        ({"k" * 500: 1}, 'payload["' + "k" * 76 + "...]: unknown key"),
        ({"metrics": [{"op": "count", "\x00": 1}]}, 'payload.metrics[0]["\\u0000"]: unknown key'),
        ({"format": "\x00" * 300}, "payload.format: '\\x00\\x00"),
        ({"input": "X" * 5000 + "/a"}, "payload.input: container 'XXX"),
        ({"group_by": ["\U0001f600\x07" * 100] * 2}, "payload.group_by[1]: '\U0001f600\\x07"),
    ],
)
def test_problems_are_printable_and_short_whatever_the_names(value: dict[str, Any], expected: str) -> None:
    found = problems({**payload(), **value})
    assert any(p.startswith(expected) for p in found), found
    assert all(p.isprintable() and len(p) < 200 for p in found), found
