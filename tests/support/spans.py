"""Spans as the tracing tests read them: plain JSON, ids in hex as trace viewers show them."""

from __future__ import annotations

from typing import Any


def span_record(span: Any) -> dict[str, Any]:
    """Name, trace ID, span ID, parent span ID and attributes of an SDK ``ReadableSpan``."""
    context = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "attributes": dict(span.attributes or {}),
    }
