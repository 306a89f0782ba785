"""Typed settings, the platform's facts, telemetry and logging context, the retention rules."""
