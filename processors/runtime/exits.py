"""Why the run processor stops, and the exit code `runfold processor` ends with."""

from __future__ import annotations

from confluent_kafka import KafkaError

EXIT_OK = 0
EXIT_FATAL = 2  # a fatal Kafka error, bad topology, a store failure: restart restores from the log
EXIT_FENCED = 3  # another instance took this instance id: do not restart in a loop
EXIT_STALLED = 4  # stuck inside a Kafka client call (watchdog): restart

# Errors that mean another instance with our transactional id or static member id runs.
FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                          KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.FENCED_INSTANCE_ID})


class ProcessorStopped(Exception):
    """The loop cannot go on (fenced, fatal Kafka error, bad topology, store failure)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
