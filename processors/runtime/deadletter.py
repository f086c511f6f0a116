"""Dead letters: input the processor cannot fold goes to `<p>.dead-letters`, inside the
same transaction as the input's offset, with its coordinates and the reason."""

from __future__ import annotations

from typing import Any

PRODUCER = "processor"

# Reasons (metric label values). The error text adds the detail.
UNDECODABLE = "undecodable"
NULL_VALUE = "null_value"
KEY_MISMATCH = "key_mismatch"
MISROUTED = "misrouted"  # forwarded to its owning partition once already, and not owned there either
PROCESSING_ERROR = "processing_error"  # the engine (or the runtime's own fold) raised on it
OUTPUT_TOO_LARGE = "output_too_large"  # folding it produced a record the broker refuses
UNSERIALIZABLE = "unserializable"  # folding it produced a value the encoders cannot write


def dead_letter(
    topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, error: str, now_ms: int
) -> dict[str, Any]:
    """The DeadLetter record (docs/messages.md) for one source record."""
    return {
        "record_id": f"dl:{topic}:{partition}:{offset}",
        "ts_ms": now_ms,
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "key": key,
        "error": error[:2000],
        "original": value or b"",
        "producer": PRODUCER,
    }
