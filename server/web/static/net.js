// What the chat page and the dashboard share: the token (kept in sessionStorage only), socket
// URLs, the subprotocol list, telling a refused token from a server that is down, and backoff.

import { decode, encode } from "./msgpack.js";

const TOKEN_KEY = "wschat.token";
const SUBPROTOCOL = "wschat.v1";
// PROTOCOL.md "Close codes": a 1013 with exactly this reason means the model is still loading
// (worth waiting for); any other 1013 reason means the server is full.
export const MODEL_LOADING_REASON = "the model is still loading";
// RFC 7230 token characters: anything else cannot travel in Sec-WebSocket-Protocol.
const SUBPROTOCOL_SAFE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// PROTOCOL.md "Authentication": browsers cannot set headers, so the token goes in the
// subprotocol list; a token with characters a subprotocol cannot hold falls back to ?token=.
export function openSocket(path, { token = "", query = {} } = {}) {
  const url = new URL(path, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  const protocols = [SUBPROTOCOL];
  if (token && SUBPROTOCOL_SAFE.test(token)) protocols.push("bearer." + token);
  else if (token) url.searchParams.set("token", token);
  for (const [k, v] of Object.entries(query)) if (v) url.searchParams.set(k, v);
  const ws = new WebSocket(url, protocols);
  ws.binaryType = "arraybuffer";
  return ws;
}

export function sendFrame(ws, frame) {
  ws.send(encode(frame));
}

export function readFrame(event) {
  if (!(event.data instanceof ArrayBuffer)) throw new Error("the server sent a text message");
  const frame = decode(new Uint8Array(event.data));
  if (frame === null || typeof frame !== "object" || typeof frame.type !== "string") {
    throw new Error("the server sent something that is not a frame");
  }
  return frame;
}

async function fetchWithTimeout(path, options, ms = 5000) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), ms);
  try {
    return await fetch(path, { ...options, cache: "no-store", signal: controller.signal });
  } finally {
    clearTimeout(timer);
  }
}

// Why a WebSocket did not open: a browser is told nothing about a refused handshake, so ask
// over HTTP. Returns "ok", "needs-token", "refused-token", "loading" or "unreachable".
export async function diagnose(token) {
  try {
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const auth = await fetchWithTimeout("/v1/auth", { headers });
    if (auth.status === 401) return token ? "refused-token" : "needs-token";
    const ready = await fetchWithTimeout("/readyz", {});
    if (ready.status === 503) return "loading";
    return "ok";
  } catch {
    return "unreachable";
  }
}

// Exponential backoff with jitter: 0.5 s, 1 s, 2 s ... capped, reset once a session is ready.
export class Backoff {
  constructor(firstMs = 500, maxMs = 10000) {
    this.firstMs = firstMs;
    this.maxMs = maxMs;
    this.attempt = 0;
  }
  next() {
    const base = Math.min(this.maxMs, this.firstMs * 2 ** this.attempt);
    this.attempt += 1;
    return Math.round(base * (0.8 + Math.random() * 0.4));
  }
  reset() {
    this.attempt = 0;
  }
}

export function setConnection(el, state, text) {
  el.dataset.state = state;
  el.textContent = text;
}
