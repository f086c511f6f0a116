"""Adversarial review of the any-language contract, the client and the CLI against a real broker:
each test names the promise (doc file + section) it holds the code to."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from processor_support import (
    CODEC,
    DEFINITIONS,
    Commands,
    Reader,
    Responder,
    complete_all,
    make_settings,
    running,
    setup_topology,
    workflow,
)

from processors.kafka.partitioning import partition_for
from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]
RUNFOLD = Path(sys.executable).parent / "runfold"

WAITER = workflow(
    "waiter",
    {"w": {"kind": "wait", "signal": "go", "writes": {"w": {"from": "signal"}}}},
)


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", metrics_port=0)
    setup_topology(s, [*DEFINITIONS, WAITER])
    return s


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def command(run_id: str, body: dict[str, Any], **env: Any) -> dict[str, Any]:
    return {"run_id": run_id, "ts_ms": now_ms(), "record_id": uuid.uuid4().hex, **body, **env}


def start_body(input: Any = None, definition: str = "one") -> dict[str, Any]:
    return {"type": "StartRun", "definition_id": definition, "revision": None, "input": input or {}}


def other_partition(run_id: str, partitions: int) -> int:
    return (partition_for(run_id, partitions) + 1) % partitions


def nested(depth: int) -> Any:
    """A JSON value of exactly `depth` container levels (docs/semantics.md: a scalar is level 0,
    `[1]` level 1): {"a": [[...[0]...]]}."""
    value: Any = 0
    for _ in range(depth - 1):
        value = [value]
    return {"a": value}


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RUNFOLD), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def cli_env(settings: ProcessorSettings) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
    }


def assert_one_line_error(out: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """docs/client.md, The CLI: "Error messages are one line (never wrapped)", the documented exit
    code, no traceback."""
    shown = f"rc={out.returncode}\nstdout={out.stdout}\nstderr={out.stderr}"
    assert "Traceback" not in out.stderr, shown
    assert out.returncode == code, shown
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, shown
    for w in words:
        assert w in lines[0], shown


def assert_json_error(out: subprocess.CompletedProcess[str], code: int, *words: str) -> dict[str, Any]:
    """docs/client.md, The CLI: `--json` on every command, one JSON object per line."""
    shown = f"rc={out.returncode}\nstdout={out.stdout}\nstderr={out.stderr}"
    assert "Traceback" not in out.stderr, shown
    assert out.returncode == code, shown
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, shown
    doc = orjson.loads(lines[0])
    assert doc["ok"] is False and isinstance(doc["error"], str), shown
    for w in words:
        assert w in doc["error"], shown
    return doc


# ---- the CLI's errors ------------------------------------------------------------------------


def test_cli_run_id_with_a_control_character_is_a_one_line_usage_error(settings: ProcessorSettings) -> None:
    """docs/messages.md, Python representation: "the client refuses to send a command for one"
    (a run id with a control character); docs/client.md, The CLI: errors are one line, exit 2
    usage, `--json` on every command."""
    env = cli_env(settings)
    out = run("runs", "start", "one", "--input", "{}", "--run-id", "bad\x01id", env=env)
    assert_one_line_error(out, 2, "control character")
    out = run("runs", "start", "one", "--input", "{}", "--run-id", "bad\x01id", "--json", env=env)
    assert_json_error(out, 2, "control character")
    out = run("runs", "cancel", "bad\x02id", "--json", env=env)
    assert_json_error(out, 2, "control character")


def test_cli_empty_signal_name_and_bad_answer_timeout_env_are_one_line_errors(
    settings: ProcessorSettings,
) -> None:
    """docs/client.md, The CLI: "Error messages are one line (never wrapped)"; exit 2 is usage;
    `--answer-timeout` defaults to RUNFOLD_ANSWER_TIMEOUT_S."""
    env = cli_env(settings)
    assert_json_error(run("runs", "signal", "some-run", "", "--json", env=env), 2, "signal name")
    out = run("runs", "cancel", "some-run", "--json", env={**env, "RUNFOLD_ANSWER_TIMEOUT_S": "abc"})
    assert_json_error(out, 2, "RUNFOLD_ANSWER_TIMEOUT_S")


def test_cli_input_nested_deeper_than_orjson_can_write_is_a_one_line_error(
    settings: ProcessorSettings,
) -> None:
    """docs/semantics.md, Size limits / Nesting: a value nested deeper than max_json_depth is
    refused with a reason naming the limit; docs/client.md, The CLI: one-line errors, no
    traceback (here the client cannot even encode it: orjson stops at 255 levels)."""
    env = cli_env(settings)
    deep = "[" * 300 + "]" * 300
    out = run("runs", "start", "one", "--input", deep, "--no-wait", env=env)
    assert_one_line_error(out, 2, "input")
    out = run("runs", "start", "one", "--input", deep, "--no-wait", "--json", env=env)
    assert_json_error(out, 2, "input")


def test_cli_bad_json_argument_with_json_flag_prints_one_json_error(settings: ProcessorSettings) -> None:
    """docs/client.md, The CLI: "`--json` on every command (one JSON object per line)" and
    "Error messages are one line (never wrapped)"; exit 2 is usage."""
    env = cli_env(settings)
    assert_json_error(run("runs", "start", "one", "--input", "{bad", "--json", env=env), 2, "--input")
    out = run("runs", "signal", "r", "go", "--payload", "[1,", "--json", env=env)
    assert_json_error(out, 2, "--payload")
    assert_json_error(run("runs", "start", "one", "--label", "nokv", "--json", env=env), 2, "--label")
    # without --json: one line on stderr, not a box wrapped at 80 columns
    long_bad = '{"text": "' + "x" * 120 + '", oops}'
    assert_one_line_error(run("runs", "start", "one", "--input", long_bad, env=env), 2, "not valid JSON")


def test_cli_events_of_an_unknown_run_is_not_found(settings: ProcessorSettings) -> None:
    """docs/client.md, The CLI, exit codes: "`4` not found (definition, run, topic)"."""
    out = run("runs", "events", "never-started-run", "--json", env=cli_env(settings))
    assert out.returncode == 4, (out.returncode, out.stdout, out.stderr)
    assert orjson.loads(out.stdout.strip().splitlines()[-1])["ok"] is False


def test_topology_commands_without_a_broker_exit_3_in_one_line(settings: ProcessorSettings) -> None:
    """docs/client.md, exit codes: "`3` broker unavailable ... These are the one-shot commands'
    codes (`runs`, `defs`, `replay`, `topology`, ...)"; one-line errors; `--json` output."""
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix}
    out = run("topology", "verify", "--json", env=env, timeout=180)
    doc = orjson.loads(out.stdout.strip().splitlines()[-1])
    assert doc["ok"] is False and doc["error_type"] == "BrokerUnavailable", doc
    assert out.returncode == 3, (out.returncode, out.stdout)
    assert len(out.stderr.splitlines()) <= 1, f"{len(out.stderr.splitlines())} lines on stderr"


