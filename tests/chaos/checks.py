"""The one proof every chaos scenario ends with (read_committed, from the beginning).

    proof = prove("processor kill -9", settings, started=runs, garbage=coords, bad=bad_cmds)

Asserts, with a message naming the first offending runs/records:
- every run the scenario started was accepted, and every accepted run has exactly one
  terminal event (RunSucceeded | RunFailed | RunCancelled);
- each run's event sequence is 1, 2, 3, ... (no gap, no duplicate);
- no StepSucceeded is duplicated for a dispatch identity;
- every garbage record is in `<p>.dead-letters` with its source topic, partition and offset;
- every bad command has exactly one RunRejected for its run id, with a non-empty reason
  (and the expected code when one is given);
- `processors.replay.verify` (the `replay --verify` API) reports zero differences.

Each proof is also recorded (one summary line on stdout, the JSON in
benchmarks/results/chaos.json, and the pytest terminal summary).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError
from processor_support import assign_from_start

from processors.replay import verify
from schemas import Codec, DecodeError
from topology.settings import KafkaSettings, consumer_config

CODEC = Codec.default()
TERMINAL = frozenset({"RunSucceeded", "RunFailed", "RunCancelled"})
RESULTS: list[dict[str, Any]] = []  # every proof of this session, for the terminal summary
RESULTS_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "chaos.json"
Coord = tuple[str, int, int]  # (topic, partition, offset)


def read_all(settings: KafkaSettings, topic: str, kind: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every committed record of `topic`, decoded as `kind`, with _partition/_offset added."""
    c = Consumer(consumer_config(settings, f"chaos-check-{uuid.uuid4().hex[:8]}", enable_partition_eof=True))
    try:
        parts = assign_from_start(c, [topic])
        out: list[dict[str, Any]] = []
        eof: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(eof) < parts:
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end in {timeout:.0f}s")
            for m in c.consume(2000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                    continue
                eof.discard(m.partition())
                try:
                    rec = CODEC.decode(kind, m.value())
                except DecodeError as e:
                    raise AssertionError(
                        f"undecodable record in {topic} [{m.partition()}]@{m.offset()}: {e.reason}"
                    ) from None
                rec["_partition"], rec["_offset"] = m.partition(), m.offset()
                out.append(rec)
        return out
    finally:
        c.close()


@dataclass
class Proof:
    scenario: str
    runs_started: int = 0
    runs_accepted: int = 0
    runs_terminal: int = 0
    terminal_by_type: dict[str, int] = field(default_factory=dict)
    events: int = 0
    step_succeeded: int = 0
    retried_attempts: int = 0  # StepScheduled with attempt > 1 (lease expiries, retries)
    garbage_sent: int = 0
    dead_letters: int = 0
    bad_commands: int = 0
    rejections: int = 0
    replay_runs_checked: int = 0
    replay_differences: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"[chaos] {self.scenario}: started={self.runs_started} accepted={self.runs_accepted} "
            f"terminal={self.runs_terminal} {self.terminal_by_type} events={self.events} "
            f"step_succeeded={self.step_succeeded} retried_attempts={self.retried_attempts} "
            f"garbage={self.garbage_sent}->dead_letters={self.dead_letters} "
            f"bad={self.bad_commands}->rejected={self.rejections} replay_checked={self.replay_runs_checked} "
            f"replay_differences={self.replay_differences} {self.extra or ''}"
        )


def _first(items: Any, n: int = 5) -> list[Any]:
    return list(items)[:n]


