"""Observability: telemetry set-up, tracing, decision logs, the job and queue metrics, and the
console overview's counters."""
