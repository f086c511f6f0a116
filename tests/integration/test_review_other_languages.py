"""A hostile review of the any-language contract (docs/contract.md, docs/client.md) as a service
in another language meets it: the Node codec of examples/node against the Python codec, a
foreign producer (raw bytes, another partitioner, wrong inputs) against the processor, and
two services racing on one run id against the answers the SDK promises."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest
import yaml
from confluent_kafka import Producer
from executor_support import WorkerThread
from processor_support import CODEC, Reader, make_settings, now_ms, running, setup_topology

from processors.client import RunClient
from processors.client.errors import CommandRejected
from processors.executors.sdk import Worker
from processors.kafka.partitioning import partition_for
from processors.runtime.settings import ProcessorSettings
from topology.settings import producer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "scripts" / "examples.sh"
DEFINITIONS = [ROOT / "examples" / "definitions" / name for name in ("one-step.yaml", "await-approval.yaml")]
STANDALONE = ROOT / "schemas" / "standalone"


def _node_modules() -> Path:
    """examples/node's packages, built (or found in the cache) by scripts/examples.sh, in the
    directory it names after a hash of package.json and package-lock.json."""
    missing = [tool for tool in ("npm", "node") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"the Node example needs {', '.join(missing)} on PATH", pytrace=False)
    proc = subprocess.run(
        ["bash", str(EXAMPLES), "build"], capture_output=True, text=True, timeout=540, check=False
    )
    assert proc.returncode == 0, f"building the examples failed:\n{proc.stderr[-4000:]}"
    digest = hashlib.sha256()
    for name in ("examples/node/package.json", "examples/node/package-lock.json"):
        digest.update(f"{name}\n".encode() + (ROOT / name).read_bytes())
    cache = os.environ.get("RUNFOLD_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runfold"
    )
    modules = Path(cache) / "examples" / f"node-{digest.hexdigest()[:16]}" / "node_modules"
    assert modules.is_dir(), f"scripts/examples.sh built no {modules}"
    return modules


NODE_CODEC = r"""
const {Topic, bodyOf, JSONbig} = require(process.env.RUNFOLD_ROOT + '/examples/node/runfold');
const dir = process.env.RUNFOLD_ROOT + '/schemas/standalone';
const commands = new Topic(dir, 'runfold.CommandEnvelope');
const events = new Topic(dir, 'runfold.RunEventEnvelope');
const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const out = {encoded: {}, decoded: {}};
for (const [name, body] of Object.entries(cases.encode)) {
  try {
    out.encoded[name] = commands.encode({record_id: 'r-1', run_id: 'run-1', ts_ms: 1700000000000,
                                         body: JSONbig.parse(body)}).toString('hex');
  } catch (e) { out.encoded[name] = 'ERROR ' + (e.message || String(e)); }
}
for (const [name, hex] of Object.entries(cases.decode)) {
  try { out.decoded[name] = JSONbig.stringify(bodyOf(events.decode(Buffer.from(hex, 'hex'))).output); }
  catch (e) { out.decoded[name] = 'ERROR ' + (e.message || String(e)); }
}
console.log(JSON.stringify(out));
"""


def _run_node(cases: dict[str, Any]) -> dict[str, Any]:
    modules = _node_modules()
    proc = subprocess.run(
        ["node", "-e", NODE_CODEC],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        env={"NODE_PATH": str(modules), "RUNFOLD_ROOT": str(ROOT), "PATH": "/usr/bin:/bin:/usr/local/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _command(body: dict[str, Any]) -> bytes:
    return CODEC.encode("commands", {"record_id": "r-1", "run_id": "run-1", "ts_ms": 1700000000000, **body})


def test_node_codec_writes_json_null_and_reads_every_object_key() -> None:
    """docs/contract.md: json fields hold any JSON text, `payload: json` included (the Python
    SDK's `signal(run, name)` sends JSON null); and a service reads run events whatever keys a
    run's output has. The Node codec refused to encode JSON null in a required json field
    ('invalid "string": undefined'), and json-bigint's default refuses objects with a
    `constructor` or `__proto__` key ('Object contains forbidden constructor property'), so one
    run's output stopped the Node consumer."""
    outputs: dict[str, Any] = {
        "constructor": {"constructor": "Foo", "prototype": 1},
        "proto": {"__proto__": {"polluted": True}, "toString": "x"},
        "unicode": {"ключ 😀": "значение", "é": ["\u2028", "\u0000"]},
        "big": {"max": 2**64 - 1, "min": -(2**63), "above_2_53": 2**53 + 1, "float": 0.1},
    }
    decode = {
        name: CODEC.encode(
            "run_events",
            {
                "run_id": "run-1",
                "sequence": 3,
                "ts_ms": 1700000000000,
                "record_id": "run-1:3",
                "type": "RunSucceeded",
                "output": value,
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0},
            },
        ).hex()
        for name, value in outputs.items()
    }
    # the bodies in avsc's wrapped-union form; json fields as values (the JsonType writes their text)
    encode = {
        "signal_null": '{"runfold.SignalRun": {"signal": "approval", "payload": null}}',
        "signal_false": '{"runfold.SignalRun": {"signal": "approval", "payload": false}}',
        "start_null_input": '{"runfold.StartRun": {"definition_id": "d", "input": null}}',
        "resume_no_budgets": '{"runfold.ResumeRun": {"budgets": null}}',
        "start_budgets": '{"runfold.StartRun": {"definition_id": "d", "input": {"n": 18446744073709551615},'
        ' "budgets": {"max_steps": 5}, "labels": {"ключ": "v"}}}',
    }
    expected = {
        "signal_null": _command({"type": "SignalRun", "signal": "approval", "payload": None}),
        "signal_false": _command({"type": "SignalRun", "signal": "approval", "payload": False}),
        "start_null_input": _command({"type": "StartRun", "definition_id": "d", "input": None}),
        "resume_no_budgets": _command({"type": "ResumeRun", "budgets": None}),
        "start_budgets": _command(
            {
                "type": "StartRun",
                "definition_id": "d",
                "input": {"n": 2**64 - 1},
                "budgets": {"max_steps": 5},
                "labels": {"ключ": "v"},
            }
        ),
    }
    got = _run_node({"encode": encode, "decode": decode})
    for name, value in outputs.items():
        assert not got["decoded"][name].startswith("ERROR"), (name, got["decoded"][name])
        assert orjson.loads(got["decoded"][name]) == value, name
    for name, want in expected.items():
        assert got["encoded"][name] == want.hex(), (name, got["encoded"][name])
        assert CODEC.decode("commands", bytes.fromhex(got["encoded"][name]))["type"]


