// The conversation as the reader sees it. A reply is markdown (markdown.js), rendered again
// once per animation frame while it streams; only its blocks that changed are replaced, so a
// streamed reply never flickers. A user's message is plain text. The view follows new text
// only while the reader is at the bottom.
//
// The page shows the server's conversation: each user message and its reply is an Exchange,
// numbered as `done.turn` numbers it (PROTOCOL.md "rewind"); one the conversation does not hold
// (a failed or refused reply, one stopped while it waited) is marked "Not kept" and never
// counts. A user message has an Edit button, the conversation's last reply a Regenerate one.

import { MarkdownView } from "./markdown.js";

const STICK_PX = 48;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function formatMs(ms) {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}

export function timingSummary(done) {
  const t = done.timing;
  const parts = [];
  parts.push(t.ttft_ms === null || t.ttft_ms === undefined ? "no tokens" : `first token ${formatMs(t.ttft_ms)}`);
  if (t.decode_tokens_per_s > 0) parts.push(`${t.decode_tokens_per_s.toFixed(1)} tokens/s`);
  parts.push(`${done.usage.completion_tokens} tokens`);
  parts.push(`total ${formatMs(t.total_ms)}`);
  return parts.join(" · ");
}

const REASON_LABELS = {
  cancelled: "Stopped",
  length: "Length limit reached",
  error: "Failed",
};

let editors = 0; // names each editor's key hint

// Why the Edit and Regenerate buttons are off (their accessible description says so).
const STEER_BUSY = "Stop the reply or wait for it to finish first";
const STEER_OFFLINE = "Available once connected";

