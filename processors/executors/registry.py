"""Action name -> handler: what a worker can run. Its own module, so that the built-in
actions (builtin.py) and the SDK (sdk.py) that includes them both build on it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Handler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    fn: Handler
    is_async: bool


class ActionRegistry:
    """Action name -> handler. Names are unique within a registry."""

    def __init__(self) -> None:
        self._actions: dict[str, Action] = {}

    def register(self, name: str, fn: Handler) -> Action:
        if not name or not isinstance(name, str):
            raise ValueError("an action needs a non-empty string name")
        if name in self._actions and self._actions[name].fn is not fn:
            raise ValueError(f"action {name!r} is already registered")
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) < 2:
            raise TypeError(f"action {name!r}: handler must take (ctx, input), got {fn!r}")
        entry = Action(name, fn, inspect.iscoroutinefunction(fn))
        self._actions[name] = entry
        return entry

    def action(self, name: str) -> Callable[[Handler], Handler]:
        def decorate(fn: Handler) -> Handler:
            self.register(name, fn)
            return fn

        return decorate

    def get(self, name: str) -> Action | None:
        return self._actions.get(name)

    def names(self) -> list[str]:
        return sorted(self._actions)

    def merge(self, other: ActionRegistry) -> None:
        for entry in other._actions.values():
            self.register(entry.name, entry.fn)
