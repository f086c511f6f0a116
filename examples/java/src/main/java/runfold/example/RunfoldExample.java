package runfold.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A service in Java that starts runfold runs, cancels one, signals one three times with one
 * idempotency key (a retried signal: it takes effect once), and reads their run events back
 * (read_committed), written from docs/contract.md and schemas/standalone/ alone.
 *
 * <p>Usage: {@code java -cp ... runfold.example.RunfoldExample --bootstrap 127.0.0.1:9092
 * --prefix runfold [--schemas schemas/standalone] [--runs 3] [--id-prefix java] [--timeout-s 60]}
 *
 * <p>Needs the definitions examples/definitions/one-step.yaml and await-approval.yaml registered,
 * a processor, and a worker serving the default queue. Prints one JSON line (what it saw) and
 * exits 0 when every run ended as expected: each one-step run succeeded with its input as output
 * (a 64-bit integer included), the await-approval run was cancelled, the signalled one succeeded
 * with one SignalReceived and its repeats answered by CommandDeduplicated, one RunAccepted and one
 * terminal event per run.
 */
public final class RunfoldExample {
  private static final ObjectMapper JSON = new ObjectMapper();
  /** The same SignalRun, sent this many times (as a client retrying after timeouts). */
  private static final int RETRIES = 3;

  public static void main(String[] args) throws Exception {
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
    Map<String, String> opt = options(args);
    String bootstrap = opt.getOrDefault("bootstrap", "127.0.0.1:9092");
    String prefix = opt.getOrDefault("prefix", "runfold");
    Path schemas = Path.of(opt.getOrDefault("schemas", "schemas/standalone"));
    int runs = Integer.parseInt(opt.getOrDefault("runs", "3"));
    String idPrefix = opt.getOrDefault("id-prefix", "java") + "-" + UUID.randomUUID().toString().substring(0, 8);
    long deadline = System.currentTimeMillis() + 1000L * Long.parseLong(opt.getOrDefault("timeout-s", "60"));

    // Self-contained schema files: one parse each, no load order (docs/contract.md).
    Schema commands = new Schema.Parser().parse(schemas.resolve("runfold.CommandEnvelope.avsc").toFile());
    Schema events = new Schema.Parser().parse(schemas.resolve("runfold.RunEventEnvelope.avsc").toFile());
    // Single-object encoding: C3 01, the writer schema's CRC-64-AVRO fingerprint, the Avro body.
    BinaryMessageEncoder<GenericRecord> encoder = new BinaryMessageEncoder<>(GenericData.get(), commands);
    BinaryMessageDecoder<GenericRecord> decoder = new BinaryMessageDecoder<>(GenericData.get(), events);

    Map<String, JsonNode> inputs = new LinkedHashMap<>();
    for (int i = 0; i < runs; i++) {
      ObjectNode input = JSON.createObjectNode();
      input.put("text", "hello from Java " + i);
      input.put("big", Long.MAX_VALUE - i); // above 2^53: JSON numbers are 64-bit integers here
      inputs.put(idPrefix + "-" + i, input);
    }
    String toCancel = idPrefix + "-wait";
    String toSignal = idPrefix + "-signal";
    // Its idempotency key: each send is a new record (a new record_id), one command by its key.
    String signalKey = "approve-" + UUID.randomUUID();
    String commandsTopic = prefix + ".commands";
    String eventsTopic = prefix + ".run-events";

    Map<String, List<GenericRecord>> seen = new HashMap<>();
    try (KafkaProducer<String, byte[]> producer = new KafkaProducer<>(producerConfig(bootstrap));
        KafkaConsumer<String, byte[]> consumer = new KafkaConsumer<>(consumerConfig(bootstrap))) {
      for (Map.Entry<String, JsonNode> run : inputs.entrySet()) {
        GenericRecord start = body(commands, "StartRun")
            .set("definition_id", "one-step")
            .set("input", JSON.writeValueAsString(run.getValue())) // a json field: JSON text in an Avro string
            .build();
        producer.send(command(encoder, commands, commandsTopic, run.getKey(), start));
      }
      for (String waiting : List.of(toCancel, toSignal)) {
        producer.send(command(encoder, commands, commandsTopic, waiting, body(commands, "StartRun")
            .set("definition_id", "await-approval").set("input", "{}").build()));
      }
      producer.flush();

      // Read the run events back, committed only, every partition from the start.
      List<TopicPartition> parts = new ArrayList<>();
      consumer.partitionsFor(eventsTopic).forEach(p -> parts.add(new TopicPartition(eventsTopic, p.partition())));
      consumer.assign(parts);
      consumer.seekToBeginning(parts);
      boolean cancelled = false;
      boolean signalled = false;
      while (System.currentTimeMillis() < deadline && !allFinished(seen, inputs.keySet(), toCancel, toSignal)) {
        for (ConsumerRecord<String, byte[]> rec : consumer.poll(Duration.ofMillis(200))) {
          if (!rec.key().startsWith(idPrefix)) {
            continue; // another service's run
          }
          GenericRecord event = decoder.decode(ByteBuffer.wrap(rec.value()));
          seen.computeIfAbsent(rec.key(), k -> new ArrayList<>()).add(event);
          if (!cancelled && rec.key().equals(toCancel) && type(event).equals("RunWaiting")) {
            producer.send(command(encoder, commands, commandsTopic, toCancel,
                body(commands, "CancelRun").set("reason", "cancelled by the Java example").build()));
            producer.flush();
            cancelled = true;
          }
          if (!signalled && rec.key().equals(toSignal) && type(event).equals("RunWaiting")) {
            for (int i = 0; i < RETRIES; i++) {
              producer.send(command(encoder, commands, commandsTopic, toSignal, body(commands, "SignalRun")
                  .set("signal", "approval")
                  .set("payload", "{\"approved\": true}")
                  .set("idempotency_key", signalKey) // the branch of ["null", "string"] is picked by value
                  .build()));
            }
            producer.flush();
            signalled = true;
          }
        }
      }
    }
    System.exit(report(seen, inputs, toCancel, toSignal, signalKey, commands, events) ? 0 : 1);
  }

