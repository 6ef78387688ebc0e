"""Spans outside workflow code (a publish, a delivery round, a Spark job): through the process's
OpenTelemetry tracer provider, and nothing at all (not even a no-op span) without one, so the
hot paths pay one check when no one traces."""

from __future__ import annotations

from opentelemetry import trace

# Resolves to the provider once the process sets one (the API's proxy).
TRACER = trace.get_tracer("procbus")


def tracer_configured() -> bool:
    """Whether the process set an OpenTelemetry tracer provider (the API's default is a proxy
    that records nothing until one is set)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
