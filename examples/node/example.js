'use strict';
// A Node service that starts runfold runs, cancels one, signals one three times with one
// idempotency key (a retried signal: it takes effect once), and reads their run events back
// (read_committed), written from docs/contract.md and schemas/standalone/ alone.
//
//   node examples/node/example.js --bootstrap 127.0.0.1:9092 --prefix runfold \
//        [--schemas schemas/standalone] [--runs 3] [--id-prefix node] [--timeout-s 60]
//
// Needs examples/definitions/one-step.yaml and await-approval.yaml registered, a processor and a
// worker on the default queue. Prints one JSON line and exits 0 when every run ended as expected.
const crypto = require('crypto');
const {Kafka, CompressionTypes, CompressionCodecs, Partitioners, logLevel} = require('kafkajs');
const LZ4 = require('kafkajs-lz4');
const {Topic, bodyOf, JSONbig} = require('./runfold');

// runfold's producers write LZ4 batches (docs/contract.md, Compression): kafkajs needs the codec.
CompressionCodecs[CompressionTypes.LZ4] = new LZ4().codec;

function options(argv) {
  const opt = {};
  for (let i = 0; i + 1 < argv.length; i += 2) opt[argv[i].replace(/^--/, '')] = argv[i + 1];
  return opt;
}

// JSON values compared by content: json-bigint's objects have no prototype, and key order is free.
function canonical(v) {
  if (typeof v === 'bigint') return `${v}n`;
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

const TERMINAL = new Set(['RunSucceeded', 'RunFailed', 'RunCancelled', 'RunRejected']);
const RETRIES = 3;  // the same SignalRun, sent this many times (as a client retrying after timeouts)

async function main() {
  const opt = options(process.argv.slice(2));
  const prefix = opt.prefix || 'runfold';
  const schemas = opt.schemas || 'schemas/standalone';
  const runs = Number(opt.runs || 3);
  const idPrefix = `${opt['id-prefix'] || 'node'}-${crypto.randomUUID().slice(0, 8)}`;
  const deadline = Date.now() + 1000 * Number(opt['timeout-s'] || 60);
  const commands = new Topic(schemas, 'runfold.CommandEnvelope');
  const events = new Topic(schemas, 'runfold.RunEventEnvelope');

  const kafka = new Kafka({clientId: 'runfold-node-example', brokers: (opt.bootstrap || '127.0.0.1:9092').split(','),
                           logLevel: logLevel.WARN});
  // Any partitioner works (the processor forwards a record to the partition that owns its run id);
  // murmur2, Java's default and kafkajs 2's, puts it there at once and saves that hop.
  const producer = kafka.producer({idempotent: true, maxInFlightRequests: 1,  // retries never duplicate
                                   createPartitioner: Partitioners.DefaultPartitioner});
  const consumer = kafka.consumer({groupId: `${idPrefix}-reader`, readUncommitted: false});  // read_committed
  const send = (runId, body) => producer.send({
    topic: `${prefix}.commands`,
    acks: -1,
    // schema_version is left to its schema default (1); ts_ms: milliseconds since the epoch, UTC
    messages: [{key: runId, value: commands.encode({record_id: crypto.randomUUID(), run_id: runId,
                                                    ts_ms: Date.now(), body})}],
  });

  const inputs = new Map();
  for (let i = 0; i < runs; i++) {
    inputs.set(`${idPrefix}-${i}`, {text: `hello from Node ${i}`, big: 9223372036854775807n - BigInt(i)});
  }
  const toCancel = `${idPrefix}-wait`;
  const toSignal = `${idPrefix}-signal`;
  // Its idempotency key: each send is a new record (a new record_id), one command by its key.
  const signalKey = `approve-${crypto.randomUUID()}`;
  const seen = new Map();
  let cancelled = false;
  let signalled = false;
  await producer.connect();
  await consumer.connect();
  try {
    for (const [runId, input] of inputs) {
      await send(runId, {'runfold.StartRun': {definition_id: 'one-step', revision: null, input}});
    }
    await send(toCancel, {'runfold.StartRun': {definition_id: 'await-approval', revision: null, input: {}}});
    await send(toSignal, {'runfold.StartRun': {definition_id: 'await-approval', revision: null, input: {}}});

    await consumer.subscribe({topic: `${prefix}.run-events`, fromBeginning: true});
    // the signalled run is done once its repeats are answered too (they follow its end)
    const finished = () => [...inputs.keys(), toCancel, toSignal].every(
      (id) => (seen.get(id) || []).some((e) => TERMINAL.has(e.type))) &&
      (seen.get(toSignal) || []).filter((e) => e.type === 'CommandDeduplicated').length >= RETRIES - 1;
    let done;
    const allDone = new Promise((resolve) => { done = resolve; });
    await consumer.run({
      eachMessage: async ({message}) => {
        const runId = message.key.toString('utf8');
        if (!runId.startsWith(idPrefix)) return;  // another service's run
        const envelope = events.decode(message.value);
        const event = {...bodyOf(envelope), sequence: Number(envelope.sequence)};
        if (!seen.has(runId)) seen.set(runId, []);
        seen.get(runId).push(event);
        if (!cancelled && runId === toCancel && event.type === 'RunWaiting') {
          cancelled = true;
          await send(toCancel, {'runfold.CancelRun': {reason: 'cancelled by the Node example'}});
        }
        if (!signalled && runId === toSignal && event.type === 'RunWaiting') {
          signalled = true;
          for (let i = 0; i < RETRIES; i++) {  // ["null", "string"]: avsc takes the string as it is
            await send(toSignal, {'runfold.SignalRun': {signal: 'approval', payload: {approved: true},
                                                        idempotency_key: signalKey}});
          }
        }
        if (finished()) done();
      },
    });
    await Promise.race([allDone, new Promise((resolve) => setTimeout(resolve, Math.max(0, deadline - Date.now())))]);
  } finally {
    await consumer.disconnect();
    await producer.disconnect();
  }

  const expected = new Map([...[...inputs.keys()].map((id) => [id, 'RunSucceeded']), [toCancel, 'RunCancelled'],
                            [toSignal, 'RunSucceeded']]);
  const report = {language: 'node', ok: true, runs: {},
                  fingerprints: {commands: commands.fingerprint.toString('hex'),
                                 run_events: events.fingerprint.toString('hex')}};
  for (const [runId, want] of expected) {
    const mine = seen.get(runId) || [];
    const ends = mine.filter((e) => TERMINAL.has(e.type));
    let ok = mine.filter((e) => e.type === 'RunAccepted').length === 1 && ends.length === 1 && ends[0].type === want
      && mine.filter((e) => e.sequence > 0).every((e, i) => e.sequence === i + 1);  // one gap-free sequence per run
    const row = {events: mine.map((e) => e.type)};
    if (runId === toSignal) {
      // one effect: one SignalReceived carrying the key; each repeat answered with it, changing nothing
      const received = mine.filter((e) => e.type === 'SignalReceived');
      const repeats = mine.filter((e) => e.type === 'CommandDeduplicated');
      row.signal = {key: signalKey, sent: RETRIES, received: received.length, deduplicated: repeats.length};
      ok = ok && received.length === 1 && received[0].idempotency_key === signalKey
        && repeats.length === RETRIES - 1
        && repeats.every((e) => e.idempotency_key === signalKey && e.sequence === 0
                         && Number(e.answer_sequence) === received[0].sequence && e.answer_type === 'SignalReceived')
        && ends.length === 1 && ends[0].output === true;
    } else if (ends.length && ends[0].type === 'RunSucceeded') {
      row.output = JSONbig.stringify(ends[0].output);
      ok = ok && canonical(ends[0].output) === canonical(inputs.get(runId));  // the 64-bit integer survived
    }
    if (ends.length && ends[0].type === 'RunRejected') row.reason = ends[0].reason;
    row.ok = ok;
    report.runs[runId] = row;
    report.ok = report.ok && ok;
  }
  console.log(JSON.stringify(report));
  return report.ok ? 0 : 1;
}

main().then((code) => process.exit(code), (err) => { console.error(err); process.exit(2); });
