// The chat page's elements, and its notice line (one message at a time, above the composer).

const $ = (id) => document.getElementById(id);

export const ui = {
  conn: $("conn"), model: $("model"), about: $("about"), notices: $("notices"), input: $("input"),
  send: $("send"), stop: $("stop"), reset: $("new"), attach: $("attach"), file: $("file"),
  composer: $("composer"), tokenForm: $("token-form"), token: $("token"),
  tokenMessage: $("token-message"), systemForm: $("system-form"), system: $("system"),
  temperature: $("temperature"), topP: $("top-p"), maxNew: $("max-new-tokens"),
  maxNewLimit: $("max-new-tokens-limit"), settingsPanel: $("settings-panel"),
  scroller: $("scroller"), transcript: $("transcript"), jump: $("jump"), attachments: $("attachments"),
};

export const ERROR_HINTS = {
  overloaded: "The server is at capacity. Try again in a moment.",
  busy: "A reply is still being generated. Stop it or wait for it to finish.",
  context_overflow: "The conversation no longer fits the model's context. Start a new conversation.",
};

export function notice(text, kind = "info") {
  const p = document.createElement("p");
  p.className = `notice ${kind}`;
  p.textContent = text;
  if (kind === "error") p.setAttribute("role", "alert");
  ui.notices.replaceChildren(p);
}

export function clearNotice() {
  ui.notices.replaceChildren();
}
