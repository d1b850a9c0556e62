// A reply's markdown, rendered with markdown-it (vendor/README) and safe to show: raw HTML is
// off, so the model's tags are escaped and read as text; links go only to http(s) and mailto
// (any other is left as text) and open in a new tab without a referrer; images are off, so
// `![alt](url)` shows as a link to the picture and the page never fetches what a model names.

import MarkdownIt from "./vendor/markdown-it.min.js";

const md = new MarkdownIt({ html: false, linkify: true, breaks: true });
md.disable("image");

const SAFE_LINK = /^(?:https?:|mailto:)/i;
md.validateLink = (url) => SAFE_LINK.test(url);

const renderToken = (tokens, i, options, env, self) => self.renderToken(tokens, i, options);
const linkOpen = md.renderer.rules.link_open || renderToken;
md.renderer.rules.link_open = (tokens, i, options, env, self) => {
  tokens[i].attrSet("target", "_blank");
  tokens[i].attrSet("rel", "noopener noreferrer nofollow");
  return linkOpen(tokens, i, options, env, self);
};

const COPY = { text: "Copy", label: "Copy code" };
const COPIED = { text: "Copied", label: "Code copied" };
const COPY_FAILED = { text: "Copy failed", label: "Copy failed: select the code to copy it" };
const RESET_MS = 2000;

function setLabel(button, { text, label }) {
  button.textContent = text;
  button.setAttribute("aria-label", label);
}

// navigator.clipboard exists only in a secure context (https, or a page on localhost); a page
// opened over plain http from another machine copies through a selection instead.
async function copyText(code) {
  try {
    await navigator.clipboard.writeText(code.textContent);
    return true;
  } catch {
    const selection = getSelection();
    selection.selectAllChildren(code);
    const copied = document.execCommand("copy");
    selection.removeAllRanges();
    return copied;
  }
}

function withCopyButton(pre) {
  const box = document.createElement("div");
  box.className = "code";
  const head = document.createElement("div");
  head.className = "code-head";
  const language = /\blanguage-(\S+)/.exec(pre.querySelector("code")?.className || "");
  const name = document.createElement("span");
  name.textContent = language ? language[1] : "";
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  setLabel(button, COPY);
  let timer = 0;
  button.addEventListener("click", async () => {
    setLabel(button, (await copyText(pre.querySelector("code") || pre)) ? COPIED : COPY_FAILED);
    clearTimeout(timer);
    timer = setTimeout(() => setLabel(button, COPY), RESET_MS);
  });
  pre.replaceWith(box);
  head.append(name, button);
  box.append(head, pre);
  return box;
}

// A top-level block as shown: each code block in it gets its copy button.
function decorate(block) {
  if (block.tagName === "PRE") return withCopyButton(block);
  for (const pre of block.querySelectorAll("pre")) withCopyButton(pre);
  return block;
}

// Shows a growing markdown text in one element. Each render parses the whole text (an open
// code fence or list renders as one until it is closed) and replaces only the top-level blocks
// from the first one that changed, so blocks already shown are left alone (their selection,
// their focused copy button) and a streamed reply does not flicker.
export class MarkdownView {
  constructor(container) {
    this.container = container;
    this.blocks = []; // the rendered HTML of each top-level block shown
  }

  render(text) {
    const template = document.createElement("template");
    template.innerHTML = md.render(text); // parsed inert: nothing in a template runs or loads
    const fresh = [...template.content.children];
    const html = fresh.map((block) => block.outerHTML);
    let same = 0;
    while (same < html.length && same < this.blocks.length && html[same] === this.blocks[same]) same++;
    const shown = this.container.children;
    while (shown.length > same) shown[shown.length - 1].remove();
    this.container.append(...fresh.slice(same).map(decorate));
    this.blocks = html;
  }
}
