'use strict';
// The runfold contract for Node (docs/contract.md): schemas, single-object framing, json fields.
const fs = require('fs');
const path = require('path');
const avro = require('avsc');
// json fields carry 64-bit integers: JSON.parse would round those above 2^53, json-bigint does not.
// Its objects have no prototype, so keys such as "constructor" and "__proto__" are plain data:
// keep them (its default throws on them, and one run's output would stop the consumer).
const JSONbig = require('json-bigint')({useNativeBigInt: true, protoAction: 'preserve',
                                         constructorAction: 'preserve'});

// avsc ignores unknown logical types; this one turns runfold's `json` strings into values and back.
// JSON null is the text "null" in a json field (SignalRun.payload, StartRun.input); in an optional
// one (["null", json]) it takes the null branch instead, which runfold reads as null too (absent
// and JSON null are one for ?json fields): _check refuses null so the union never sees two branches.
class JsonType extends avro.types.LogicalType {
  _fromValue(text) { return JSONbig.parse(text); }
  _toValue(value) { return value === undefined ? undefined : JSONbig.stringify(value); }
  _check(value, flags, hook, path) {
    return value !== null && value !== undefined && super._check(value, flags, hook, path);
  }
  _resolve(type) {
    if (avro.Type.isType(type, 'string', 'logical:json')) {
      return this._fromValue;
    }
  }
}

// CRC-64-AVRO (the Avro specification's fingerprint) of a schema's Parsing Canonical Form.
const EMPTY = 0xc15d213aa4d7a795n;
const TABLE = Array.from({length: 256}, (_, i) => {
  let fp = BigInt(i);
  for (let j = 0; j < 8; j++) fp = (fp >> 1n) ^ (EMPTY & -(fp & 1n));
  return fp;
});

function fingerprint64(type) {
  let fp = EMPTY;
  for (const b of Buffer.from(JSON.stringify(type.schema()), 'utf8')) {  // schema(): the canonical form
    fp = (fp >> 8n) ^ TABLE[Number((fp ^ BigInt(b)) & 0xffn)];
  }
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(fp);  // on the wire: the 8 little-endian bytes
  return out;
}

const MAGIC = Buffer.from([0xc3, 0x01]);

class Topic {
  // One topic's value schema, from its self-contained file (schemas/standalone/<name>.avsc).
  constructor(schemaDir, fullName) {
    const schema = JSON.parse(fs.readFileSync(path.join(schemaDir, `${fullName}.avsc`), 'utf8'));
    this.type = avro.Type.forSchema(schema, {logicalTypes: {json: JsonType}});
    this.fingerprint = fingerprint64(this.type);
    this.header = Buffer.concat([MAGIC, this.fingerprint]);
  }

  encode(record) {
    return Buffer.concat([this.header, this.type.toBuffer(record)]);
  }

  decode(buf) {
    if (!buf.subarray(0, 2).equals(MAGIC) || !buf.subarray(2, 10).equals(this.fingerprint)) {
      throw new Error(`not written with this schema: header ${buf.subarray(0, 10).toString('hex')}`);
    }
    return this.type.fromBuffer(buf.subarray(10));
  }
}

// An envelope's body is a union of records: avsc wraps it as {"runfold.StartRun": {...}}.
function bodyOf(envelope) {
  const [name] = Object.keys(envelope.body);
  return {type: name.replace(/^runfold\./, ''), ...envelope.body[name]};
}

module.exports = {Topic, bodyOf, JSONbig};