# ---- a foreign producer against the processor -----------------------------------------------


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", partitions=4)
    setup_topology(s, [yaml.safe_load(p.read_text()) for p in DEFINITIONS])
    return s


def _foreign_producer(settings: ProcessorSettings, partitioner: str) -> Producer:
    cfg = producer_config(settings, linger_ms=0)
    cfg["partitioner"] = partitioner
    return Producer(cfg)


def _envelope(run_id: str, body: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"run_id": run_id, "record_id": uuid.uuid4().hex, "ts_ms": now_ms(), **body, **over}


def _start(definition: str, input: Any) -> dict[str, Any]:
    return {"type": "StartRun", "definition_id": definition, "revision": None, "input": input}


def test_a_run_id_is_one_run_whatever_partitioner_and_however_often_sent(settings: ProcessorSettings) -> None:
    """docs/contract.md, Partitioning and Idempotency: a StartRun sent with CRC32, random and
    murmur2 partitioners, twice each, is one run on the owning partition; its 64-bit integers,
    unicode keys and unicode run id come back whole."""
    events = Reader(settings, [settings.topics.run_events], "run_events")
    run_ids = [f"rvl-{uuid.uuid4().hex[:6]}-ü😀-{i}" for i in range(6)]
    inputs = {
        r: {"big": 2**64 - 1 - i, "neg": -(2**63) + i, "ключ": "😀", "f": 1.5} for i, r in enumerate(run_ids)
    }
    with running(settings, partitions=4), WorkerThread(Worker(name="rvl", queues=["default"]), settings):
        for partitioner in ("consistent_random", "random", "murmur2_random", "consistent_random", "fnv1a"):
            producer = _foreign_producer(settings, partitioner)
            for r in run_ids:
                value = CODEC.encode("commands", _envelope(r, _start("one-step", inputs[r])))
                producer.produce(settings.topics.commands, value, r.encode())
            assert producer.flush(30) == 0
        events.wait_for(
            lambda evs: all(
                any(e["run_id"] == r and e["type"] == "RunSucceeded" for e in evs) for r in run_ids
            ),
            timeout=90,
            what="every run succeeded",
        )
        time.sleep(1.0)  # any second run would be folded by now
        events.drain()
    for r in run_ids:
        mine = events.of(r)
        types = [e["type"] for e in mine]
        assert types.count("RunAccepted") == 1, types
        assert "RunRejected" not in types, types
        assert [e["sequence"] for e in mine] == list(range(1, len(mine) + 1))
        assert {e["_partition"] for e in mine} == {partition_for(r, 4)}
        (done,) = events.of(r, "RunSucceeded")
        assert done["output"] == inputs[r]
    events.close()