function button(text, className, onClick) {
  const b = el("button", className, text);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

// A message's header: who wrote it, its badges, and its buttons at the end.
function header(who) {
  const head = el("div", "who", who);
  const tools = el("span", "tools");
  head.append(tools);
  return { head, tools };
}

export class Reply {
  constructor(transcript, id) {
    this.transcript = transcript;
    this.id = id;
    this.started = false;
    this.queued = false;
    this.finished = false;
    this.li = el("li", "msg assistant streaming");
    this.li.dataset.id = id;
    // its blocks are replaced as it streams: a screen reader reads the reply once it is whole
    this.li.setAttribute("aria-busy", "true");
    const { head, tools } = header("Model");
    this.head = head;
    this.tools = tools;
    this.li.append(head);
    this.errorText = ""; // the last error shown in it
    this.body = el("div", "text md");
    this.view = new MarkdownView(this.body);
    this.source = ""; // the reply's text so far
    this.status = el("div", "meta", "Sending…");
    this.li.append(this.body, this.status);
    this.pending = "";
    this.frame = 0;
    this.lastIndex = 0; // the index of the last token frame shown: a resume's "last"
  }

  // PROTOCOL.md section 10: a resumed stream goes on after the last index; a frame at or below
  // it would be text shown twice.
  append(text, index) {
    if (index !== undefined) {
      if (index <= this.lastIndex) return;
      this.lastIndex = index;
    }
    this.pending += text;
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  flush() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    if (!this.pending) return;
    this.source += this.pending;
    this.pending = "";
    this.view.render(this.source);
    this.transcript.follow();
  }

  ended() {
    this.li.classList.remove("streaming");
    this.li.removeAttribute("aria-busy");
  }

  setStatus(text) {
    this.status.textContent = text;
    this.transcript.follow();
  }

  addBadge(text, kind) {
    const badge = el("span", `badge ${kind}`, text);
    this.head.insertBefore(badge, this.tools);
    return badge;
  }

  finish(done) {
    this.flush();
    this.finished = true;
    this.ended();
    this.li.dataset.reason = done.reason;
    const label = REASON_LABELS[done.reason];
    if (label) this.addBadge(label, done.reason);
    this.setStatus(timingSummary(done));
    this.status.classList.add("timing");
  }

  // An error frame for this prompt: shown in the reply; a prompt refused outright ends here.
  error(message) {
    this.flush();
    this.errorText = message;
    const note = el("div", "error-text", message);
    note.setAttribute("role", "alert");
    this.li.insertBefore(note, this.status);
    if (!this.started && !this.queued) {
      this.finished = true;
      this.ended();
      this.li.dataset.reason = "refused";
      this.addBadge("Refused", "error");
      this.setStatus("");
    }
    this.transcript.follow();
  }

  interrupt(text) {
    this.flush();
    if (this.finished) return;
    this.finished = true;
    this.ended();
    this.li.dataset.reason = "interrupted";
    this.addBadge("Interrupted", "cancelled");
    this.setStatus(text);
  }
}

// One user message and its reply. `turn` is the exchange's place in the server's conversation:
// a number once `done.turn` gave it, null when the conversation does not hold it, undefined
// while its reply runs (or while a dropped connection leaves it unknown).
export class Exchange {
  constructor(transcript, text, images, id) {
    this.transcript = transcript;
    this.text = text;
    this.images = images; // [{url, data}]: the bytes are sent again when the message is edited
    this.turn = undefined;
    this.replaced = null; // the reply a regenerate may replace, until it is settled
    this.li = el("li", "msg user");
    const { head, tools } = header("You");
    this.editButton = button("Edit", "edit", () => this.edit(this.text));
    tools.append(this.editButton);
    this.li.append(head);
    if (images.length) {
      const strip = el("div", "thumbs");
      for (const image of images) {
        const img = el("img");
        img.src = image.url;
        img.alt = "attached image";
        strip.append(img);
      }
      this.li.append(strip);
    }
    this.textBox = el("div", "text", text);
    this.textBox.hidden = !text;
    this.li.append(this.textBox);
    this.editor = null;
    this.reply = this.newReply(id);
  }

  newReply(id) {
    const reply = new Reply(this.transcript, id);
    reply.exchange = this;
    return reply;
  }

  get kept() {
    return typeof this.turn === "number";
  }

  // The inline editor: Enter saves, Shift+Enter adds a line, Escape (or Cancel) puts the message
  // back as it was and focus back on its Edit button.
  edit(text) {
    if (this.editor) return;
    this.transcript.closeEditors();
    const form = el("form", "editor");
    const area = el("textarea");
    area.value = text;
    area.rows = Math.min(8, Math.max(2, text.split("\n").length));
    area.setAttribute("aria-label", this.editButton.getAttribute("aria-label"));
    const save = el("button", "primary", "Save");
    save.type = "submit";
    const cancel = button("Cancel", "", () => this.closeEditor(true));
    const actions = el("div", "actions");
    const keys = el("div", "hint", "Enter saves and sends, Shift+Enter adds a line, Esc cancels");
    keys.id = `edit-keys-${++editors}`;
    area.setAttribute("aria-describedby", keys.id);
    actions.append(el("span", "spacer"), cancel, save);
    form.append(area, keys, actions);
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.save();
    });
    area.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.save();
      } else if (e.key === "Escape") {
        e.preventDefault();
        e.stopPropagation(); // not the page's Escape, which stops a reply
        this.closeEditor(true);
      }
    });
    this.editor = { form, area, save };
    this.textBox.hidden = true;
    this.editButton.hidden = true;
    this.li.append(form);
    this.transcript.refresh();
    area.focus();
    area.setSelectionRange(area.value.length, area.value.length);
  }

  save() {
    const text = this.editor.area.value.trim();
    if (this.editor.save.disabled || (!text && !this.images.length)) return;
    if (this.transcript.actions.edit(this, text)) this.closeEditor(false);
  }

  closeEditor(refocus) {
    if (!this.editor) return;
    this.editor.form.remove();
    this.editor = null;
    this.textBox.hidden = !this.text;
    this.editButton.hidden = false;
    this.transcript.refresh();
    if (refocus) this.editButton.focus();
  }

  remove() {
    this.li.remove();
    this.reply.li.remove();
  }

  // Whether the conversation holds this exchange; one it does not is marked so.
  setTurn(turn) {
    this.turn = turn;
    for (const li of [this.li, this.reply.li]) li.dataset.turn = turn === null ? "none" : String(turn);
    if (turn === null && !this.notKept) {
      this.notKept = this.reply.addBadge("Not kept", "error");
      this.notKept.title = "The conversation does not hold this exchange: the model will not see it";
    }
  }

  // A regenerate's reply takes the old one's place while it streams.
  regenerate(id) {
    this.replaced = this.reply;
    this.reply = this.newReply(id);
    this.replaced.li.replaceWith(this.reply.li);
    this.transcript.follow();
    return this.reply;
  }

  // A regenerate's outcome: the new reply stays when the conversation kept it (`turn` a number),
  // else the old one comes back, as the server kept it. Returns the new reply when it was undone.
  settleRegenerate(turn) {
    const fresh = this.reply;
    const old = this.replaced;
    this.replaced = null;
    if (typeof turn === "number") {
      this.setTurn(turn);
      return null;
    }
    this.reply = old;
    fresh.li.replaceWith(old.li);
    return fresh;
  }
}

