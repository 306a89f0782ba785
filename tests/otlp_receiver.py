"""A tiny OTLP/HTTP (protobuf) receiver for tests: 127.0.0.1 on a free port, keeps what arrives."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]


@dataclass
class Received:
    spans: list[Span] = field(default_factory=list)
    metrics: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Metric name -> attributes of each data point received."""
    raw: list[bytes] = field(default_factory=list)
    """Every request body as sent (decompressed)."""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _attrs(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


class OtlpReceiver:
    """Start with `with OtlpReceiver() as receiver:`; `receiver.url` is the OTLP endpoint."""

    def __init__(self) -> None:
        self.received = Received()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver._traces(body)
                    answer = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver._metrics(body)
                    answer = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = [
            Span(
                span.trace_id.hex(),
                span.span_id.hex(),
                span.parent_span_id.hex(),
                span.name,
                span.kind,
                _attrs(span.attributes),
                [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
            )
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self._lock:
            self.received.raw.append(body)
            self.received.spans.extend(spans)

    def _metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest.FromString(body)
        with self._lock:
            self.received.raw.append(body)
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        data = getattr(metric, metric.WhichOneof("data"))
                        points = self.received.metrics.setdefault(metric.name, [])
                        points.extend(_attrs(p.attributes) for p in data.data_points)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self.received.spans)

    def metric_names(self) -> set[str]:
        with self._lock:
            return set(self.received.metrics)

    def points(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.received.metrics.get(name, []))

    def raw_text(self) -> bytes:
        with self._lock:
            return b"".join(self.received.raw)
