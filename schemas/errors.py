"""What the codec raises: bytes that are not a record of a topic's contract, and messages
that do not fit it. Their own module, so that the registry framing (registry.py) and the
codec share them without importing each other."""

from __future__ import annotations

from typing import Any


class DecodeError(ValueError):
    """Bytes that are not a record of this topic's contract."""

    def __init__(self, reason: str, topic_kind: str = "") -> None:
        super().__init__(f"cannot decode {topic_kind or 'record'}: {reason}")
        self.reason = reason
        self.topic_kind = topic_kind


class InvalidJsonField(DecodeError):
    """The record decodes, but json fields hold text that is not JSON. `message` is the flat
    message with those fields set to None; `fields` lists (path, what is wrong) with paths
    relative to the message (`input`, `agent.prompt`) and orjson's words for what is wrong."""

    def __init__(self, topic_kind: str, message: dict[str, Any], fields: list[tuple[str, str]]) -> None:
        super().__init__(
            "; ".join(f"invalid JSON text in json field {path} ({why})" for path, why in fields), topic_kind
        )
        self.message = message
        self.fields = fields


class EncodeError(ValueError):
    """A message that does not fit its schema."""

    def __init__(self, reason: str, topic_kind: str, record_type: str | None, field: str | None) -> None:
        where = f"{record_type}.{field}" if field else (record_type or "message")
        super().__init__(f"cannot encode {topic_kind} {where}: {reason}")
        self.reason = reason
        self.topic_kind = topic_kind
        self.record_type = record_type
        self.field = field
