// The conversation as the reader sees it. A reply is markdown (markdown.js), rendered again
// once per animation frame while it streams; only its blocks that changed are replaced, so a
// streamed reply never flickers. A user's message is plain text. The view follows new text
// only while the reader is at the bottom.

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
    this.li.append(el("div", "who", "Model"));
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
    this.li.querySelector(".who").append(badge);
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

export class Transcript {
  constructor(scroller, list, jump) {
    this.scroller = scroller;
    this.list = list;
    this.jump = jump;
    this.stick = true;
    scroller.addEventListener("scroll", () => {
      this.stick = this.atBottom();
      if (this.stick) this.jump.hidden = true;
    });
    jump.addEventListener("click", () => {
      this.stick = true;
      this.scrollToEnd();
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

  addUser(text, images) {
    const li = el("li", "msg user");
    li.append(el("div", "who", "You"));
    if (images.length) {
      const strip = el("div", "thumbs");
      for (const src of images) {
        const img = el("img");
        img.src = src;
        img.alt = "attached image";
        strip.append(img);
      }
      li.append(strip);
    }
    if (text) li.append(el("div", "text", text));
    this.list.append(li);
    this.stick = true;
    this.follow();
  }

  addReply(id) {
    const reply = new Reply(this, id);
    this.list.append(reply.li);
    this.follow();
    return reply;
  }

  addDivider(text) {
    const li = el("li", "divider", text);
    this.list.append(li);
    this.follow();
  }

  clear() {
    this.list.replaceChildren();
    this.stick = true;
    this.jump.hidden = true;
  }

  get empty() {
    return this.list.childElementCount === 0;
  }
}
