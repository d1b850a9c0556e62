// The wschat chat page: one WebSocket session (PROTOCOL.md), rendered as it streams.

import { Attachments, imageFiles } from "./attachments.js";
import {
  Backoff, MODEL_LOADING_REASON, diagnose, getToken, openSocket, readFrame, sendFrame, setConnection, setToken,
} from "./net.js";
import { Transcript } from "./transcript.js";

const $ = (id) => document.getElementById(id);
const ui = {
  conn: $("conn"), model: $("model"), about: $("about"), notices: $("notices"), input: $("input"),
  send: $("send"), stop: $("stop"), reset: $("new"), attach: $("attach"), file: $("file"),
  composer: $("composer"), tokenForm: $("token-form"), token: $("token"),
  tokenMessage: $("token-message"), systemForm: $("system-form"), system: $("system"),
  temperature: $("temperature"), topP: $("top-p"), maxNew: $("max-new-tokens"),
  maxNewLimit: $("max-new-tokens-limit"), settingsPanel: $("settings-panel"),
};

// PROTOCOL.md section 10: a reply whose connection dropped goes on at the server for its grace
// period (--resume-grace-s, 15 s by default); the page tries to resume it within that.
const RESUME_WINDOW_MS = 15000;

const ERROR_HINTS = {
  overloaded: "The server is at capacity. Try again in a moment.",
  busy: "A reply is still being generated. Stop it or wait for it to finish.",
  context_overflow: "The conversation no longer fits the model's context. Start a new conversation.",
};

const state = {
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

const transcript = new Transcript($("scroller"), $("transcript"), $("jump"), {
  edit: (exchange, text) => editExchange(exchange, text),
  regenerate: (exchange) => regenerate(exchange),
});
const attachments = new Attachments($("attachments"), {
  send: (frame) => send(frame),
  limits: () => state.ready && state.ready.limits,
  onChange: () => updateControls(),
});

function notice(text, kind = "info") {
  const p = document.createElement("p");
  p.className = `notice ${kind}`;
  p.textContent = text;
  if (kind === "error") p.setAttribute("role", "alert");
  ui.notices.replaceChildren(p);
}

function clearNotice() {
  ui.notices.replaceChildren();
}

function connected() {
  return state.ws !== null && state.ws.readyState === WebSocket.OPEN && state.ready !== null;
}

function send(frame) {
  if (!connected()) return false;
  sendFrame(state.ws, frame);
  return true;
}

function updateControls() {
  const busy = state.reply !== null || state.rewind !== null;
  const hasContent = ui.input.value.trim() !== "" || attachments.stagedCount > 0;
  ui.send.disabled = !connected() || busy || !hasContent || attachments.checking;
  ui.stop.disabled = !connected() || state.reply === null;
  ui.reset.disabled = !connected();
  transcript.setSteerable(connected() && !busy, busy);
}

// -- connection -----------------------------------------------------------------------------

function connect() {
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
    if (state.ws === ws) onFrame(readFrame(event));
  };
  ws.onclose = (event) => {
    if (state.ws === ws) onClose(event, opened);
  };
  updateControls();
}

function onClose(event, opened) {
  const hadSession = state.ready !== null;
  state.ready = null;
  state.ws = null;
  updateControls();
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
  updateControls();
}

