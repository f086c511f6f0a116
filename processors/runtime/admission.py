"""What a decoded input must satisfy before it is folded (docs/contract.md), and the words
that say why not. Pure helpers: `fold.py` acts on their answers.

- **Partition.** A command or receipt is folded only on the partition that owns its run id
  (`murmur2(run_id) % partitions`, processors/kafka/partitioning.py). One that another
  partitioner put elsewhere (librdkafka's CRC32 default, sarama's FNV-1a, round-robin) is
  forwarded, in the same transaction as its offset, to the owner, byte for byte with its
  headers and record timestamp, plus a `runfold.forwarded-from` header naming where it
  landed. Folding it where it landed would start a second run with the same id on another
  partition (two runs, one id; a cancel that misses it), and rejecting it would turn every
  non-Java client's default into an error.
- **Time.** The engine's clock is the input's `ts_ms`. It must lie within `past_ms` before
  and `future_ms` after the record's Kafka timestamp (CreateTime, set by the producer's
  Kafka client, or LogAppendTime: either is in the log, so a replayed input is judged the
  same way). A command outside is rejected `InvalidInput` with both times and a hint at the
  unit; a receipt (an attempt's outcome, which must count) is folded with the record
  timestamp as its time instead. Seconds for milliseconds are 50 years off, an hour-ahead
  clock is an hour off: both are caught, and a run's times stay within a few minutes of the
  broker's log.
- **json fields.** Text that is not JSON in a decodable record (schemas.InvalidJsonField):
  a command is rejected `InvalidInput` naming the field, a terminal receipt fails its
  attempt `InvalidOutput` (not retryable: the executor sent what it had).
"""

from __future__ import annotations

import datetime
from typing import Any

import orjson

FORWARDED_HEADER = "runfold.forwarded-from"
# ts_ms may be this much older than the record timestamp: a command built, then held in an
# outbox or a producer's retry queue for a while (librdkafka's message.timeout.ms is 5 min).
TS_PAST_MS = 15 * 60_000
# ... and this much newer: only the skew between the clock that stamped ts_ms and the one that
# stamped the record (the same host's, or the broker's for LogAppendTime topics).
TS_FUTURE_MS = 60_000


def key_text(key: bytes | None) -> str:
    """A record key as any reader sees it: a JSON string of its UTF-8 text, else its hex."""
    if key is None:
        return "(none)"
    try:
        return orjson.dumps(key.decode()).decode()
    except UnicodeDecodeError:
        return f"0x{key.hex()} (not UTF-8)"


def forwarded_from(headers: list[tuple[str, bytes | None]] | None) -> str | None:
    """Where a record forwarded by a processor first landed (`topic:partition:offset`), if it was."""
    for name, value in headers or ():
        if name == FORWARDED_HEADER:
            return (value or b"").decode(errors="replace")
    return None


def _iso(ms: int) -> str:
    try:
        return (
            datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")[:-6]
            + "Z"
        )
    except (OverflowError, OSError, ValueError):
        return "out of range"


def _unit_hint(ts_ms: int, record_ts: int) -> str:
    if ts_ms <= 0:
        return ""
    for factor, unit in ((1000, "seconds"), (1 / 1000, "microseconds"), (1 / 1_000_000, "nanoseconds")):
        if abs(ts_ms * factor - record_ts) <= max(TS_PAST_MS, abs(record_ts) // 100):
            return f" (it looks like {unit})"
    return ""


def implausible_time(
    ts_ms: int, record_ts: int, past_ms: int = TS_PAST_MS, future_ms: int = TS_FUTURE_MS
) -> str | None:
    """Why `ts_ms` cannot be the time of a record whose Kafka timestamp is `record_ts`, or None."""
    if record_ts <= 0 or record_ts - past_ms <= ts_ms <= record_ts + future_ms:
        return None
    diff = ts_ms - record_ts
    how = f"{abs(diff) / 1000:,.0f} s {'after' if diff > 0 else 'before'}"
    return (
        f"ts_ms {ts_ms} ({_iso(ts_ms)}) is {how} the record's Kafka timestamp {record_ts} ({_iso(record_ts)})"
        f"{_unit_hint(ts_ms, record_ts)}; ts_ms is milliseconds since the Unix epoch (UTC), at most "
        f"{past_ms // 60_000} min before and {future_ms // 1000} s after the record timestamp"
    )


def json_problem(fields: list[tuple[str, str]], mtype: str) -> str:
    return "; ".join(
        f"{mtype}.{path} is not valid JSON text ({why}); json fields hold UTF-8 JSON text"
        for path, why in fields
    )


_TERMINAL_WITH_JSON = frozenset({"ActivationCompleted", "ChildRunFinished"})


def failed_instead(msg: dict[str, Any], reason: str) -> dict[str, Any] | None:
    """What a terminal receipt whose json is not JSON is folded as: its attempt failing
    `InvalidOutput`, not retryable (the executor sent what it had). None for other receipts."""
    mtype = msg["type"]
    if mtype not in _TERMINAL_WITH_JSON:
        return None
    if mtype == "ChildRunFinished":
        return {
            **msg,
            "status": "failed",
            "output": None,
            "failure": {
                "code": "InvalidOutput",
                "message": reason,
                "retryable": False,
                "node": None,
                "lineage": None,
            },
        }
    return {
        **msg,
        "type": "ActivationFailed",
        "code": "InvalidOutput",
        "message": reason,
        "retryable": False,
        "output": None,
    }