  /** A command envelope: schema_version is left to its schema default (1). */
  private static ProducerRecord<String, byte[]> command(BinaryMessageEncoder<GenericRecord> encoder, Schema envelope,
      String topic, String runId, GenericRecord body) throws IOException {
    GenericRecord record = new GenericRecordBuilder(envelope)
        .set("record_id", UUID.randomUUID().toString())
        .set("run_id", runId)
        .set("ts_ms", System.currentTimeMillis()) // milliseconds since the epoch, UTC
        .set("body", body)
        .build();
    ByteBuffer encoded = encoder.encode(record);
    byte[] bytes = new byte[encoded.remaining()];
    encoded.get(bytes);
    return new ProducerRecord<>(topic, runId, bytes); // key: the run id, UTF-8
  }

  private static GenericRecordBuilder body(Schema envelope, String name) {
    for (Schema branch : envelope.getField("body").schema().getTypes()) {
      if (branch.getName().equals(name)) {
        return new GenericRecordBuilder(branch);
      }
    }
    throw new IllegalArgumentException("no body branch " + name);
  }

  private static String type(GenericRecord event) {
    return ((GenericRecord) event.get("body")).getSchema().getName();
  }

  private static GenericRecord body(GenericRecord event) {
    return (GenericRecord) event.get("body");
  }

  private static boolean terminal(GenericRecord event) {
    String t = type(event);
    return t.equals("RunSucceeded") || t.equals("RunFailed") || t.equals("RunCancelled") || t.equals("RunRejected");
  }

  private static boolean allFinished(
      Map<String, List<GenericRecord>> seen, Iterable<String> ids, String toCancel, String toSignal) {
    List<String> all = new ArrayList<>();
    ids.forEach(all::add);
    all.add(toCancel);
    all.add(toSignal);
    for (String id : all) {
      if (seen.getOrDefault(id, List.of()).stream().noneMatch(RunfoldExample::terminal)) {
        return false;
      }
    }
    // the signalled run is done once its repeats are answered too (they follow its end)
    return seen.get(toSignal).stream().filter(e -> type(e).equals("CommandDeduplicated")).count() >= RETRIES - 1;
  }

