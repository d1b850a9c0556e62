// msgpack for the wschat browser client: exactly the types the protocol uses (PROTOCOL.md
// "Transport"): nil, bool, int, float64, str, bin, array, map. No ext types, no timestamps.
//
// encode(value) -> Uint8Array
//   null -> nil; boolean -> bool; a Number that is a safe integer -> the smallest int encoding
//   (the server accepts ints for float fields); any other Number -> float64; BigInt -> int
//   (64-bit range); string -> str; Uint8Array / ArrayBuffer -> bin; Array -> array; Map or plain
//   object -> map (undefined members are left out, as JSON does). Float64 wraps a Number that
//   must go out as float64 even when it is integral.
// decode(bytes, {lossless}) -> value
//   ints beyond 2^53 come back as BigInt; str must be valid UTF-8; map keys must be strings;
//   trailing bytes, truncation and unknown type bytes throw MsgpackError. With lossless: true,
//   floats come back as Float64 and maps as Map (keeping key order), so that
//   encode(decode(b, {lossless: true})) reproduces b byte for byte.

export class MsgpackError extends Error {
  constructor(message) {
    super(message);
    this.name = "MsgpackError";
  }
}

export class Float64 {
  constructor(value) {
    this.value = Number(value);
  }
  valueOf() {
    return this.value;
  }
}

// Arrays and maps nest at most this deep, as in the Python codec (msgpack's C unpacker stack).
export const MAX_DEPTH = 1024;
const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

class Writer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.view = new DataView(this.buf.buffer);
    this.len = 0;
  }
  reserve(n) {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const bigger = new Uint8Array(size);
    bigger.set(this.buf.subarray(0, this.len));
    this.buf = bigger;
    this.view = new DataView(bigger.buffer);
  }
  u8(v) {
    this.reserve(1);
    this.buf[this.len++] = v;
  }
  // A type byte followed by a big-endian field written with the DataView setter named.
  fixed(tag, width, setter, v) {
    this.reserve(1 + width);
    this.buf[this.len++] = tag;
    this.view[setter](this.len, v);
    this.len += width;
  }
  bytes(b) {
    this.reserve(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
  }
  result() {
    return this.buf.slice(0, this.len);
  }
}

const UINT64_MAX = (1n << 64n) - 1n;
const INT64_MIN = -(1n << 63n);

function writeInt(w, n) {
  if (n >= 0) {
    if (n < 0x80) w.u8(n);
    else if (n < 0x100) w.fixed(0xcc, 1, "setUint8", n);
    else if (n < 0x10000) w.fixed(0xcd, 2, "setUint16", n);
    else if (n < 0x100000000) w.fixed(0xce, 4, "setUint32", n);
    else w.fixed(0xcf, 8, "setBigUint64", BigInt(n));
  } else if (n >= -32) w.u8(n & 0xff);
  else if (n >= -0x80) w.fixed(0xd0, 1, "setInt8", n);
  else if (n >= -0x8000) w.fixed(0xd1, 2, "setInt16", n);
  else if (n >= -0x80000000) w.fixed(0xd2, 4, "setInt32", n);
  else w.fixed(0xd3, 8, "setBigInt64", BigInt(n));
}

function writeBigInt(w, n) {
  if (n > UINT64_MAX || n < INT64_MIN) throw new MsgpackError(`integer ${n} is out of 64-bit range`);
  if (n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER)) {
    writeInt(w, Number(n));
  } else if (n >= 0n) w.fixed(0xcf, 8, "setBigUint64", n);
  else w.fixed(0xd3, 8, "setBigInt64", n);
}

function writeFloat(w, x) {
  w.fixed(0xcb, 8, "setFloat64", x);
}

function writeSized(w, n, small, smallMax, tags) {
  if (small !== null && n <= smallMax) w.u8(small | n);
  else if (tags[0] !== null && n < 0x100) w.fixed(tags[0], 1, "setUint8", n);
  else if (n < 0x10000) w.fixed(tags[1], 2, "setUint16", n);
  else if (n < 0x100000000) w.fixed(tags[2], 4, "setUint32", n);
  else throw new MsgpackError(`length ${n} is too large for msgpack`);
}

function writeMapEntries(w, entries, depth) {
  enter(depth);
  const present = entries.filter(([, v]) => v !== undefined);
  writeSized(w, present.length, 0x80, 15, [null, 0xde, 0xdf]);
  for (const [k, v] of present) {
    if (typeof k !== "string") throw new MsgpackError("map keys must be strings");
    writeValue(w, k, depth + 1);
    writeValue(w, v, depth + 1);
  }
}