def _registry_framed(body: bytes, schema_id: int) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def _with_extra_field(msg: dict[str, Any]) -> bytes:
    """A command written with the standalone schema plus one optional field (a compatible
    evolution a registry would allow): its fingerprint is not one runfold knows."""
    schema = json.loads((STANDALONE / "runfold.CommandEnvelope.avsc").read_text())
    schema["fields"].append({"name": "trace", "type": ["null", "string"], "default": None})
    parsed = fastavro.parse_schema(schema)
    from io import BytesIO

    buf = BytesIO()
    body = {k: v for k, v in msg.items() if k not in ("type",)}
    record = {
        "schema_version": 1,
        "record_id": body.pop("record_id"),
        "run_id": body.pop("run_id"),
        "ts_ms": body.pop("ts_ms"),
        "trace": "t",
        "body": (
            "runfold.StartRun",
            {
                "definition_id": body["definition_id"],
                "revision": None,
                "input": json.dumps(body["input"]),
                "parent": None,
                "bundle": None,
                "budgets": None,
                "labels": {},
            },
        ),
    }
    fastavro.schemaless_writer(buf, parsed, record)
    fp = fastavro.schema.fingerprint(fastavro.schema.to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    return b"\xc3\x01" + bytes.fromhex(fp)[::-1] + buf.getvalue()


def test_wrong_inputs_get_the_documented_answer(settings: ProcessorSettings) -> None:
    """docs/contract.md: what answers each wrong input, a dead letter (with its words) or a
    RunRejected (with its code and record id), and the size and depth limits at the boundary."""
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    producer = _foreign_producer(settings, "murmur2_random")
    tag = uuid.uuid4().hex[:6]
    rejected: dict[str, tuple[str, str, str]] = {}  # run id -> (record id, code, words in the reason)
    accepted: list[str] = []
    dead_keys: dict[bytes, str] = {}  # key -> words in the error

    def send(run_id: str, value: bytes | None, key: bytes | None = None) -> None:
        producer.produce(settings.topics.commands, value, run_id.encode() if key is None else key)

    def reject(run_id: str, msg: dict[str, Any], code: str, words: str, value: bytes | None = None) -> None:
        rejected[run_id] = (msg["record_id"], code, words)
        send(run_id, value if value is not None else CODEC.encode("commands", msg))

    # limits at the boundary: max_input_bytes 256 KiB, measured as orjson bytes of the input
    limit = 256 * 1024
    pad = limit - len(orjson.dumps({"t": ""}))
    at_limit, over = {"t": "x" * pad}, {"t": "x" * (pad + 1)}
    assert len(orjson.dumps(at_limit)) == limit
    r = f"rvl-{tag}-at-limit"
    accepted.append(r)
    send(r, CODEC.encode("commands", _envelope(r, _start("one-step", at_limit))))
    r = f"rvl-{tag}-over-limit"
    reject(r, _envelope(r, _start("one-step", over)), "Limit", "")
    # max_payload_bytes 256 KiB for the labels, measured the same way
    lpad = limit - len(orjson.dumps({"k": ""}))
    r = f"rvl-{tag}-labels-at-limit"
    accepted.append(r)
    send(r, CODEC.encode("commands", _envelope(r, {**_start("one-step", {}), "labels": {"k": "y" * lpad}})))
    r = f"rvl-{tag}-labels-over-limit"
    reject(r, _envelope(r, {**_start("one-step", {}), "labels": {"k": "y" * (lpad + 1)}}), "Limit", "")
    # max_json_depth 64: 64 levels accepted, 65 refused InvalidInput
    deep64: Any = 1
    for _ in range(64):
        deep64 = [deep64]
    r = f"rvl-{tag}-depth-64"
    accepted.append(r)
    send(r, CODEC.encode("commands", _envelope(r, _start("one-step", {"d": deep64[0]}))))
    r = f"rvl-{tag}-depth-65"
    reject(r, _envelope(r, _start("one-step", {"d": deep64})), "InvalidInput", "max_json_depth")
    # a control character in the run id; ts_ms in seconds; an input that is not JSON text
    r = f"rvl-{tag}-ctl\x07"
    reject(r, _envelope(r, _start("one-step", {})), "InvalidInput", "")
    r = f"rvl-{tag}-seconds"
    reject(
        r, _envelope(r, _start("one-step", {}), ts_ms=now_ms() // 1000), "InvalidInput", "looks like seconds"
    )
    r = f"rvl-{tag}-notjson"
    msg = _envelope(r, _start("one-step", {"a": 1}))
    good = CODEC.encode("commands", msg)
    broken = good.replace(b'{"a":1}', b'{"a":1 ')
    assert broken != good
    reject(r, msg, "InvalidInput", "StartRun.input is not valid JSON text", value=broken)
    # commands for runs that do not exist
    for kind, body in (
        ("cancel", {"type": "CancelRun", "reason": ""}),
        ("signal", {"type": "SignalRun", "signal": "approval", "payload": None}),
        ("resume", {"type": "ResumeRun", "budgets": None, "reason": ""}),
    ):
        r = f"rvl-{tag}-unknown-{kind}"
        reject(r, _envelope(r, body), "NotFound", "")
    # undecodable records: dead letters, no event
    r = f"rvl-{tag}-v2"
    v2 = bytearray(CODEC.encode("commands", _envelope(r, _start("one-step", {}))))
    assert v2[10] == 2  # zig-zag 1: schema_version is the first field
    v2[10] = 4  # schema_version 2
    dead_keys[r.encode()] = ""
    send(r, bytes(v2))
    r = f"rvl-{tag}-registry"
    avro_body = CODEC.encode("commands", _envelope(r, _start("one-step", {})))[10:]
    dead_keys[r.encode()] = "Confluent framing (schema id 7) but no schema registry configured"
    send(r, _registry_framed(avro_body, 7))
    r = f"rvl-{tag}-extra-field"
    dead_keys[r.encode()] = "schemas/standalone/runfold.CommandEnvelope.avsc"
    send(r, _with_extra_field(_envelope(r, _start("one-step", {}))))
    r = f"rvl-{tag}-truncated"
    dead_keys[r.encode()] = ""
    send(r, CODEC.encode("commands", _envelope(r, _start("one-step", {"a": "b" * 20})))[:-9])
    r = f"rvl-{tag}-null"
    dead_keys[r.encode()] = ""
    send(r, None)
    r = f"rvl-{tag}-key"
    dead_keys[f"{r}-other".encode()] = "is not the run_id"
    send(r, CODEC.encode("commands", _envelope(r, _start("one-step", {}))), key=f"{r}-other".encode())
    assert producer.flush(30) == 0

    with running(settings, partitions=4), WorkerThread(Worker(name="rvl", queues=["default"]), settings):
        events.wait_for(
            lambda evs: (
                all(any(e["run_id"] == r and e["type"] == "RunRejected" for e in evs) for r in rejected)
                and all(any(e["run_id"] == r and e["type"] == "RunAccepted" for e in evs) for r in accepted)
            ),
            timeout=90,
            what="every answer",
        )
        dead.wait_for(
            lambda recs: {d["key"] for d in recs} >= set(dead_keys), timeout=60, what="every dead letter"
        )
        time.sleep(1.0)
        events.drain()
    for r, (record_id, code, words) in rejected.items():
        (rej,) = events.of(r)
        assert rej["type"] == "RunRejected" and rej["sequence"] == 0, rej
        assert (rej["code"], rej["record_id"]) == (code, f"{r}:rejected:{record_id}"), rej
        assert words in rej["reason"], rej["reason"]
    for r in accepted:  # (the one at 256 KiB then fails: its snapshot's copies pass the broker's 1 MB)
        assert [e["type"] for e in events.of(r)].count("RunAccepted") == 1
        assert not events.of(r, "RunRejected")
    for key, words in dead_keys.items():
        letters = [d for d in dead.records if d["key"] == key]
        assert len(letters) == 1, letters
        assert letters[0]["source_topic"] == settings.topics.commands
        assert words in letters[0]["error"], letters[0]["error"]
        assert not events.of(key.decode()), "an undecodable command got an event"
    events.close()
    dead.close()


# ---- two services racing on one run id --------------------------------------------------------


def _race(settings: ProcessorSettings, calls: list[Any]) -> list[Any]:
    """Run each call in a thread of its own client while no processor runs, start one once
    every command is on the broker, and return each call's result or exception."""
    results: list[Any] = [None] * len(calls)
    sent = threading.Barrier(len(calls) + 1, timeout=60)

    def one(i: int) -> None:
        with RunClient(settings, answer_timeout_s=60) as client:
            real = client.produce

            def produce(topic: str, key: str, value: bytes) -> tuple[int, int]:
                out = real(topic, key, value)
                sent.wait()
                return out

            client.produce = produce  # type: ignore[method-assign]
            try:
                results[i] = calls[i](client)
            except Exception as e:
                results[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    sent.wait()  # every command is written, none is answered: no processor runs yet
    with running(settings, partitions=4), WorkerThread(Worker(name="rvl", queues=["default"]), settings):
        for t in threads:
            t.join(90)
    assert not any(t.is_alive() for t in threads)
    return results


def test_two_services_start_one_run_id_with_different_inputs(settings: ProcessorSettings) -> None:
    """docs/client.md: `start` raises CommandRejected Conflict for the same run id with another
    input. Two services starting one id at once: the one the processor folded second must be
    told Conflict, not "accepted" because it saw the other's RunAccepted."""
    run_id = f"rvl-race-{uuid.uuid4().hex[:6]}"
    results = _race(
        settings,
        [lambda c, i=i: c.start("one-step", {"who": i}, run_id=run_id) for i in range(2)],
    )
    rejected = [r for r in results if isinstance(r, CommandRejected)]
    assert len(rejected) == 1, results
    assert rejected[0].code == "Conflict"
    assert [r for r in results if not isinstance(r, Exception)] == [run_id]


def test_two_services_signal_one_waiting_run(settings: ProcessorSettings) -> None:
    """docs/client.md: a signal to a finished run raises CommandRejected Conflict. Two services
    signal a run that finishes on the first signal: the second must be told Conflict."""
    run_id = f"rvl-sig-{uuid.uuid4().hex[:6]}"
    with running(settings, partitions=4), RunClient(settings) as client:
        client.start("await-approval", {}, run_id=run_id)
        deadline = time.monotonic() + 30
        while client.get(run_id).status != "waiting":
            assert time.monotonic() < deadline, "the run never waited"
            time.sleep(0.2)
    results = _race(
        settings,
        [
            lambda c: c.signal(run_id, "approval", {"approved": True}),
            lambda c: c.signal(run_id, "approval", {"approved": False}),
        ],
    )
    rejected = [r for r in results if isinstance(r, CommandRejected)]
    assert len(rejected) == 1, results
    assert rejected[0].code == "Conflict", rejected[0]
    answered = [r for r in results if not isinstance(r, Exception)]
    assert len(answered) == 1 and answered[0].outcome == "accepted", results


def test_commands_of_one_run_on_two_partitions_may_be_folded_out_of_order(
    settings: ProcessorSettings,
) -> None:
    """docs/contract.md, Partitioning: a run's commands keep their order only when they land on
    one partition. A round-robin producer's StartRun on a partition that does not own the run,
    then its CancelRun on the owner: the cancel is folded first (NotFound) and the start one
    transaction later, so the run goes on. (What the docs now tell such a producer.)"""
    run_id = f"rvl-order-{uuid.uuid4().hex[:6]}"
    owner = partition_for(run_id, 4)
    elsewhere = (owner + 1) % 4
    producer = _foreign_producer(settings, "murmur2_random")
    start = _envelope(run_id, _start("await-approval", {}))
    cancel = _envelope(run_id, {"type": "CancelRun", "reason": "too early"})
    producer.produce(
        settings.topics.commands, CODEC.encode("commands", start), run_id.encode(), partition=elsewhere
    )
    assert producer.flush(30) == 0
    producer.produce(
        settings.topics.commands, CODEC.encode("commands", cancel), run_id.encode(), partition=owner
    )
    assert producer.flush(30) == 0
    events = Reader(settings, [settings.topics.run_events], "run_events")
    with running(settings, partitions=4):
        events.wait_for(
            lambda evs: any(e["run_id"] == run_id and e["type"] == "RunWaiting" for e in evs),
            timeout=60,
            what="the run waiting",
        )
        time.sleep(0.5)
        events.drain()
    types = [e["type"] for e in events.of(run_id)]
    assert types[0] == "RunRejected" and events.of(run_id)[0]["code"] == "NotFound", types
    assert "RunAccepted" in types and "RunCancelled" not in types, types
    events.close()
