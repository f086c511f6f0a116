"""Confluent Schema Registry framing (`00` + 4-byte big-endian schema id + Avro body).

Thin on purpose: the codec does all Avro work; this only registers the topic
schemas (subject = the record's full name, i.e. RecordNameStrategy, because the
codec works per topic kind and every envelope has its own name) and fetches
writer schemas by id. Registry outages raise the client's own error (not a
DecodeError): the bytes are not at fault, and must not be dead-lettered.
"""

from __future__ import annotations

from typing import Any

import orjson

from schemas.errors import DecodeError


def confluent_header(schema_id: int) -> bytes:
    if not 0 <= schema_id < 2**32:
        raise ValueError(f"schema id {schema_id} does not fit in 4 bytes")
    return b"\x00" + schema_id.to_bytes(4, "big")


class RegistryFraming:
    def __init__(self, url: str | None, client: Any = None) -> None:
        if client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            client = SchemaRegistryClient({"url": url})
        self.client = client
        self._schemas: dict[int, dict[str, Any]] = {}

    def header(self, subject: str, schema: dict[str, Any]) -> bytes:
        """Register `schema` under `subject` (idempotent) and return the framing header."""
        from confluent_kafka.schema_registry import Schema

        schema_id = self.client.register_schema(subject, Schema(orjson.dumps(schema).decode(), "AVRO"))
        self._schemas[schema_id] = schema
        return confluent_header(schema_id)

    def writer_schema(self, schema_id: int) -> dict[str, Any]:
        found = self._schemas.get(schema_id)
        if found is not None:
            return found
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self.client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise DecodeError(f"unknown schema registry id {schema_id}") from None
            raise
        if registered.schema_type not in (None, "AVRO"):
            raise DecodeError(f"schema registry id {schema_id} is {registered.schema_type}, not AVRO")
        try:
            schema: dict[str, Any] = orjson.loads(registered.schema_str)
        except orjson.JSONDecodeError:
            raise DecodeError(f"schema registry id {schema_id} is not JSON") from None
        self._schemas[schema_id] = schema
        return schema