// After a resume (PROTOCOL.md section 10) the reply in flight goes on when ready.resumed names
// it; its prompt is sent again when the server never got it; else what came of it is shown.
function settleReply(ready, sameSession) {
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

// -- the conversation -----------------------------------------------------------------------

// A reply's place in the conversation is known (PROTOCOL.md "done": `turn`, null when it is not
// kept): a regenerate's new reply stays only when kept, else the old one comes back, as the
// server kept it.
function settle(reply, turn) {
  const exchange = reply.exchange;
  if (exchange.replaced) {
    const undone = exchange.settleRegenerate(turn);
    if (undone) {
      const why = undone.errorText ? `: ${undone.errorText}` : "";
      notice(`The new reply was not kept${why}. The earlier reply stays.`, "warn");
    }
  } else exchange.setTurn(turn);
  transcript.refresh();
}

// After a resume (PROTOCOL.md section 10): a reply that ended while the connection was away is in
// the conversation exactly when it is `resumed.last_prompt`; an edit's rewind took effect when
// the conversation holds `keep` exchanges. Then the page holds what the server holds
// (`resumed.turns`), or what it shows above stops being editable.
function settleConversation(resumed) {
  for (const x of transcript.exchanges) {
    if (x.reply === state.reply || (x.turn !== undefined && !x.replaced)) continue;
    const kept = x.reply.id === resumed.last_prompt;
    settle(x.reply, kept ? resumed.turns : null);
  }
  if (state.rewind && resumed.turns === state.rewind.keep) {
    handlers.rewound({ turns: resumed.turns });
    return;
  }
  dropRewind("The edit did not reach the server. Edit the message again.");
  // a new exchange whose frames follow counts already when it ended while the page was away
  const reply = state.reply;
  const ended = reply && !reply.exchange.replaced && resumed.last_prompt === reply.id ? 1 : 0;
  if (transcript.keptCount + ended !== resumed.turns) {
    transcript.detach(resumed.turns);
    transcript.addDivider("The server's conversation no longer matches the messages above.");
  }
}

function dropRewind(why) {
  if (!state.rewind) return;
  state.rewind = null;
  notice(why, "warn");
}

// -- frames ---------------------------------------------------------------------------------

const handlers = {
  ready(f) {
    const resumed = state.session !== null && f.session === state.session;
    const restarted = state.session !== null && f.session !== state.session;
    state.ready = f;
    state.session = f.session;
    state.resume = f.resume;
    state.backoff.reset();
    if (state.reply) settleReply(f, resumed);
    state.resumeUntil = 0;
    document.body.dataset.session = f.session;
    ui.model.textContent = f.model;
    ui.model.title = f.model; // the header may cut it short
    // what the model can and cannot do, above an empty conversation (the server's line)
    ui.about.textContent = f.about || `Replies come from ${f.model}, a language model: they can be wrong.`;
    ui.tokenForm.hidden = true;
    setConnection(ui.conn, "connected", "Connected");
    applyLimits(f);
    if (resumed) {
      notice("Reconnected: the conversation was kept.");
      settleConversation(f.resumed || {});
    } else if (restarted) {
      attachments.dropStaged();
      transcript.detach(0);
      if (!transcript.empty) transcript.addDivider("New session: the server did not keep the conversation above.");
      notice("Reconnected to a new session.", "warn");
      dropRewind("The edit was not sent: the server started a new session.");
      if (state.appliedSystem) send({ type: "configure", system: state.appliedSystem });
    } else clearNotice();
    updateControls();
  },
  configured() {
    notice(state.appliedSystem ? "System prompt set: the conversation starts afresh." : "System prompt cleared.");
  },
  reset_ok() {
    transcript.clear();
    attachments.dropStaged();
    notice("New conversation.");
  },
  image_ok(f) {
    attachments.accepted(f);
  },
  queued(f) {
    if (state.reply && state.reply.id === f.id) {
      state.reply.queued = true;
      state.promptFrame = null;
      state.reply.setStatus(`Waiting for a free slot (position ${f.position})…`);
    }
  },
  start(f) {
    if (state.reply && state.reply.id === f.id) {
      state.reply.started = true;
      state.promptFrame = null;
      state.reply.setStatus("Generating…");
    }
  },
  token(f) {
    if (state.reply && state.reply.id === f.id) state.reply.append(f.text, f.index);
  },
  done(f) {
    if (!state.reply || state.reply.id !== f.id) return;
    const reply = state.reply;
    reply.finish(f);
    state.reply = null;
    state.promptFrame = null;
    settle(reply, f.turn ?? null);
    updateControls();
  },
  rewound(f) {
    const rewind = state.rewind;
    state.rewind = null;
    if (rewind) {
      transcript.dropFrom(rewind.exchange);
      sendTurn(rewind.text, rewind.exchange.images);
    }
    updateControls();
  },
  error(f) {
    const message = ERROR_HINTS[f.code] ? `${f.message}. ${ERROR_HINTS[f.code]}` : f.message;
    if (f.id && attachments.has(f.id)) attachments.refuse(f.id, f.message);
    else if (f.id && state.reply && state.reply.id === f.id) {
      const reply = state.reply;
      reply.error(message);
      if (reply.finished) {
        state.reply = state.promptFrame = null;
        settle(reply, null); // refused: it changed nothing
      }
    } else if (!f.id && state.rewind) {
      // the rewind was refused and changed nothing: the edit opens again as it was
      const rewind = state.rewind;
      state.rewind = null;
      notice(message, "error");
      updateControls();
      rewind.exchange.edit(rewind.text);
    } else notice(message, "error");
    updateControls();
  },
  goaway(f) {
    state.goingAway = true;
    notice(`The server is shutting down (in ${Math.round(f.in_ms / 1000)} s). This page reconnects when it can.`, "warn");
  },
  pong() {},
};

function onFrame(frame) {
  const handler = handlers[frame.type];
  if (handler) handler(frame);
}

function applyLimits(ready) {
  const limit = ready.limits.max_new_tokens;
  ui.maxNew.max = String(limit);
  ui.maxNewLimit.textContent = `1–${limit}`;
  ui.attach.hidden = !ready.capabilities.images;
}

// -- actions --------------------------------------------------------------------------------

function numberParam(input, parse) {
  if (input.value.trim() === "" || !input.checkValidity()) return undefined;
  return parse(input.value);
}

function params() {
  const p = {
    temperature: numberParam(ui.temperature, Number),
    top_p: numberParam(ui.topP, Number),
    max_new_tokens: numberParam(ui.maxNew, (v) => parseInt(v, 10)),
  };
  return Object.values(p).some((v) => v !== undefined) ? p : undefined;
}

// The settings as they stand are valid; else the settings open on the first invalid one.
function paramsValid() {
  const invalid = [ui.temperature, ui.topP, ui.maxNew].find((i) => !i.checkValidity());
  if (!invalid) return true;
  ui.settingsPanel.open = true;
  notice(`${invalid.labels[0].firstChild.textContent.trim()}: ${invalid.validationMessage}`, "error");
  return false;
}

function newId() {
  return `p-${Date.now().toString(36)}-${++state.counter}`;
}

// A generation's frame goes out with the page's params; its reply is the one in flight.
function startGeneration(frame, reply) {
  const p = params();
  if (p) frame.params = p;
  send(frame);
  state.reply = reply;
  state.promptFrame = frame;
  clearNotice();
  updateControls();
}

// A prompt takes the staged images (the server uses them first), then sends `images` inline:
// an edited message's own, sent again.
function sendTurn(text, images) {
  const id = newId();
  const frame = { type: "prompt", id, text };
  if (images.length) frame.images = images.map((image) => image.data);
  const exchange = transcript.addExchange(text, [...attachments.takeStaged(), ...images], id);
  startGeneration(frame, exchange.reply);
}

function sendPrompt() {
  if (!connected()) {
    if (state.waitForUser) connect();
    return;
  }
  if (state.reply || state.rewind || ui.send.disabled || !paramsValid()) return;
  const text = ui.input.value.trim();
  ui.input.value = "";
  sendTurn(text, []);
}

// Edit (PROTOCOL.md "rewind"): the conversation goes back to before the exchange, and once the
// server says `rewound` the edited text goes as a new prompt, with the message's images.
function editExchange(exchange, text) {
  if (!connected() || state.reply || state.rewind || !paramsValid()) return false;
  const keep = transcript.keptBefore(exchange);
  if (!send({ type: "rewind", keep })) return false;
  state.rewind = { exchange, text, keep };
  clearNotice();
  updateControls();
  ui.input.focus();
  return true;
}

// Regenerate (PROTOCOL.md "regenerate"): the last exchange's reply again, with the page's params
// (without a seed: a sampled reply is drawn afresh); it streams in the old reply's place.
function regenerate(exchange) {
  if (!connected() || state.reply || state.rewind || !paramsValid()) return;
  const id = newId();
  startGeneration({ type: "regenerate", id }, exchange.regenerate(id));
  ui.input.focus();
}

function stop() {
  if (state.reply && send({ type: "cancel", id: state.reply.id })) state.reply.setStatus("Stopping…");
}

ui.composer.addEventListener("submit", (e) => {
  e.preventDefault();
  sendPrompt();
});
ui.input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    sendPrompt();
  }
});
ui.input.addEventListener("input", () => {
  if (state.waitForUser && !state.ws) connect();
  updateControls();
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && state.reply) {
    e.preventDefault();
    stop();
  }
});
ui.stop.addEventListener("click", stop);
ui.reset.addEventListener("click", () => {
  if (!send({ type: "reset" })) return;
  state.rewind = null; // the reset comes first: nothing to edit
  updateControls();
});
ui.systemForm.addEventListener("submit", (e) => {
  e.preventDefault();
  if (state.reply || state.rewind) return notice(ERROR_HINTS.busy, "error");
  state.appliedSystem = ui.system.value.trim();
  if (send({ type: "configure", system: state.appliedSystem })) transcript.clear();
});
ui.tokenForm.addEventListener("submit", (e) => {
  e.preventDefault();
  setToken(ui.token.value.trim());
  ui.token.value = "";
  state.backoff.reset();
  connect();
});

