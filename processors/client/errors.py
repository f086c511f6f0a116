"""Typed errors raised by the runfold client SDK.

Every error says what was wrong and where; none carries a payload or a secret.
"""

from __future__ import annotations

from processors.engine.errors import Issue


class RunfoldError(Exception):
    """Base class of every error the client raises."""


class InvalidArgument(RunfoldError, ValueError):
    """An argument the client refuses before sending anything: an empty or unprintable run id,
    an empty signal name, a bad RUNFOLD_ANSWER_TIMEOUT_S. A ValueError too, as it always was."""


class BrokerUnavailable(RunfoldError):
    """The Kafka cluster cannot serve the call now: no broker answered at the configured
    bootstrap servers, or it is failing over (a broker down, a leader or coordinator moving)
    for longer than the call's timeout. Retry; commands are idempotent by run id."""


class RunfoldTimeout(RunfoldError):
    """An operation did not finish within its timeout."""


class UnknownDefinition(RunfoldError):
    """The definition (or the requested revision) is not registered on the definitions topic."""

    def __init__(self, definition_id: str, revision: int | None, known: list[int] | None = None) -> None:
        self.definition_id = definition_id
        self.revision = revision
        self.known_revisions = known or []
        if revision is None:
            msg = f"definition {definition_id!r} is not registered"
        else:
            msg = f"definition {definition_id!r} revision {revision} is not registered"
        if self.known_revisions:
            msg += f" (registered revisions: {', '.join(map(str, self.known_revisions))})"
        super().__init__(msg)


class InvalidDefinition(RunfoldError):
    """A definition file or dict failed validation; the message names the source, path and rule."""

    def __init__(
        self, source: str, detail: str, issues: list[Issue] | None = None, definition: str | None = None
    ) -> None:
        self.source = source
        self.detail = detail
        self.issues = list(issues or [])  # each finding (path, message, rule), when known
        self.definition = definition  # id@revision as the source gives them, when it does
        super().__init__(f"{source}: {detail}")


class DefinitionConflict(RunfoldError):
    """The same id@revision is already registered with different content (definitions are immutable)."""


class RunNotFound(RunfoldError):
    """No run with this id is known (no snapshot, no events)."""


class RunRejected(RunfoldError):
    """The processor rejected the command (RunRejected event): code and reason say why."""

    def __init__(self, run_id: str, code: str, reason: str) -> None:
        self.run_id = run_id
        self.code = code
        self.reason = reason
        super().__init__(f"run {run_id!r} rejected: {code}: {reason}")


class CommandRejected(RunRejected):
    """The processor answered this command (matched on its record id) with a `RunRejected`:
    `.code` (a Failure code: InvalidInput, NotFound, Conflict, Limit, ...), `.reason`, and which
    `.command` / `.record_id` it was. A subclass of `RunRejected`, so one `except` catches both."""

    def __init__(self, run_id: str, command: str, record_id: str, code: str, reason: str) -> None:
        self.command = command
        self.record_id = record_id
        super().__init__(run_id, code, reason)
        self.args = (f"{command} to run {run_id!r} rejected: {code}: {reason}",)


class AnswerTimeout(RunfoldTimeout):
    """The command is durable on the broker, but no processor answered it within the wait
    (none is running for this prefix, or it is far behind). The answer may still come."""

    def __init__(self, run_id: str, command: str, record_id: str, message: str) -> None:
        self.run_id = run_id
        self.command = command
        self.record_id = record_id
        super().__init__(message)
