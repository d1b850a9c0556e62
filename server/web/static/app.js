// The wschat chat page: one WebSocket session (PROTOCOL.md), rendered as it streams.
//
// session.js drives the socket (connect, resume, back off, ask for a token) and hands each frame
// to conversation.js, which applies it to the transcript (transcript.js) and the images
// (attachments.js); composer.js holds what the reader does. Here they are put together.

import { Attachments } from "./attachments.js";
import { composer } from "./composer.js";
import { conversation } from "./conversation.js";
import { ui } from "./page.js";
import { connected, send, startSession, state } from "./session.js";
import { Transcript } from "./transcript.js";

const transcript = new Transcript(ui.scroller, ui.transcript, ui.jump, {
  edit: (exchange, text) => actions.editExchange(exchange, text),
  regenerate: (exchange) => actions.regenerate(exchange),
});
const attachments = new Attachments(ui.attachments, {
  send: (frame) => send(frame),
  limits: () => state.ready && state.ready.limits,
  onChange: () => updateControls(),
});

function updateControls() {
  const busy = state.reply !== null || state.rewind !== null;
  const hasContent = ui.input.value.trim() !== "" || attachments.stagedCount > 0;
  ui.send.disabled = !connected() || busy || !hasContent || attachments.checking;
  ui.stop.disabled = !connected() || state.reply === null;
  ui.reset.disabled = !connected();
  transcript.setSteerable(connected() && !busy, busy);
}

const actions = composer({ transcript, attachments, updateControls });
const onFrame = conversation({ transcript, attachments, updateControls, sendTurn: actions.sendTurn });
startSession({ onFrame, onChange: updateControls });
ui.input.focus();