export class Transcript {
  // actions: {edit(exchange, text) -> bool (sent), regenerate(exchange)}
  constructor(scroller, list, jump, actions) {
    this.scroller = scroller;
    this.list = list;
    this.jump = jump;
    this.actions = actions;
    this.exchanges = []; // this session's, in order; older ones are only shown
    this.base = 0; // exchanges the conversation holds before the first of these
    this.steerable = false;
    this.stick = true;
    scroller.addEventListener("scroll", () => {
      this.stick = this.atBottom();
      if (this.stick) this.jump.hidden = true;
    });
    jump.addEventListener("click", () => {
      this.stick = true;
      this.scrollToEnd();
    });
    this.regenerateButton = button("Regenerate", "regenerate", () => {
      const last = this.lastExchange;
      if (last && !this.regenerateButton.disabled) this.actions.regenerate(last);
    });
  }

  atBottom() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < STICK_PX;
  }

  scrollToEnd() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.jump.hidden = true;
  }

  follow() {
    if (this.stick) this.scrollToEnd();
    else this.jump.hidden = false;
  }

  // A user message and the reply to it (id: the prompt's).
  addExchange(text, images, id) {
    const exchange = new Exchange(this, text, images, id);
    this.exchanges.push(exchange);
    this.list.append(exchange.li, exchange.reply.li);
    this.stick = true;
    this.follow();
    this.refresh();
    return exchange;
  }

  get lastExchange() {
    return this.exchanges[this.exchanges.length - 1];
  }

  // How many exchanges the conversation holds before this one: a `rewind` that drops it keeps
  // that many.
  keptBefore(exchange) {
    return this.base + this.exchanges.slice(0, this.exchanges.indexOf(exchange)).filter((x) => x.kept).length;
  }

  get keptCount() {
    return this.base + this.exchanges.filter((x) => x.kept).length;
  }

  // The exchange and all after it go (a rewind dropped them).
  dropFrom(exchange) {
    const at = this.exchanges.indexOf(exchange);
    if (at < 0) return;
    for (const x of this.exchanges.splice(at)) x.remove();
    this.refresh();
  }

  closeEditors() {
    for (const x of this.exchanges) x.closeEditor(false);
  }

  // The exchanges shown stay, but the page no longer knows them as the server's conversation (a
  // new session, or one that differs); base: how many exchanges the conversation holds.
  detach(base) {
    this.closeEditors();
    for (const x of this.exchanges) x.editButton.remove();
    this.exchanges = [];
    this.base = base;
    this.refresh();
  }

  // Edit and Regenerate follow what may be done now (steerable: connected, no reply running, no
  // rewind waiting); each Edit is named after its message's place, "Edit message 2".
  setSteerable(steerable, busy) {
    this.steerable = steerable;
    this.steerTitle = steerable ? "" : busy ? STEER_BUSY : STEER_OFFLINE;
    this.refresh();
  }

  refresh() {
    const off = !this.steerable;
    this.exchanges.forEach((x, i) => {
      x.editButton.setAttribute("aria-label", `Edit message ${i + 1}`);
      setOff(x.editButton, off, this.steerTitle);
      if (x.editor) setOff(x.editor.save, off, this.steerTitle);
    });
    // Regenerate sits on the last reply, when the conversation holds its exchange.
    const last = this.lastExchange;
    if (last && last.kept && last.reply.finished && !last.replaced) {
      if (this.regenerateButton.parentNode !== last.reply.tools) last.reply.tools.append(this.regenerateButton);
      setOff(this.regenerateButton, off, this.steerTitle);
    } else this.regenerateButton.remove();
  }

  addDivider(text) {
    const li = el("li", "divider", text);
    this.list.append(li);
    this.follow();
  }

  clear() {
    this.exchanges = [];
    this.base = 0;
    this.regenerateButton.remove();
    this.list.replaceChildren();
    this.stick = true;
    this.jump.hidden = true;
  }

  get empty() {
    return this.list.childElementCount === 0;
  }
}

function setOff(b, off, title) {
  b.disabled = off;
  if (title) b.title = title;
  else b.removeAttribute("title");
}
