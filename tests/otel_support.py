"""The process's OpenTelemetry SDK providers for tests: spans kept in memory, metrics read on demand.

Set once per process (OpenTelemetry's global providers cannot be replaced); each test clears the
spans it looks at. Telemetry that configures real exporters is tested in a subprocess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_state: dict[str, Any] = {}


def memory_telemetry() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """The in-memory span exporter and metric reader of this process (installed on first use)."""
    if not _state:
        exporter = InMemorySpanExporter()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        reader = InMemoryMetricReader()
        if isinstance(metrics.get_meter_provider(), MeterProvider):
            raise RuntimeError("a meter provider was set before the tests' in-memory one")
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _state.update(exporter=exporter, reader=reader)
    return _state["exporter"], _state["reader"]


def spans_of(exporter: InMemorySpanExporter, job_id: str) -> list[ReadableSpan]:
    """The finished spans naming `job_id`, in the order they ended."""
    return [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("job.id") == job_id]


def metric_points(reader: InMemoryMetricReader, name: str) -> list[tuple[Mapping[str, Any], Any]]:
    """(attributes, point) of every data point of metric `name` collected now."""
    data = reader.get_metrics_data()
    found: list[tuple[Mapping[str, Any], Any]] = []
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend((dict(p.attributes or {}), p) for p in metric.data.data_points)
    return found


def counter_value(reader: InMemoryMetricReader, name: str, **attributes: str) -> float:
    """The sum of a counter's points whose attributes include `attributes`."""
    return sum(
        float(p.value)
        for attrs, p in metric_points(reader, name)
        if all(attrs.get(k) == v for k, v in attributes.items())
    )
