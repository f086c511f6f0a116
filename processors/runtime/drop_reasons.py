"""The `reason` label of `runfold_processor_dropped_inputs`: a fixed set, whatever text the engine gave.

`Decision.dropped` is free text (engine/: a shape problem names the field, a rejected start
gives its whole reason, an unknown timer kind quotes it); as a Prometheus label every distinct
text would be a new time series. The texts that never vary are kept as they are; the ones that
carry a value are mapped to a word for their kind; anything else is `other`.
"""

from __future__ import annotations

import re

# The engine's fixed `dropped` texts (commands.py, decider.py, receipts.py, start.py).
FIXED = frozenset(
    {
        "duplicate cancel",
        "duplicate command",
        "invalid idempotency key",
        "duplicate start",
        "conflicting start",
        "run already finished",
        "run finished",
        "unknown run",
        "message for another run",
        "invalid signal",
        "unknown signal",
        "signal payload too deep",
        "signal payload too large",
        "secret in signal",
        "signal payload refused",
        "early signal refused",
        "nothing to resume",
        "invalid budgets",
        "unknown dispatch id",
        "stale attempt",
        "stale timer",
        "step already cancelled",
        "step already settled",
        "step skipped",
        "duplicate receipt",
        "heartbeat before acceptance",
        "heartbeat from a worker that does not hold the lease",
        "heartbeat does not extend the lease",
    }
)
MALFORMED = "malformed message"
START_REJECTED = "start rejected"
NOT_APPLICABLE = "receipt does not apply to the step"
OTHER = "other"
LABELS = FIXED | {MALFORMED, START_REJECTED, NOT_APPLICABLE, OTHER}

# texts with a value in them, by kind (decider._shape_problem, receipts.py)
_MALFORMED = re.compile(
    r"^(message is not a dict|unknown message type .*|\w+ without a run_id|\w+ without an integer ts_ms"
    r"|\w+\.\w+ must be \w+|\w+ without a positive lease_ms|\w+ timer without a step identity"
    r"|unknown timer kind .*)$",
    re.DOTALL,
)
_NOT_APPLICABLE = re.compile(r"^\w+ does not apply to a \w+ step$")
_START = re.compile(
    r"^(StartRun\.|run_id contains|definition|revision|input |budget|labels|parent|unknown budget|node "
    r"|every revision of |\S+@\d+ is deprecated)"
)


def dropped_reason(text: str) -> str:
    """The bounded label for a `Decision.dropped` text."""
    if text in FIXED:
        return text
    if _MALFORMED.match(text):
        return MALFORMED
    if _NOT_APPLICABLE.match(text):
        return NOT_APPLICABLE
    if _START.match(text):
        return START_REJECTED
    return OTHER