// depth: how many arrays and maps enclose this value.
function writeValue(w, value, depth) {
  if (value === null) w.u8(0xc0);
  else if (value === false) w.u8(0xc2);
  else if (value === true) w.u8(0xc3);
  else if (typeof value === "number") {
    if (Number.isSafeInteger(value) && !Object.is(value, -0)) writeInt(w, value);
    else writeFloat(w, value);
  } else if (typeof value === "bigint") writeBigInt(w, value);
  else if (value instanceof Float64) writeFloat(w, value.value);
  else if (typeof value === "string") {
    const b = utf8Encoder.encode(value);
    writeSized(w, b.length, 0xa0, 31, [0xd9, 0xda, 0xdb]);
    w.bytes(b);
  } else if (value instanceof Uint8Array || value instanceof ArrayBuffer) {
    const b = value instanceof Uint8Array ? value : new Uint8Array(value);
    writeSized(w, b.length, null, 0, [0xc4, 0xc5, 0xc6]);
    w.bytes(b);
  } else if (Array.isArray(value)) {
    enter(depth);
    writeSized(w, value.length, 0x90, 15, [null, 0xdc, 0xdd]);
    for (const item of value) writeValue(w, item, depth + 1);
  } else if (value instanceof Map) writeMapEntries(w, [...value.entries()], depth);
  else if (typeof value === "object") writeMapEntries(w, Object.entries(value), depth);
  else throw new MsgpackError(`cannot encode a ${typeof value}`);
}

export function encode(value) {
  const w = new Writer();
  writeValue(w, value, 0);
  return w.result();
}

class Reader {
  constructor(bytes, lossless) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
    this.lossless = lossless;
  }
  need(n) {
    if (this.pos + n > this.bytes.length) throw new MsgpackError("truncated msgpack");
  }
  take(n) {
    this.need(n);
    const start = this.pos;
    this.pos += n;
    return start;
  }
  u8() {
    return this.view.getUint8(this.take(1));
  }
  u16() {
    return this.view.getUint16(this.take(2));
  }
  u32() {
    return this.view.getUint32(this.take(4));
  }
  slice(n) {
    const start = this.take(n);
    return this.bytes.slice(start, start + n);
  }
}

function bigToValue(n) {
  return n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER)
    ? Number(n)
    : n;
}

function readStr(r, n) {
  const start = r.take(n);
  try {
    return utf8Decoder.decode(r.bytes.subarray(start, start + n));
  } catch {
    throw new MsgpackError("str is not valid UTF-8");
  }
}

function enter(depth) {
  if (depth >= MAX_DEPTH) throw new MsgpackError(`nested deeper than ${MAX_DEPTH} arrays and maps`);
}

// depth: how many arrays and maps enclose this one.
function readArray(r, n, depth) {
  enter(depth);
  r.need(n); // every item takes at least one byte: refuse impossible lengths before allocating
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = readValue(r, depth + 1);
  return out;
}

function readMap(r, n, depth) {
  enter(depth);
  r.need(2 * n);
  const out = r.lossless ? new Map() : Object.create(null);
  for (let i = 0; i < n; i++) {
    const key = readValue(r, depth + 1);
    if (typeof key !== "string") throw new MsgpackError("map keys must be strings");
    const value = readValue(r, depth + 1);
    if (r.lossless) out.set(key, value);
    else Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

function readFloat(r, x) {
  return r.lossless ? new Float64(x) : x;
}

// Type bytes with a length or value in a following big-endian field.
const SIZED = {
  0xc4: (r) => r.slice(r.u8()),
  0xc5: (r) => r.slice(r.u16()),
  0xc6: (r) => r.slice(r.u32()),
  0xca: (r) => readFloat(r, r.view.getFloat32(r.take(4))),
  0xcb: (r) => readFloat(r, r.view.getFloat64(r.take(8))),
  0xcc: (r) => r.u8(),
  0xcd: (r) => r.u16(),
  0xce: (r) => r.u32(),
  0xcf: (r) => bigToValue(r.view.getBigUint64(r.take(8))),
  0xd0: (r) => r.view.getInt8(r.take(1)),
  0xd1: (r) => r.view.getInt16(r.take(2)),
  0xd2: (r) => r.view.getInt32(r.take(4)),
  0xd3: (r) => bigToValue(r.view.getBigInt64(r.take(8))),
  0xd9: (r) => readStr(r, r.u8()),
  0xda: (r) => readStr(r, r.u16()),
  0xdb: (r) => readStr(r, r.u32()),
  0xdc: (r, d) => readArray(r, r.u16(), d),
  0xdd: (r, d) => readArray(r, r.u32(), d),
  0xde: (r, d) => readMap(r, r.u16(), d),
  0xdf: (r, d) => readMap(r, r.u32(), d),
};

function readValue(r, depth) {
  const b = r.u8();
  if (b <= 0x7f) return b;
  if (b >= 0xe0) return b - 0x100;
  if (b <= 0x8f) return readMap(r, b & 0x0f, depth);
  if (b <= 0x9f) return readArray(r, b & 0x0f, depth);
  if (b <= 0xbf) return readStr(r, b & 0x1f);
  if (b === 0xc0) return null;
  if (b === 0xc2) return false;
  if (b === 0xc3) return true;
  const read = SIZED[b];
  if (read === undefined) throw new MsgpackError(`unsupported msgpack type byte 0x${b.toString(16)}`);
  return read(r, depth);
}

export function decode(data, { lossless = false } = {}) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  const r = new Reader(bytes, lossless);
  const value = readValue(r, 0);
  if (r.pos !== bytes.length) throw new MsgpackError("bytes after the msgpack value");
  return value;
}
