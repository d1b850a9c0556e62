// The page's one WebSocket session (PROTOCOL.md): connecting, resuming a reply whose connection
// dropped, backing off when the server is away or full, and asking for a token when it wants one.
// What the frames mean is the conversation's (conversation.js): each one goes to `hooks.onFrame`.

import {
  Backoff, MODEL_LOADING_REASON, diagnose, getToken, openSocket, readFrame, sendFrame, setConnection, setToken,
} from "./net.js";
import { notice, ui } from "./page.js";

// PROTOCOL.md section 10: a reply whose connection dropped goes on at the server for its grace
// period (--resume-grace-s, 15 s by default); the page tries to resume it within that.
const RESUME_WINDOW_MS = 15000;

export const state = {
  ws: null,
  ready: null, // the last ready frame
  session: null,
  resume: null,
  reply: null, // the Reply being generated
  rewind: null, // an edit's rewind, until `rewound`: {exchange, text, keep}
  promptFrame: null, // its prompt or regenerate, until the server took it (sent again if a drop lost it)
  resumeUntil: 0, // while resuming a dropped reply: when to give up (ms since the epoch)
  resumeBackoff: new Backoff(100, 2000),
  appliedSystem: "",
  counter: 0,
  backoff: new Backoff(),
  retryTimer: 0,
  goingAway: false,
  waitForUser: false, // reconnect on the next user action rather than on a timer
};

// onFrame(frame) takes each frame the server sends; onChange() after the connection changed.
const hooks = { onFrame() {}, onChange() {} };

export function connected() {
  return state.ws !== null && state.ws.readyState === WebSocket.OPEN && state.ready !== null;
}

export function send(frame) {
  if (!connected()) return false;
  sendFrame(state.ws, frame);
  return true;
}

// The session starts: frames go to onFrame from now on.
export function startSession({ onFrame, onChange }) {
  hooks.onFrame = onFrame;
  hooks.onChange = onChange;
  ui.tokenForm.addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(ui.token.value.trim());
    ui.token.value = "";
    state.backoff.reset();
    connect();
  });
  connect();
}

export function connect() {
  clearTimeout(state.retryTimer);
  state.waitForUser = false;
  state.ready = null;
  state.goingAway = false;
  setConnection(ui.conn, "connecting", state.session ? "Reconnecting…" : "Connecting…");
  // PROTOCOL.md section 10: the session (its routing key), its token, and the last token index
  // of the reply in flight
  const last = state.reply && state.resumeUntil ? String(state.reply.lastIndex) : "";
  const query = { session: state.resume ? state.session : "", resume: state.resume, last };
  const ws = openSocket("/v1/chat", { token: getToken(), query });
  state.ws = ws;
  let opened = false;
  ws.onopen = () => {
    opened = true;
  };
  ws.onmessage = (event) => {
    if (state.ws === ws) hooks.onFrame(readFrame(event));
  };
  ws.onclose = (event) => {
    if (state.ws === ws) onClose(event, opened);
  };
  hooks.onChange();
}

function onClose(event, opened) {
  const hadSession = state.ready !== null;
  state.ready = null;
  state.ws = null;
  hooks.onChange();
  if (state.reply && resumeReply(event, hadSession)) return;
  state.resumeUntil = 0;
  if (state.reply) endReply("The connection dropped; the server keeps what was generated.");
  if (!opened) {
    handshakeFailed();
    return;
  }
  if (event.code === 1008) {
    setConnection(ui.conn, "disconnected", "Disconnected");
    notice(`The server closed the connection: ${event.reason || "policy violation"}. Send a message to reconnect.`, "error");
    state.waitForUser = true;
    return;
  }
  if (event.code === 1000 && !state.goingAway) {
    setConnection(ui.conn, "disconnected", "Disconnected");
    notice("The session was closed (idle). It reconnects when you type.");
    state.waitForUser = true;
    return;
  }
  if (event.code === 1013) return tryAgainLater(event.reason);
  const closed = event.reason ? `The server closed the connection: ${event.reason}.` : "The server closed the connection.";
  const why = {
    1001: "The server is shutting down or restarting.",
  }[event.code] || (hadSession ? "The connection to the server was lost." : closed);
  retryLater(why);
}

// A connection that dropped mid-reply (no close frame) is opened again at once, then after
// 0.1 s, 0.2 s, 0.4 s ... (at most 2 s apart) until RESUME_WINDOW_MS is over; the reply stays
// open and goes on where it was. False once the window is over: the reply ends as interrupted.
function resumeReply(event, hadSession) {
  if (hadSession && event.wasClean) return false;
  if (hadSession) {
    state.resumeUntil = Date.now() + RESUME_WINDOW_MS;
    state.resumeBackoff.reset();
  } else if (!state.resumeUntil) return false; // not one of our tries
  const delay = hadSession ? 0 : state.resumeBackoff.next();
  if (Date.now() + delay > state.resumeUntil) return false;
  state.reply.setStatus("The connection dropped — resuming…");
  setConnection(ui.conn, "connecting", "Reconnecting…");
  clearTimeout(state.retryTimer);
  state.retryTimer = setTimeout(connect, delay);
  return true;
}

function endReply(why) {
  state.reply.interrupt(why);
  state.reply = null;
  state.promptFrame = null;
  hooks.onChange();
}

// After a resume (PROTOCOL.md section 10) the reply in flight goes on when ready.resumed names
// it; its prompt is sent again when the server never got it; else what came of it is shown.
export function settleReply(ready, sameSession) {
  const resumed = sameSession ? ready.resumed || {} : {};
  const id = state.reply.id;
  if (resumed.reply === id) {
    state.reply.setStatus(state.reply.started ? "Generating…" : "Sending…");
  } else if (resumed.last_prompt === id) {
    endReply("The connection dropped; the rest of this reply was lost (the conversation keeps it as stopped).");
  } else if (sameSession && state.promptFrame) {
    send(state.promptFrame);
  } else {
    endReply("The connection dropped; the server keeps what was generated.");
  }
}

// PROTOCOL.md "Close codes": 1013 is a loading model (its reason says so) or a full server.
function tryAgainLater(reason) {
  if (reason === MODEL_LOADING_REASON) return retryLater("The model is still loading.", "loading");
  retryLater(reason ? `The server turned this connection away: ${reason}.` : "The server is full right now.");
}

async function handshakeFailed() {
  const token = getToken();
  const verdict = await diagnose(token);
  if (state.ws !== null) return; // something else reconnected meanwhile
  if (verdict === "needs-token") return askForToken("This server needs an access token.");
  if (verdict === "refused-token") return askForToken("The server refused this access token.");
  if (verdict === "loading") return retryLater("The model is still loading.", "loading");
  const why = {
    unreachable: "The server cannot be reached.",
    ok: "The server refused the connection (it may be full, or this page's origin is not allowed).",
  }[verdict];
  retryLater(why);
}

// Try again after the backoff's next delay; "loading" says the server is up but cannot chat yet.
function retryLater(why, status = "disconnected") {
  const delay = state.backoff.next();
  const seconds = Math.max(1, Math.round(delay / 1000));
  const label = status === "loading" ? "Model loading" : "Disconnected";
  setConnection(ui.conn, status, `${label} — retrying in ${seconds} s`);
  notice(`${why} Reconnecting in ${seconds} s…`, "warn");
  state.retryTimer = setTimeout(connect, delay);
}

function askForToken(message) {
  clearTimeout(state.retryTimer);
  setConnection(ui.conn, "auth", "Token needed");
  ui.tokenForm.hidden = false;
  ui.tokenMessage.textContent = message;
  notice(message, "error");
  ui.token.focus();
}
