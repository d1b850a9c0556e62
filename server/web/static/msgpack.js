// msgpack for the pages: @msgpack/msgpack (vendor/README) held to the protocol's rules
// (PROTOCOL.md "Transport"), as the server's codec holds them.
//
// decode(bytes) -> value: map keys must be strings and str valid UTF-8; ext types, trailing bytes
//   and truncation throw; arrays and maps nest at most MAX_DEPTH deep; an int beyond 2^53 comes
//   back as a BigInt, any other number as a Number.
// encode(value) -> Uint8Array: a Number that is a safe integer goes out as an int (the server
//   takes ints for float fields), any other as float64; a BigInt as a 64-bit int; a Uint8Array
//   or ArrayBuffer as bin; an Array as array; a Map or plain object as map, its undefined
//   members left out, as JSON does.

import { DecodeError, Decoder, Encoder } from "./vendor/msgpack/index.mjs";

// Arrays and maps nest at most this deep, as in the Python codec (msgpack's C unpacker stack).
export const MAX_DEPTH = 1024;
const utf8 = new TextDecoder("utf-8", { fatal: true });

function text(bytes) {
  try {
    return utf8.decode(bytes);
  } catch {
    throw new DecodeError("str is not valid UTF-8");
  }
}

// The protocol uses no ext type: none is made, each one read is refused.
const NO_EXTENSIONS = {
  tryToEncode: () => null,
  decode: () => {
    throw new DecodeError("msgpack ext types are not part of the protocol");
  },
};

const rules = {
  extensionCodec: NO_EXTENSIONS,
  useBigInt64: true,
  // every key is read here, strictly (the library lets bad UTF-8 through as other characters)
  keyDecoder: {
    canBeCached: () => true,
    decode: (bytes, at, length) => text(bytes.subarray(at, at + length)),
  },
  mapKeyConverter: (key) => {
    if (typeof key !== "string") throw new DecodeError("map keys must be strings");
    return key;
  },
};
// The library reads a str value as leniently as a key: the bytes are read twice, once with str
// values as text and once as their bytes, and each text is made again from its bytes, strictly.
const asText = new Decoder(rules);
const asBytes = new Decoder({ ...rules, rawStrings: true });
const encoder = new Encoder({
  extensionCodec: NO_EXTENSIONS,
  useBigInt64: true,
  ignoreUndefined: true,
  maxDepth: MAX_DEPTH,
});

// depth: how many arrays and maps enclose value; raw: the same value read with str as bytes.
function checked(value, raw, depth) {
  if (typeof value === "string") return text(raw);
  if (typeof value === "bigint") {
    const safe = value >= Number.MIN_SAFE_INTEGER && value <= Number.MAX_SAFE_INTEGER;
    return safe ? Number(value) : value;
  }
  if (value === null || typeof value !== "object" || value instanceof Uint8Array) return value;
  if (depth >= MAX_DEPTH) throw new DecodeError(`nested deeper than ${MAX_DEPTH} arrays and maps`);
  for (const key of Object.keys(value)) value[key] = checked(value[key], raw[key], depth + 1);
  return value;
}

export function decode(bytes) {
  return checked(asText.decode(bytes), asBytes.decode(bytes), 0);
}

// value in the forms the library writes as the protocol wants them: a whole Number past 32 bits
// as a BigInt (with BigInts on, the library would write that Number as a float), an ArrayBuffer
// as a Uint8Array and a Map as a plain object (the library writes neither).
function writable(value) {
  if (typeof value === "number") {
    const wide = Number.isSafeInteger(value) && (value >= 2 ** 32 || value < -(2 ** 31));
    return wide ? BigInt(value) : value;
  }
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (value === null || typeof value !== "object" || ArrayBuffer.isView(value)) return value;
  if (Array.isArray(value)) return value.map(writable);
  const entries = value instanceof Map ? [...value] : Object.entries(value);
  if (entries.some(([key]) => typeof key !== "string")) {
    throw new TypeError("map keys must be strings");
  }
  return Object.fromEntries(entries.map(([key, item]) => [key, writable(item)]));
}

export function encode(value) {
  return encoder.encode(writable(value));
}