// Images: picker, paste and drag-and-drop all end in attachments.add().
ui.attach.addEventListener("click", () => ui.file.click());
ui.file.addEventListener("change", () => {
  for (const f of ui.file.files) attachments.add(f);
  ui.file.value = "";
});
ui.input.addEventListener("paste", (e) => {
  const files = imageFiles(e.clipboardData);
  if (!files.length) return;
  e.preventDefault();
  for (const f of files) attachments.add(f);
});
ui.composer.addEventListener("dragover", (e) => {
  if ([...e.dataTransfer.types].includes("Files")) {
    e.preventDefault();
    ui.composer.classList.add("dropping");
  }
});
ui.composer.addEventListener("dragleave", () => ui.composer.classList.remove("dropping"));
ui.composer.addEventListener("drop", (e) => {
  const files = imageFiles(e.dataTransfer);
  ui.composer.classList.remove("dropping");
  if (!files.length) return;
  e.preventDefault();
  for (const f of files) attachments.add(f);
});

// The settings stay folded away on a narrow screen (style.css's breakpoint) until opened.
const narrow = matchMedia("(max-width: 760px)");
ui.settingsPanel.open = !narrow.matches;
narrow.addEventListener("change", () => {
  ui.settingsPanel.open = !narrow.matches;
});

connect();
ui.input.focus();