  private static boolean report(Map<String, List<GenericRecord>> seen, Map<String, JsonNode> inputs, String toCancel,
      String toSignal, String signalKey, Schema commands, Schema events) throws IOException {
    ObjectNode out = JSON.createObjectNode();
    out.put("language", "java");
    out.putObject("fingerprints")
        .put("commands", hex(SchemaNormalization.parsingFingerprint64(commands)))
        .put("run_events", hex(SchemaNormalization.parsingFingerprint64(events)));
    ObjectNode runsOut = out.putObject("runs");
    boolean ok = true;
    Map<String, String> expected = new LinkedHashMap<>();
    inputs.keySet().forEach(id -> expected.put(id, "RunSucceeded"));
    expected.put(toCancel, "RunCancelled");
    expected.put(toSignal, "RunSucceeded");
    for (Map.Entry<String, String> want : expected.entrySet()) {
      List<GenericRecord> mine = seen.getOrDefault(want.getKey(), List.of());
      ObjectNode r = runsOut.putObject(want.getKey());
      List<String> types = new ArrayList<>();
      mine.forEach(e -> types.add(type(e)));
      r.putPOJO("events", types);
      long accepted = types.stream().filter("RunAccepted"::equals).count();
      List<GenericRecord> ends = mine.stream().filter(RunfoldExample::terminal).toList();
      boolean good = accepted == 1 && ends.size() == 1 && type(ends.get(0)).equals(want.getValue());
      List<GenericRecord> sequenced = mine.stream().filter(e -> (long) e.get("sequence") > 0).toList();
      for (int i = 0; i < sequenced.size(); i++) { // one gap-free sequence per run
        good &= (long) sequenced.get(i).get("sequence") == i + 1;
      }
      if (want.getKey().equals(toSignal)) {
        // one effect: one SignalReceived carrying the key; each repeat answered with it, changing nothing
        List<GenericRecord> received = mine.stream().filter(e -> type(e).equals("SignalReceived")).toList();
        List<GenericRecord> repeats = mine.stream().filter(e -> type(e).equals("CommandDeduplicated")).toList();
        r.putObject("signal").put("key", signalKey).put("sent", RETRIES).put("received", received.size())
            .put("deduplicated", repeats.size());
        good &= received.size() == 1 && repeats.size() == RETRIES - 1
            && signalKey.equals(String.valueOf(body(received.get(0)).get("idempotency_key")));
        for (GenericRecord repeat : received.size() == 1 ? repeats : List.<GenericRecord>of()) {
          GenericRecord b = body(repeat);
          good &= (long) repeat.get("sequence") == 0 && signalKey.equals(b.get("idempotency_key").toString())
              && (long) b.get("answer_sequence") == (long) received.get(0).get("sequence")
              && b.get("answer_type").toString().equals("SignalReceived");
        }
        good &= !ends.isEmpty() && body(ends.get(0)).get("output").toString().equals("true");
      } else if (!ends.isEmpty() && type(ends.get(0)).equals("RunSucceeded")) {
        JsonNode output = JSON.readTree(body(ends.get(0)).get("output").toString());
        r.set("output", output);
        good &= output.equals(inputs.get(want.getKey())); // the 64-bit integer survived
      }
      if (!ends.isEmpty() && type(ends.get(0)).equals("RunRejected")) {
        r.put("reason", body(ends.get(0)).get("reason").toString());
      }
      r.put("ok", good);
      ok &= good;
    }
    out.put("ok", ok);
    System.out.println(JSON.writeValueAsString(out));
    return ok;
  }

  /** The fingerprint as its 8 little-endian bytes in hex, as on the wire and in docs/contract.md. */
  private static String hex(long fingerprint) {
    StringBuilder s = new StringBuilder();
    for (int i = 0; i < 8; i++) {
      s.append(String.format("%02x", (fingerprint >>> (8 * i)) & 0xff));
    }
    return s.toString();
  }

  private static Properties producerConfig(String bootstrap) {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true"); // retries never duplicate a command
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    return p;
  }

  private static Properties consumerConfig(String bootstrap) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed"); // only committed run events
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    return p;
  }

  private static Map<String, String> options(String[] args) {
    Map<String, String> opt = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value, got " + args[i]);
      }
      opt.put(args[i].substring(2), args[i + 1]);
    }
    return opt;
  }

  private RunfoldExample() {}
}
