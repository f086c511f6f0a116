"""Build a JSON value that satisfies a JSON Schema, deterministically from a seeded RNG.

Used by the local agent provider: the same prompt (seed) and schema always give the same
value. Covers the keywords structured-output schemas use in practice: type (also lists),
const, enum, properties / required / additionalProperties / min-maxProperties, items /
prefixItems / min-maxItems / uniqueItems, min-maxLength, format (date-time, date, time,
email, uri, uuid, ipv4, hostname), minimum / maximum / exclusive bounds / multipleOf,
allOf (merged), anyOf / oneOf (first branch that validates), local `$ref`s. `pattern` is
not generated: a schema that needs it may come back invalid, and the caller validates.
"""

from __future__ import annotations

import math
import random
import re
import uuid
from typing import Any

from jsonschema import Draft202012Validator

MAX_DEPTH = 8
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*")


def prompt_words(text: str) -> list[str]:
    words = [w.lower() for w in _WORD.findall(text)]
    return words or ["local"]


class InstanceBuilder:
    def __init__(self, root: dict[str, Any], rng: random.Random, words: list[str]) -> None:
        self.root = root
        self.rng = rng
        self.words = words

    def build(self, schema: Any, depth: int = 0) -> Any:
        if schema is True or schema is None or schema == {}:
            return self._string({}) if depth == 0 else self.rng.choice(self.words)
        if schema is False or not isinstance(schema, dict):
            return None
        if "$ref" in schema:
            target = self._deref(schema["$ref"])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return self.build({**target, **rest} if rest else target, depth)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return self.rng.choice(schema["enum"])
        if "allOf" in schema:
            return self.build(self._merge_all(schema), depth)
        for key in ("oneOf", "anyOf"):
            if schema.get(key):
                return self._choose_branch(schema, key, depth)
        kind = self._type(schema)
        if depth >= MAX_DEPTH and kind in ("object", "array"):
            return {} if kind == "object" else []
        return (
            getattr(self, "_" + kind)(schema, depth)
            if kind in ("object", "array")
            else getattr(self, "_" + kind)(schema)
        )

    # ------------------------------------------------------------------ composition

    def _deref(self, ref: str) -> dict[str, Any]:
        if not ref.startswith("#"):
            return {}
        node: Any = self.root
        for part in ref.lstrip("#").split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, dict) else {}

    def _merge_all(self, schema: dict[str, Any]) -> dict[str, Any]:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, dict) and "$ref" in part:
                part = self._deref(part["$ref"])
            if not isinstance(part, dict):
                continue
            for key, value in part.items():
                if key == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **value}
                elif key == "required":
                    merged["required"] = sorted(set(merged.get("required", [])) | set(value))
                else:
                    merged.setdefault(key, value)
        return merged

    def _choose_branch(self, schema: dict[str, Any], key: str, depth: int) -> Any:
        base = {k: v for k, v in schema.items() if k not in ("oneOf", "anyOf")}
        candidate: Any = None
        for branch in schema[key]:
            candidate = self.build({**base, **branch} if isinstance(branch, dict) else branch, depth)
            if self._valid(schema, candidate):
                return candidate
        return candidate

    def _valid(self, schema: dict[str, Any], value: Any) -> bool:
        """Validate against a sub-schema, carrying the root's definitions for local `$ref`s."""
        wrapper = dict(schema)
        for key in ("$defs", "definitions"):
            if key in self.root and key not in wrapper:
                wrapper[key] = self.root[key]
        try:
            return bool(Draft202012Validator(wrapper).is_valid(value))
        except Exception:  # an unresolvable or odd schema: let the caller's validation decide
            return True

    def _type(self, schema: dict[str, Any]) -> str:
        declared = schema.get("type")
        if isinstance(declared, list):
            non_null = [t for t in declared if t != "null"]
            declared = non_null[0] if non_null else "null"
        if isinstance(declared, str):
            return declared
        if "properties" in schema or "required" in schema or "additionalProperties" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
            return "number"
        return "string"

    # ------------------------------------------------------------------ types

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties") or {}
        required = [k for k in schema.get("required", []) if isinstance(k, str)]
        out: dict[str, Any] = {}
        for key in required:
            out[key] = self.build(props.get(key, {}), depth + 1)
        max_props = schema.get("maxProperties", math.inf)
        for key in props:
            if key not in out and len(out) < max_props and self.rng.random() < 0.5:
                out[key] = self.build(props[key], depth + 1)
        extra = schema.get("additionalProperties", True)
        n = 0
        while len(out) < schema.get("minProperties", 0) and n < 64:
            optional = [k for k in props if k not in out]
            if optional:
                out[optional[0]] = self.build(props[optional[0]], depth + 1)
            elif extra is not False:
                out[f"{self.rng.choice(self.words)}_{n}"] = self.build(
                    extra if isinstance(extra, dict) else {}, depth + 1
                )
            n += 1
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", {})
        low = max(schema.get("minItems", 1 if items is not False else 0), 0)
        high = schema.get("maxItems", max(low, 3))
        count = max(low, min(high, self.rng.randint(1, 3)))
        if items is False:
            count = min(count, len(prefix))
        out: list[Any] = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else (items if isinstance(items, dict) else {})
            value = self.build(sub, depth + 1)
            if schema.get("uniqueItems"):
                for _ in range(8):
                    if value not in out:
                        break
                    value = self.build(sub, depth + 1)
                if value in out:
                    continue
            out.append(value)
        return out

    def _string(self, schema: dict[str, Any]) -> str:
        fmt = schema.get("format")
        value = {
            "date-time": "2025-01-01T00:00:00Z",
            "date": "2025-01-01",
            "time": "12:00:00Z",
            "email": f"{self.rng.choice(self.words)}@example.com",
            "uri": f"https://example.com/{self.rng.choice(self.words)}",
            "uuid": str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
            "ipv4": f"10.0.0.{self.rng.randint(1, 254)}",
            "hostname": f"{self.rng.choice(self.words)}.example.com",
        }.get(fmt or "")
        if value is None:
            value = " ".join(self.rng.choice(self.words) for _ in range(self.rng.randint(1, 4)))
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        while len(value) < low:
            value += " " + self.rng.choice(self.words)
        if high is not None and len(value) > high:
            cut = value[:high]
            stripped = cut.rstrip()  # a trailing space reads badly, but minLength wins
            value = stripped if stripped and len(stripped) >= low else cut
        return value

    def _bounds(self, schema: dict[str, Any], integer: bool) -> tuple[float, float]:
        low = schema.get("minimum", -math.inf)
        high = schema.get("maximum", math.inf)
        step = 1 if integer else 0.01
        if "exclusiveMinimum" in schema:
            low = max(low, schema["exclusiveMinimum"] + step)
        if "exclusiveMaximum" in schema:
            high = min(high, schema["exclusiveMaximum"] - step)
        if low == -math.inf and high == math.inf:
            low, high = 0, 100
        elif low == -math.inf:
            low = high - 100
        elif high == math.inf:
            high = low + 100
        return low, high

    def _integer(self, schema: dict[str, Any]) -> int:
        low, high = self._bounds(schema, integer=True)
        lo, hi = math.ceil(low), math.floor(high)
        mult = schema.get("multipleOf")
        if isinstance(mult, int) and mult > 0:
            first = math.ceil(lo / mult)
            last = max(first, math.floor(hi / mult))
            return self.rng.randint(first, last) * mult
        return self.rng.randint(lo, max(lo, hi))

    def _number(self, schema: dict[str, Any]) -> float | int:
        if isinstance(schema.get("multipleOf"), int):
            return self._integer(schema)
        low, high = self._bounds(schema, integer=False)
        value = round(self.rng.uniform(low, high), 2)
        return min(max(value, low), high)

    def _boolean(self, schema: dict[str, Any]) -> bool:
        return self.rng.random() < 0.5

    def _null(self, schema: dict[str, Any]) -> None:
        return None


def build_instance(schema: dict[str, Any], rng: random.Random, words: list[str]) -> Any:
    return InstanceBuilder(schema, rng, words).build(schema)