def test_cli_broker_errors_never_show_the_sasl_password(settings: ProcessorSettings) -> None:
    """README, Running on a real cluster: "Secret values are never logged"; docs/security.md."""
    secret = "Sup3r-S3cret-Pw-" + uuid.uuid4().hex[:8]
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        "RUNFOLD_CLIENT_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "RUNFOLD_CLIENT_SASL_MECHANISM": "PLAIN",
        "RUNFOLD_CLIENT_SASL_USERNAME": "user",
        "RUNFOLD_CLIENT_SASL_PASSWORD": secret,
    }
    for args in (("runs", "get", "x", "--json"), ("runs", "start", "one", "--input", "{}"), ("defs", "list")):
        out = run(*args, env=env)
        assert out.returncode == 3, (args, out.returncode, out.stdout, out.stderr)
        assert secret not in out.stdout + out.stderr, args


# ---- a foreign producer's records ------------------------------------------------------------


def test_foreign_garbage_is_dead_lettered_and_the_processor_keeps_folding(
    settings: ProcessorSettings,
) -> None:
    """docs/contract.md, What answers a command: "A command that cannot be decoded at all (wrong
    framing, unknown fingerprint, a truncated body, a key that is not its run id) gets no event:
    it goes to <p>.dead-letters ... Reasons: undecodable, null_value, key_mismatch"; keys shown
    as JSON strings, or as hex when not UTF-8. Framing: a registry-framed record without a
    registry is dead-lettered. Schema version other than 1 is dead-lettered."""
    cmd = Commands(settings)
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    events = Reader(settings, [settings.topics.run_events], "run_events")
    good = CODEC.encode("commands", command("g-trunc", start_body()))
    fp = CODEC.fingerprint("commands")
    cases: dict[bytes | None, tuple[bytes | None, str]] = {
        b"g-null": (None, "null_value"),
        b"g-trunc": (good[: len(good) // 2], "undecodable"),
        b"g-fp": (b"\xc3\x01" + b"\x00" * 8 + good[10:], "undecodable"),
        b"g-confluent": (b"\x00" + struct.pack(">I", 7) + good[10:], "undecodable"),
        b"g-random": (os.urandom(64), "undecodable"),
        b"g-empty": (b"", "undecodable"),
        b"g-keyed-other": (CODEC.encode("commands", command("g-value-id", start_body())), "key_mismatch"),
        b"\xff\xfe-not-utf8": (CODEC.encode("commands", command("g-utf8", start_body())), "key_mismatch"),
    }
    assert good[:2] == b"\xc3\x01" and good[2:10] == fp
    v2 = bytearray(CODEC.encode("commands", command("g-v2", start_body())))
    assert v2[10] == 2  # zigzag(1): schema_version is the first field
    v2[10] = 4  # schema_version 2
    cases[b"g-v2"] = (bytes(v2), "undecodable")
    with running(settings) as pt, Responder(settings, complete_all):
        for key, (value, _) in cases.items():
            cmd.raw(settings.topics.commands, key, value)
        # a null key, and a value whose run id's owner differs from the key's
        cmd.raw(settings.topics.commands, None, CODEC.encode("commands", command("g-nokey", start_body())))
        cmd.start("g-after", "one")
        cmd.flush()
        events.wait_for(
            lambda evs: any(e["run_id"] == "g-after" and e["type"] == "RunSucceeded" for e in evs),
            what="the good run after the garbage to succeed",
        )
        assert pt.thread.is_alive()
        letters = dead.wait_for(lambda d: len(d) >= len(cases) + 1, what="a dead letter per bad record")
    by_key = {d["key"]: d for d in letters}
    for key, (value, reason) in cases.items():
        d = by_key[key]  # (the reason is the metric label; the error says why)
        assert d["original"] == (value or b""), key
        assert d["source_topic"] == settings.topics.commands
        assert d["error"], (key, reason)
    assert "not UTF-8" in by_key[b"\xff\xfe-not-utf8"]["error"]
    assert '"g-keyed-other"' in by_key[b"g-keyed-other"]["error"]
    assert by_key[None]["error"]
    run_ids = {e["run_id"] for e in events.drain(0.5) if e["type"] == "RunAccepted"}
    assert run_ids == {"g-after"}, run_ids
    dead.close()
    events.close()


def test_a_key_that_is_not_the_run_id_never_folds_into_a_second_run(settings: ProcessorSettings) -> None:
    """docs/contract.md, What a producer fills: "The Kafka key must be exactly its UTF-8 bytes, or
    the record is dead-lettered (`key_mismatch`)"; Partitioning: "a run id is one run whatever
    partitioner each producer uses"."""
    cmd = Commands(settings)
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    parts = settings.partitions
    rid = "k-run"
    with running(settings), Responder(settings, lambda c, a: None):
        cmd.start(rid, "one", {"v": 1})
        cmd.flush()
        events.wait_for(lambda evs: any(e["type"] == "RunAccepted" for e in evs), what="RunAccepted")
        other = CODEC.encode("commands", command(rid, start_body({"v": 2})))
        # the same run id, keyed differently, on each partition; and keyed right on the wrong partition
        for key in (rid.encode() + b" ", rid.upper().encode(), b""):
            for p in range(parts):
                cmd.producer.produce(settings.topics.commands, other, key, partition=p)
        cmd.producer.produce(
            settings.topics.commands, other, rid.encode(), partition=other_partition(rid, parts)
        )
        cmd.flush()
        dead.wait_for(lambda d: len(d) >= 3 * parts, what="key_mismatch dead letters")
        events.wait_for(
            lambda evs: any(e["type"] == "RunRejected" and e["run_id"] == rid for e in evs),
            what="the misrouted conflicting start to be forwarded and rejected Conflict",
        )
        events.drain(1.0)
    accepted = [e for e in events.records if e["type"] == "RunAccepted"]
    assert [(e["run_id"], e["_partition"]) for e in accepted] == [(rid, partition_for(rid, parts))]
    rejected = [e for e in events.records if e["type"] == "RunRejected"]
    assert [e["code"] for e in rejected] == ["Conflict"]
    assert all("is not the run_id" in d["error"] for d in dead.records)
    dead.close()
    events.close()


def test_receipts_with_a_wrong_key_are_dead_lettered_and_misrouted_ones_forwarded(
    settings: ProcessorSettings,
) -> None:
    """docs/contract.md, Partitioning: "The processor checks every command and receipt: one that
    arrived on a partition that does not own its run id is forwarded"; a key that is not its run
    id is dead-lettered (`key_mismatch`)."""
    cmd = Commands(settings)
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    parts = settings.partitions

    def handler(c: Commands, act: dict[str, Any]) -> None:
        if act["type"] != "ActionActivation":
            return
        ident = {k: act[k] for k in ("node", "lineage", "attempt", "dispatch_id")}
        body = {"type": "ActivationCompleted", **ident, "worker_id": "foreign", "output": {"x": 1}}
        body["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}
        value = CODEC.encode("receipts", command(act["run_id"], body))
        # first with a key that is not the run id (must not complete the step), then misrouted
        c.producer.produce(settings.topics.receipts, value, b"someone-else")
        c.producer.produce(
            settings.topics.receipts,
            value,
            act["run_id"].encode(),
            partition=other_partition(act["run_id"], parts),
        )
        c.producer.flush(10)

    with running(settings), Responder(settings, handler):
        cmd.start("rc-1", "one")
        cmd.flush()
        events.wait_for(
            lambda evs: any(e["type"] == "RunSucceeded" and e["run_id"] == "rc-1" for e in evs),
            what="success",
        )
        dead.wait_for(lambda d: any(x["key"] == b"someone-else" for x in d), what="key_mismatch receipt")
    assert [e["type"] for e in events.records].count("StepSucceeded") == 1


# ---- documented limits at their boundary -----------------------------------------------------


def test_input_size_and_depth_limits_hold_exactly_at_the_boundary(settings: ProcessorSettings) -> None:
    """docs/semantics.md, Size limits: `max_input_bytes` 256 KiB (orjson bytes of the value) over
    it `RunRejected` `Limit`; Nesting: `max_json_depth` 64, deeper `RunRejected` `InvalidInput`
    naming the limit; docs/contract.md, json fields: text that is not JSON is rejected
    `InvalidInput`, never only a dead letter (a foreign producer can write JSON text nested
    deeper than any parser reads)."""
    cmd = Commands(settings)
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    limit = 256 * 1024
    at = {"t": "x" * (limit - len(b'{"t":""}'))}
    over = {"t": "x" * (limit - len(b'{"t":""}') + 1)}
    assert len(orjson.dumps(at)) == limit and len(orjson.dumps(over)) == limit + 1
    assert len(orjson.dumps(nested(64))) and orjson.dumps(nested(64)).count(b"[") == 63
    expect = {
        "sz-at": None,
        "sz-over": "Limit",
        "d-64": None,
        "d-65": "InvalidInput",
        "d-2000": "InvalidInput",
    }
    with running(settings), Responder(settings, lambda c, a: None):
        cmd.start("sz-at", "one", at)
        cmd.start("sz-over", "one", over)
        cmd.start("d-64", "one", nested(64))
        cmd.start("d-65", "one", nested(65))
        raw = CODEC.encode("commands", command("d-2000", start_body({"placeholder": 1})))
        deep = b'{"a":' + b"[" * 1999 + b"0" + b"]" * 1999 + b"}"
        old = b'{"placeholder":1}'
        raw = raw.replace(bytes([len(old) * 2]) + old, _avro_string(deep))
        cmd.raw(settings.topics.commands, b"d-2000", raw)
        cmd.flush()
        events.wait_for(
            lambda evs: (
                {e["run_id"] for e in evs if e["type"] in ("RunAccepted", "RunRejected")} >= set(expect)
            ),
            what="an answer per start",
        )
    answers = {e["run_id"]: e for e in events.records if e["type"] in ("RunAccepted", "RunRejected")}
    for rid, code in expect.items():
        got = answers[rid]
        assert (got["type"], got.get("code")) == (
            ("RunAccepted", None) if code is None else ("RunRejected", code)
        ), (rid, got)
    assert "max_json_depth 64" in answers["d-65"]["reason"]
    assert not [d for d in dead.drain(0.5) if d["key"] == b"d-2000"]
    dead.close()
    events.close()


def _avro_string(b: bytes) -> bytes:
    n = len(b) * 2  # zigzag of a non-negative long
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + b


def test_signal_payload_size_limit_holds_exactly_at_the_boundary(settings: ProcessorSettings) -> None:
    """docs/semantics.md, Size limits: `max_payload_bytes` 256 KiB: a `SignalRun.payload` over it
    -> `RunRejected` `Limit` ("signal payload of N bytes exceeds max_payload_bytes M"), the run
    unchanged (still waiting); at it, taken."""
    cmd = Commands(settings)
    events = Reader(settings, [settings.topics.run_events], "run_events")
    limit = 256 * 1024
    at = {"t": "x" * (limit - len(b'{"t":""}'))}
    over = {"t": "x" * (limit - len(b'{"t":""}') + 1)}
    with running(settings):
        cmd.start("sig-1", "waiter")
        cmd.flush()
        events.wait_for(lambda evs: any(e["type"] == "RunWaiting" for e in evs), what="RunWaiting")
        cmd.send("commands", "sig-1", {"type": "SignalRun", "signal": "go", "payload": over})
        cmd.flush()
        events.wait_for(lambda evs: any(e["type"] == "RunRejected" for e in evs), what="the rejection")
        cmd.send("commands", "sig-1", {"type": "SignalRun", "signal": "go", "payload": at})
        cmd.flush()
        events.wait_for(lambda evs: any(e["type"] == "RunSucceeded" for e in evs), what="the run to succeed")
    rej = next(e for e in events.records if e["type"] == "RunRejected")
    assert rej["code"] == "Limit" and f"signal payload of {limit + 1} bytes" in rej["reason"]
    got = [e for e in events.records if e["type"] == "SignalReceived"]
    assert len(got) == 1 and got[0]["payload"] == at
    events.close()
