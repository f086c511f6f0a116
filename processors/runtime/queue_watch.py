"""A warning and a gauge when a queue the processor dispatches to has no consumer (issue 24:
"a queue with no worker leaves steps scheduled with no hint").

An activation waits durably on its queue's topic until a worker takes it, so a missing worker
shows only as runs that stay `scheduled`. Every `every_s` a thread of its own asks the brokers
which topics some live consumer group member is assigned (topology/consumers.py: one
ListGroups and one DescribeGroups, read-only). A queue this processor has produced activations
to since it started and that nobody consumes is `runfold_processor_queue_unconsumed{queue}` 1
and logged once as a warning naming the command that serves it; it is 0 (logged once) when a
consumer is back. Off the loop thread: the admin calls can take seconds on a busy cluster.
"""

from __future__ import annotations

import threading
from logging import Logger

from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.settings import ProcessorSettings
from topology.consumers import unconsumed_queues

EVERY_S = 30.0


class QueueWatch:
    def __init__(
        self, settings: ProcessorSettings, metrics: ProcessorMetrics, log: Logger, every_s: float = EVERY_S
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._log = log
        self._every_s = every_s
        self._topics = {q: settings.topics.activations(q) for q in settings.activation_queues}
        self.unconsumed: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runfold-queue-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1)  # a look in progress may wait on the cluster: it is a daemon

    def _run(self) -> None:
        # The first look after a whole interval: workers are often started after the processor.
        while not self._stop.wait(self._every_s):
            self.check()

    def check(self) -> set[str]:
        """Look once; the queues dispatched to that no consumer is assigned."""
        out = self._metrics.records_out
        dispatched = [q for q, topic in self._topics.items() if out.labels(topic)._value.get() > 0]
        try:
            missing = set(unconsumed_queues(self._settings, dispatched)) if dispatched else set()
        except Exception as e:  # the cluster is busy or away: the loop's own errors say more
            self._log.debug("queue consumers not known", extra={"error": str(e)})
            return self.unconsumed
        for queue in self._topics:
            self._metrics.queue_unconsumed.labels(queue).set(1 if queue in missing else 0)
        for queue in sorted(missing - self.unconsumed):
            self._log.warning(
                f"activations are dispatched to queue {queue!r} but no worker consumes it: its steps "
                f"stay scheduled until one does (`runfold worker --queue {queue} --module MODULE`)",
                extra={"queue": queue, "topic": self._topics[queue]},
            )
        for queue in sorted(self.unconsumed - missing):
            self._log.info(f"queue {queue!r} is consumed again", extra={"queue": queue})
        self.unconsumed = missing
        return missing
