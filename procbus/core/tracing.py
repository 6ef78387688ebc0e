"""Spans outside workflow code (a publish, a delivery round, a Spark job): through the process's
OpenTelemetry tracer provider, and nothing at all (not even a no-op span) without one, so the
hot paths pay one check when no one traces."""

from __future__ import annotations

from opentelemetry import trace

# Resolves to the provider once the process sets one (the API's proxy).
TRACER = trace.get_tracer("procbus")


def tracer_configured() -> bool:
    """Tell whether the process set an OpenTelemetry tracer provider.

    The API's default is a proxy that records nothing until one is set.
    """
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def flush_traces() -> None:
    """Export the spans the process's provider still holds (the SDK's batch processor sends every
    few seconds): a process that ends with os._exit runs no atexit hook, the SDK's own flush
    included, and would lose the spans of its last seconds."""
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if callable(force_flush):
        force_flush()