def prove(
    scenario: str,
    settings: KafkaSettings,
    *,
    started: set[str],
    garbage: list[Coord] | None = None,
    bad: dict[str, str | None] | None = None,
    extra: dict[str, Any] | None = None,
) -> Proof:
    """`started`: run ids whose StartRun was valid; `bad`: run id -> expected rejection code (or None)."""
    t0 = time.monotonic()
    topics = settings.topic_prefix
    proof = Proof(
        scenario,
        runs_started=len(started),
        garbage_sent=len(garbage or []),
        bad_commands=len(bad or {}),
        extra=dict(extra or {}),
    )
    events = read_all(settings, f"{topics}.run-events", "run_events")
    proof.events = len(events)

    accepted = {e["run_id"] for e in events if e["type"] == "RunAccepted"}
    proof.runs_accepted = len(accepted)
    missing = started - accepted
    assert not missing, f"{len(missing)} started runs never accepted, e.g. {_first(sorted(missing))}"

    terminal = Counter(e["run_id"] for e in events if e["type"] in TERMINAL)
    proof.runs_terminal = len(terminal)
    proof.terminal_by_type = dict(Counter(e["type"] for e in events if e["type"] in TERMINAL))
    not_done = accepted - set(terminal)
    assert not not_done, (
        f"{len(not_done)} accepted runs without a terminal event, e.g. {_first(sorted(not_done))}"
    )
    twice = {r: n for r, n in terminal.items() if n != 1}
    assert not twice, f"{len(twice)} runs with more than one terminal event: {_first(twice.items())}"
    strays = set(terminal) - accepted
    assert not strays, f"terminal events of runs never accepted: {_first(strays)}"

    seqs: dict[str, list[int]] = {}
    for e in events:
        if e["sequence"]:
            seqs.setdefault(e["run_id"], []).append(e["sequence"])
    gaps = {r: s for r, s in seqs.items() if s != list(range(1, len(s) + 1))}
    assert not gaps, f"{len(gaps)} runs with a sequence gap or duplicate, e.g. {_first(gaps.items(), 2)}"

    succeeded = Counter(e["dispatch_id"] for e in events if e["type"] == "StepSucceeded")
    proof.step_succeeded = sum(succeeded.values())
    dup = {d: n for d, n in succeeded.items() if n > 1}
    assert not dup, f"{len(dup)} dispatch identities with more than one StepSucceeded: {_first(dup.items())}"
    proof.retried_attempts = sum(1 for e in events if e["type"] == "StepScheduled" and e["attempt"] > 1)

    if garbage:
        dead = read_all(settings, f"{topics}.dead-letters", "dead_letters")
        proof.dead_letters = len(dead)
        where = {(d["source_topic"], d["source_partition"], d["source_offset"]) for d in dead}
        lost = [g for g in garbage if g not in where]
        assert not lost, f"{len(lost)} garbage records not in the dead-letter topic, e.g. {_first(lost)}"
        no_reason = [d for d in dead if not d["error"]]
        assert not no_reason, f"dead letters without an error text: {_first(no_reason, 2)}"

    if bad:
        rejected: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            if e["type"] == "RunRejected":
                rejected.setdefault(e["run_id"], []).append(e)
        proof.rejections = sum(len(v) for v in rejected.values())
        wrong = []
        for run_id, code in bad.items():
            rs = rejected.get(run_id, [])
            if len(rs) != 1 or not rs[0]["reason"] or (code is not None and rs[0]["code"] != code):
                wrong.append((run_id, code, [(r["code"], r["reason"]) for r in rs]))
        others = {
            r: [(e["code"], e["reason"][:120]) for e in rs] for r, rs in rejected.items() if r not in bad
        }
        if others:
            proof.extra["other_rejections"] = dict(list(others.items())[:5])
        assert not (set(others) & started), f"valid starts rejected: {_first(set(others) & started)}"
        assert not wrong, (
            f"{len(wrong)} bad commands without exactly one RunRejected (run, expected code, got): "
            f"{_first(wrong)}"
        )

    report = verify(settings, timeout_s=120)
    proof.replay_runs_checked = report.runs_checked
    proof.replay_differences = len(report.differences)
    assert report.ok, (
        f"replay --verify: {len(report.differences)} differences, e.g. {_first(report.differences, 3)}"
    )
    # a finished run purged after its retention (its snapshot a tombstone) is counted apart
    if report.purged:
        proof.extra["replay_purged"] = report.purged
    assert report.runs_checked + report.purged == len(accepted), (
        f"replay --verify checked {report.runs_checked} of {len(accepted)} runs ({report.purged} purged)"
    )

    proof.seconds = round(time.monotonic() - t0, 1)
    record(proof)
    return proof


def record(proof: Proof) -> None:
    RESULTS.append(asdict(proof))
    print(proof.line(), flush=True)
    RESULTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_FILE.write_bytes(orjson.dumps({"scenarios": RESULTS}, option=orjson.OPT_INDENT_2))
