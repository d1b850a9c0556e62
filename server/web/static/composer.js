// What the reader does: send a prompt (Enter, or the Send button) with the settings' params and
// the staged images, edit a message, regenerate the last reply, stop one, start afresh, set the
// system prompt, and attach images (picker, paste, drag-and-drop).

import { imageFiles } from "./attachments.js";
import { ERROR_HINTS, clearNotice, notice, ui } from "./page.js";
import { connect, connected, send, state } from "./session.js";

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

// The page's actions, its controls bound to them; updateControls() is the page's (app.js).
export function composer({ transcript, attachments, updateControls }) {
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

  // Regenerate (PROTOCOL.md "regenerate"): the last exchange's reply again, with the page's
  // params (without a seed: a sampled reply is drawn afresh); it streams in the old reply's place.
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

  return { sendTurn, editExchange, regenerate };
}
