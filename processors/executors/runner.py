"""The worker's consume loop: activations in, handlers run concurrently, receipts out.

One asyncio loop owns all state (no locks): it polls the consumer without blocking,
starts handlers (async ones as tasks on this loop, sync ones in a thread pool), sends
receipts with an idempotent producer, and commits offsets.

- Admission: at most `concurrency` handlers run; up to `backlog` more activations wait in a
  local backlog (so a CancelActivation behind them is still read, and a waiting one is
  cancelled without running). With running + waiting == concurrency + backlog the worker
  stops taking records; if that lasts PAUSE_AFTER_S the assigned partitions are paused
  (so the client stops prefetching); below it they are resumed. (While paused, a cancel notice waits
  in Kafka like any record: it reaches its handler once a slot frees.)
- A slot is held until the terminal receipt is acknowledged by the broker; only then is
  the activation's offset marked done. Offsets commit at the per-partition low watermark
  (`offsets.OffsetTracker`), so a crash re-delivers every activation whose receipt might
  be lost, and never skips one.
- Leases: ActivationAccepted (lease_ms) at start, ActivationHeartbeat every heartbeat_ms
  while the handler runs. A cancel notice or the deadline sets `ctx.cancelled`; an async
  handler that ignores it is cancelled (task.cancel) after `cancel_grace_ms`; a sync one
  cannot be interrupted, and its receipt waits for it (only a confirmed stop settles).
- SIGTERM/SIGINT: stop reading, let in-flight handlers finish for `drain_timeout_ms`,
  then signal them to stop, send the receipts, commit, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, Producer

from processors.executors import log_redaction, receipts, stop_watch
from processors.executors.agents.structured import ProviderRouter
from processors.executors.agents.tool_turn import run_agent_activation
from processors.executors.context import ActionContext
from processors.executors.errors import ActionError, Cancelled
from processors.executors.inflight import Entry, now_ms
from processors.executors.metrics import WorkerMetrics
from processors.executors.offsets import OffsetTracker
from processors.executors.receipt_delivery import ReceiptDelivery
from processors.executors.redaction import known_redactor
from processors.executors.registry import Action
from processors.executors.secrets import SecretResolver, SecretsPolicy, SecretStore
from processors.executors.settings import WorkerSettings
from processors.executors.tracebacks import log_handler_failure
from processors.executors.worker_group import WorkerGroup
from processors.kafka.exits import ExitCode
from processors.kafka.fetch import connect_first, first_then_buffered
from processors.kafka.records import coordinates
from processors.metrics_endpoint import CannotServe
from processors.service_logs import ClusterUnreachable, StopRequested, await_cluster, kafka_log
from schemas import Codec, DecodeError
from topology.admin import topic_max_message_bytes
from topology.catalog import TopicNames
from topology.settings import KafkaSettings, load_settings, producer_config

log = logging.getLogger("runfold.worker")
TICK_S = 0.02
_RECEIPT_MARGIN = 1024  # record and batch overhead under a size limit
IDLE_POLL_S = 0.01  # an idle worker blocks up to this long in the consumer (an activation wakes it)
FLUSH_WHEN_IDLE_S = 0.001  # longest an otherwise idle loop waits in flush() for its receipts' delivery
LIGHT_LOAD_PER_S = 1000  # activations/s below which an idle loop flushes receipts instead of lingering
MAX_ACTION_LABELS = 1000  # distinct metric labels for action/agent names; past it: "(other)"


class ServedWorker(Protocol):
    """What the runner serves (sdk.Worker): its settings, secrets and actions."""

    settings: WorkerSettings
    secrets: SecretStore

    def lookup(self, name: str) -> Action | None: ...

    def action_names(self) -> list[str]: ...


class WorkerRunner:
    """One worker, composed of its parts: the consumer in its group (worker_group.py), receipts
    out and offsets committed (receipt_delivery.py); admission, handlers, leases and drain are here."""

    def __init__(
        self, worker: ServedWorker, kafka: KafkaSettings | None = None, topic_prefix: str | None = None
    ) -> None:
        self.worker = worker
        self.settings = worker.settings
        self.kafka = kafka or load_settings()
        prefix = topic_prefix or self.kafka.topic_prefix
        self.names = TopicNames(prefix)
        self.topics = [self.names.activations(q) for q in self.settings.queues]
        self.group_id = self.settings.group_id(prefix)
        self.worker_id = f"{self.settings.name}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.codec = Codec.default()
        self.decode = self.codec.decoder("activations")
        self.encode_receipt = self.codec.encoder("receipts")
        self.router = ProviderRouter(self.settings.agents.model_copy(deep=True), worker.secrets)
        self.policy = SecretsPolicy(self.settings.secrets_policy)
        # Every value of the store is redacted from every log record of this process, resolved or not.
        worker.secrets.known_values()
        log_redaction.install()
        self.concurrency = self.settings.concurrency
        self.admission = self.concurrency + self.settings.backlog
        self.pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="runfold-action")
        self.running: dict[str, Entry] = {}  # dispatch_id -> started, not yet acknowledged
        self.executing = 0  # handlers running now (<= concurrency)
        # (run, node, lineage) -> handlers of that step running in this process. A newer attempt of a
        # step waits in the backlog while an older one still runs here: a worker frozen (SIGSTOP,
        # a long GC) past its lease comes back to the old attempt's cancel and the new attempt at
        # once, and must not run both (docs/semantics.md, "Stopping").
        self._in_handler: Counter[tuple[str, str, str]] = Counter()
        self.backlog: OrderedDict[str, Entry] = OrderedDict()  # dispatch_id -> waiting for a slot
        self.tracker = OffsetTracker()
        self.stopping = False
        self.counts = {"activations": 0, "completed": 0, "failed": 0, "cancelled": 0, "dead_letters": 0}
        self._last_tick = 0.0
        self._tick_records = 0  # activations read since the last tick
        self._light_load = True  # fewer than LIGHT_LOAD_PER_S activations/s in the last tick window
        self._loop: asyncio.AbstractEventLoop | None = None
        self.metrics = WorkerMetrics()
        self.metrics_port: int | None = None  # bound /metrics port once serving
        self._labels: dict[str, str] = {}  # action or agent name -> metric label
        self._queue_of = dict(zip(self.topics, self.settings.queues, strict=True))
        config = producer_config(self.kafka, client_id=self.worker_id)
        config["logger"] = kafka_log()  # librdkafka's lines through logging, repeats collapsed
        self._stop_event = threading.Event()  # set with `stopping`: ends the wait for the cluster
        self._batch_bytes = int(config["batch.size"])
        self.failed: str | None = None  # why the worker stopped itself (ExitCode.FATAL)
        self.delivery = ReceiptDelivery(
            self.settings,
            self.names,
            self.worker_id,
            self.metrics,
            self.tracker,
            self.encode_receipt,
            self.running,
            self.counts,
            Producer(config),
            int(config.get("message.max.bytes", 1_000_000)) - _RECEIPT_MARGIN,
            self._receipt_lost,
        )
        self.group = WorkerGroup(
            self.kafka,
            self.group_id,
            self.worker_id,
            self.topics,
            self.metrics,
            self.tracker,
            self.backlog,
            self.delivery,
            self.admission,
            self._load,
        )

    def _receipt_lost(self, why: str) -> None:
        """A terminal receipt the broker does not have and will not get: stop (exit 1), leaving
        its activation uncommitted for whoever reads it next."""
        self.failed = self.failed or why
        self.stopping = True

    # ------------------------------------------------------------------ lifecycle

    async def run(self, install_signals: bool = True) -> ExitCode:
        """Serve until SIGTERM/SIGINT, then drain; returns the exit code (`ExitCode`, docs/runtime.md)."""
        self._loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self.request_stop)
        log.info("worker %s starting (cluster %s)", self.worker_id, self.kafka.bootstrap_servers)
        idle = 0
        try:
            if self.settings.metrics_port is not None:
                try:
                    self.metrics_port = self.metrics.serve(
                        self.settings.metrics_port, self.settings.metrics_host
                    )
                except CannotServe as e:  # a port in use: configuration, not a crash to restart
                    log.error("worker %s stopped: %s", self.worker_id, e)
                    return ExitCode.CONFIG
            try:
                await asyncio.to_thread(
                    await_cluster,
                    self.delivery.producer,
                    self.kafka.bootstrap_servers,
                    self.settings.connect_timeout_ms / 1000,
                    self._stop_event,
                    self.names.receipts,
                )
            except StopRequested:
                return ExitCode.OK
            except ClusterUnreachable as e:
                log.error("worker %s stopped: %s", self.worker_id, e)
                return ExitCode.CONFIG
            await self._fit_receipts_topic()
            if self.stopping:  # asked to stop while the cluster was not answering yet
                return ExitCode.OK
            connect_first(
                self.delivery.producer, self.names.receipts
            )  # the first receipt does not wait for a producer id
            self.group.subscribe()
            log.info(
                "worker %s serving %s (group %s, actions %s, metrics port %s)",
                self.worker_id,
                self.topics,
                self.group_id,
                self.worker.action_names(),
                self.metrics_port,
            )
            while not self.stopping:
                busy = self._poll()
                self.group.check()
                busy |= self._start_backlog()
                self._tick()
                self.delivery.producer.poll(0)
                self.delivery.commit(self.group.consumer, force=False)
                self.group.backpressure()
                idle = 0 if busy else min(idle + 1, 2)
                if not busy and self._light_load and len(self.delivery.producer):
                    # Receipts wait up to linger.ms for company (batches under load). At light load
                    # with nothing else to do, send them now: flush ignores the linger while it waits
                    # (<= 1 ms, less once delivered). Was: +5 ms on every receipt at low load. Not
                    # under heavy load: the wait stalls the loop (-10-20 % activations/s).
                    self.delivery.producer.flush(FLUSH_WHEN_IDLE_S)
                    await asyncio.sleep(0)
                elif busy or not self.running:
                    await asyncio.sleep(0)  # idle: the next _poll blocks in the consumer
                else:
                    # Handlers running, nothing to read or send: back off to 4 ms (a poll is ~20 us
                    # of CPU; a longer sleep is added to the latency of the next activation).
                    await asyncio.sleep(0.001 * (2**idle))
            await self._drain()
        finally:
            await self._close()
            kafka_log().flush()
        if self.failed is not None:
            log.error("worker %s stopped: %s", self.worker_id, self.failed)
            return ExitCode.FATAL
        return ExitCode.OK

    async def _fit_receipts_topic(self) -> None:
        """Receipts and their batches must fit the receipts topic's `max.message.bytes`: the
        broker refuses a whole batch over it (librdkafka does not split one), small receipts
        with the large. Before anything is produced, so the producer can still be replaced.
        The lookup waits up to 30 s for a cluster that does not answer: it runs on a daemon
        thread so that SIGTERM/SIGINT meanwhile stops the worker at once."""
        box: list[int | None] = []
        errors: list[BaseException] = []
        looked_up = threading.Event()

        def look_up() -> None:
            try:
                box.append(topic_max_message_bytes(self.kafka, self.names.receipts))
            except BaseException as e:  # raised here, on the loop, as if called in place
                errors.append(e)
            finally:
                looked_up.set()

        threading.Thread(target=look_up, name="runfold-receipts-limit", daemon=True).start()
        while not looked_up.is_set():
            if self.stopping:
                return
            await asyncio.sleep(0.05)
        if errors:
            raise errors[0]
        limit = box[0]
        if limit is None or limit - _RECEIPT_MARGIN >= min(self._batch_bytes, self.delivery.receipt_limit):
            return
        fitted = limit - _RECEIPT_MARGIN
        self.delivery.producer = Producer(
            {
                **producer_config(self.kafka, client_id=self.worker_id, batch_size=fitted),
                "logger": kafka_log(),
            }
        )
        self._batch_bytes = fitted
        self.delivery.receipt_limit = min(self.delivery.receipt_limit, fitted)
        log.info(
            "receipts topic %s takes batches of at most %d bytes: receipts limited to %d bytes",
            self.names.receipts,
            limit,
            fitted,
        )

    def request_stop(self) -> None:
        if not self.stopping:
            log.info("worker %s: stop requested, draining", self.worker_id)
        self.stopping = True
        self._stop_event.set()

    async def _drain(self) -> None:
        self.backlog.clear()  # never started: uncommitted, so the next owner gets them
        deadline = time.monotonic() + self.settings.drain_timeout_ms / 1000
        while self.running and time.monotonic() < deadline:
            self._tick()
            self.delivery.producer.poll(0)
            self.delivery.commit(self.group.consumer, force=False)
            await asyncio.sleep(0.01)
        if self.running:
            log.warning(
                "worker %s: %d handlers still running after the drain timeout; stopping them",
                self.worker_id,
                len(self.running),
            )
            for entry in list(self.running.values()):
                self._signal(entry, "worker shutting down", "shutdown")
            deadline = time.monotonic() + (self.settings.cancel_grace_ms + 2000) / 1000
            while self.running and time.monotonic() < deadline:
                self._tick()
                self.delivery.producer.poll(0)
                await asyncio.sleep(0.01)
        self.delivery.producer.flush(10)
        self.delivery.commit(self.group.consumer, force=True, synchronous=True)
        self._flush_metrics()

    async def _close(self) -> None:
        for entry in self.running.values():
            if entry.task is not None and entry.is_async:
                entry.task.cancel()
        with contextlib.suppress(Exception):
            await self.router.aclose()
        http = self.worker.lookup("http.request")
        closer = getattr(getattr(http, "fn", None), "__self__", None) if http else None
        if closer is not None and hasattr(closer, "aclose"):
            await closer.aclose()
        self.delivery.producer.flush(10)
        with contextlib.suppress(Exception):
            self.group.consumer.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.metrics.close()

    # ------------------------------------------------------------------ consuming

    def _load(self) -> int:
        return len(self.running) + len(self.backlog)

    def _poll(self) -> bool:
        room = self.admission - self._load()
        if self.stopping or (room <= 0 and not self.group.paused):
            return False  # records wait in the client's fetch queue until there is room
        # While paused, a 1-record poll still serves rebalance callbacks and the poll interval.
        n = max(1, min(self.settings.poll_batch, room))
        if self.running or self.backlog or len(self.delivery.producer) or self.group.paused:
            msgs = self.group.consumer.consume(num_messages=n, timeout=0)
        else:
            # Nothing running or to send: block (briefly, the event loop waits meanwhile) until an
            # activation arrives. Was: non-blocking polls 1-4 ms apart, +2 ms on average per activation.
            msgs = first_then_buffered(self.group.consumer, n, IDLE_POLL_S)
        for msg in msgs:
            self._on_record(msg)
        return bool(msgs)

    def _on_record(self, msg: Message) -> None:
        err = msg.error()
        if err is not None:
            if err.fatal() or err.code() == KafkaError._FATAL:
                self.group.consumer_failed = f"fatal consumer error: {err.str()}"  # it fetches no more
            elif msg.topic() is None and "committed offsets" in err.str():
                self.group.consumer_failed = err.str()  # partitions left without a position (librdkafka#5586)
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
            return
        topic, partition, offset = coordinates(msg)
        tp = (topic, partition)
        self._tick_records += 1
        self.tracker.add(tp, offset)
        try:
            record = self.decode(msg.value())
        except DecodeError as exc:
            self._dead_letter(msg, tp, offset, str(exc))
            return
        kind = record.get("type")
        if kind == "CancelActivation":
            self._on_cancel(record)
            self.tracker.done(tp, offset)
            return
        dispatch = record["dispatch_id"]
        existing = self.running.get(dispatch) or self.backlog.get(dispatch)
        if existing is not None:  # redelivered while still running: settle both together
            existing.extra.append((tp, offset))
            self.metrics.count("redeliveries", "in_progress")
        elif dispatch in self.delivery.finished:  # settled before a crash/rebalance lost the commit
            self.tracker.done(tp, offset)
            self.metrics.count("redeliveries", "settled")
        else:
            self.counts["activations"] += 1
            label = self._label(record)
            self.metrics.count_activation(self._queue_of.get(tp[0], ""), label)
            self.backlog[dispatch] = Entry(record, tp, [offset], label=label)

    def _label(self, act: dict[str, Any]) -> str:
        """The metric label of an activation's action: its name if registered here, `agent:<name>`
        for agent steps, "(unknown)" otherwise (activations must not grow the label set unboundedly)."""
        if act.get("kind") == "agent":
            name = f"agent:{(act.get('agent') or {}).get('agent') or ''}"
        else:
            name = act.get("action") or ""
        label = self._labels.get(name)
        if label is None:
            if len(self._labels) >= MAX_ACTION_LABELS:
                return "(other)"
            known = name.startswith("agent:") or self.worker.lookup(name) is not None
            label = self._labels[name] = known_redactor().redact(name) if known else "(unknown)"
        return label

    def _on_cancel(self, record: dict[str, Any]) -> None:
        dispatch, reason = record["dispatch_id"], record.get("reason") or "cancelled"
        waiting = self.backlog.pop(dispatch, None)
        if waiting is not None:
            self.running[dispatch] = waiting  # holds a slot until its receipt is acknowledged
            self.delivery.send_terminal(
                waiting, receipts.cancelled(waiting.activation, self.worker_id, f"before start: {reason}")
            )
            return
        entry = self.running.get(dispatch)
        if entry is not None:
            stop_watch.requested(entry, now_ms())
            self._signal(entry, reason, "cancel")

    def _dead_letter(self, msg: Message, tp: tuple[str, int], offset: int, error: str) -> None:
        self.counts["dead_letters"] += 1
        self.metrics.count("dead_letters")
        log.error("undecodable activation at %s[%d]@%d: %s", tp[0], tp[1], offset, error)
        original = msg.value() or b""
        body: dict[str, Any] = {
            "record_id": f"{tp[0]}:{tp[1]}:{offset}",
            "ts_ms": now_ms(),
            "source_topic": tp[0],
            "source_partition": tp[1],
            "source_offset": offset,
            "key": msg.key(),
            "error": error[:2000],
            "original": original,
            "producer": self.worker_id,
        }
        if len(original) > self.delivery.receipt_limit // 2:  # the dead letter itself must fit the broker
            body["error"] = f"{body['error']} (original of {len(original)} bytes not kept)"[:2000]
            body["original"] = b""
        done = functools.partial(self._dead_letter_delivered, tp, offset)
        self.delivery.producer.produce(
            self.names.dead_letters, self.codec.encode("dead_letters", body), key=msg.key(), on_delivery=done
        )

    def _dead_letter_delivered(
        self, tp: tuple[str, int], offset: int, err: KafkaError | None, _msg: Message
    ) -> None:
        if err is not None:
            log.error("dead letter for %s[%d]@%d not delivered: %s", tp[0], tp[1], offset, err)
        self.tracker.done(tp, offset)

    # ------------------------------------------------------------------ running handlers

    def _start_backlog(self) -> bool:
        started = False
        if not self.backlog or self.executing >= self.concurrency or self.stopping:
            return False  # (the common case under load: no copy of the backlog)
        for dispatch in list(self.backlog):
            if self.executing >= self.concurrency or self.stopping:
                break
            entry = self.backlog[dispatch]
            if self._in_handler[_step_of(entry.activation)]:
                continue  # an older attempt of its step still runs here: it starts once that one ended
            del self.backlog[dispatch]
            self.running[dispatch] = entry
            self._start(entry)
            started = True
        return started

    def _start(self, entry: Entry) -> None:
        act = entry.activation
        dispatch = act["dispatch_id"]
        # The queue is the topic's it came from (not what the record says): the policy's queue rules
        # bind to the worker pool that serves the topic.
        resolver = SecretResolver(
            self.worker.secrets,
            act.get("capabilities") or (),
            self.policy,
            act.get("definition_id") or "",
            self._queue_of.get(entry.tp[0], ""),
        )
        ctx = ActionContext(
            act, resolver, self.worker_id, functools.partial(self._request_heartbeat, dispatch)
        )
        entry.ctx = ctx
        action: Action | None = None
        if act.get("kind") == "agent":
            if not act.get("agent"):
                self.delivery.send_terminal(
                    entry,
                    receipts.failed(
                        act, self.worker_id, "InvalidInput", "agent activation without an agent spec", False
                    ),
                )
                return
        else:
            action = self.worker.lookup(act.get("action") or "")
            if action is None:
                self.delivery.send_terminal(
                    entry,
                    receipts.failed(
                        act,
                        self.worker_id,
                        "UnknownReference",
                        f"action {act.get('action')!r} is not registered on workers of queues {self.settings.queues}",
                        False,
                    ),
                )
                return
            entry.is_async = action.is_async
        deadline = act.get("deadline_ms")
        if deadline is not None and now_ms() >= deadline:
            self.delivery.send_terminal(
                entry,
                receipts.failed(
                    act, self.worker_id, "Timeout", "activation deadline passed before start", True
                ),
            )
            return
        self.delivery.produce(act, receipts.accepted(act, self.worker_id))
        entry.next_heartbeat_ms = now_ms() + int(act.get("heartbeat_ms") or 5000)
        assert self._loop is not None
        self.executing += 1
        self._in_handler[_step_of(act)] += 1
        entry.task = self._loop.create_task(self._run_handler(entry, action))

    async def _run_handler(self, entry: Entry, action: Action | None) -> None:
        ctx = entry.ctx
        assert ctx is not None and self._loop is not None
        started = time.perf_counter()
        try:
            if action is None:
                output = await run_agent_activation(ctx, entry.activation["agent"], self.router)
            elif action.is_async:
                output = await action.fn(ctx, entry.activation.get("input"))
            else:
                output = await self._loop.run_in_executor(
                    self.pool, action.fn, ctx, entry.activation.get("input")
                )
            receipt = receipts.terminal_receipt(ctx, output=output)
        except asyncio.CancelledError:  # our hard cancel after the grace period
            receipt = receipts.terminal_receipt(
                ctx, error=ActionError("Cancelled", "handler task cancelled", True)
            )
        except Exception as exc:
            try:
                receipt = receipts.terminal_receipt(ctx, error=exc)
                log_handler_failure(
                    log, entry.label, entry.activation, exc, isinstance(exc, ActionError | Cancelled)
                )
            except Exception as broken:  # never leave a step without its receipt and its slot held
                log.error(
                    "action %s: its failure could not be described: %s", entry.label, type(broken).__name__
                )
                receipt = receipts.failed(
                    entry.activation,
                    self.worker_id,
                    "ExecutionFailed",
                    f"{type(exc).__name__} (its message could not be rendered)",
                    True,
                    ctx.usage_record(),
                )
        self.metrics.observe_handler(entry.label, time.perf_counter() - started)
        # The execution slot frees now; the admission slot (self.running) only once the broker has the receipt.
        self.executing -= 1
        step = _step_of(entry.activation)
        self._in_handler[step] -= 1
        if self._in_handler[step] <= 0:
            del self._in_handler[step]
        self.delivery.send_terminal(entry, receipt)

    def _signal(self, entry: Entry, reason: str, kind: str) -> None:
        if entry.ctx is None or entry.ctx.is_cancelled:
            return
        entry.ctx.signal_cancel(reason, kind)
        self.metrics.count("cancel_signals", kind)
        if entry.is_async and entry.task is not None:
            entry.hard_cancel_ms = now_ms() + self.settings.cancel_grace_ms

    def _request_heartbeat(self, dispatch: str) -> None:
        """From any thread (ctx.heartbeat())."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._heartbeat_now, dispatch)

    def _heartbeat_now(self, dispatch: str) -> None:
        entry = self.running.get(dispatch)
        if entry is not None and entry.task is not None and not entry.task.done():
            self._heartbeat(entry, now_ms())

    def _heartbeat(self, entry: Entry, now: int) -> None:
        entry.heartbeat_seq += 1
        self.delivery.produce(
            entry.activation, receipts.heartbeat(entry.activation, self.worker_id, entry.heartbeat_seq)
        )
        entry.next_heartbeat_ms = now + int(entry.activation.get("heartbeat_ms") or 5000)

    def _tick(self) -> None:
        """Heartbeats, deadlines and hard cancels, at most every TICK_S."""
        mono = time.monotonic()
        if mono - self._last_tick < TICK_S:
            return
        self._light_load = self._tick_records < LIGHT_LOAD_PER_S * (mono - self._last_tick)
        self._tick_records = 0
        self._last_tick = mono
        self._flush_metrics()
        now = now_ms()
        grace = self.settings.cancel_grace_ms
        for entry in stop_watch.unconfirmed(self.running.values(), now, grace):
            self.delivery.produce(
                entry.activation, stop_watch.unconfirmed_receipt(entry, self.worker_id, now)
            )
        for entry in list(self.running.values()):
            if entry.task is None or entry.task.done() or entry.ctx is None:
                continue
            deadline = entry.activation.get("deadline_ms")
            if deadline is not None and now >= deadline:
                self._signal(entry, "deadline passed", "deadline")
            if entry.hard_cancel_ms is not None and now >= entry.hard_cancel_ms:
                entry.hard_cancel_ms = None
                entry.task.cancel()
            # Past deadline + grace a stuck handler stops renewing its lease: the processor takes over.
            if deadline is not None and now >= deadline + grace:
                if not entry.lease_abandoned:
                    entry.lease_abandoned = True
                    self.metrics.count("leases_abandoned")
            elif now >= entry.next_heartbeat_ms:
                self._heartbeat(entry, now)

    def _flush_metrics(self) -> None:
        self.metrics.flush(self.executing, len(self.backlog), self.group.paused)


def _step_of(activation: dict[str, Any]) -> tuple[str, str, str]:
    """The step instance an activation is an attempt of."""
    return (activation["run_id"], activation["node"], activation["lineage"])


def run_worker(
    worker: ServedWorker, kafka: KafkaSettings | None = None, topic_prefix: str | None = None
) -> ExitCode:
    runner = WorkerRunner(worker, kafka, topic_prefix)
    return asyncio.run(runner.run())
