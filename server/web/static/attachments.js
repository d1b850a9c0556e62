// Images for the next prompt. Each one is sent as an `image` frame the moment it is attached, so
// the server checks it at once (PROTOCOL.md "image"): the thumbnail then shows its size, or the
// server's reason for refusing it. Accepted images are staged on the server for the next prompt.

const MIME_TYPES = new Set(["image/png", "image/jpeg", "image/webp", "image/gif"]);

export class Attachments {
  // send(frame) sends a frame or returns false when not connected; limits() is ready.limits.
  constructor(tray, { send, limits, onChange }) {
    this.tray = tray;
    this.send = send;
    this.limits = limits;
    this.onChange = onChange;
    this.items = new Map(); // image frame id -> {li, url, state}
    this.counter = 0;
  }

  async add(file) {
    const id = `img-${Date.now().toString(36)}-${++this.counter}`;
    const item = this.render(id, file);
    const limits = this.limits();
    if (limits && file.size > limits.max_image_bytes) {
      // Never send a frame the server would close the connection over.
      this.refuse(id, `${byteSize(file.size)} is over the server's ${byteSize(limits.max_image_bytes)} limit`);
      return;
    }
    const data = new Uint8Array(await file.arrayBuffer());
    item.data = data;
    const frame = { type: "image", id, data };
    if (MIME_TYPES.has(file.type)) frame.mime = file.type;
    if (!this.send(frame)) this.refuse(id, "not connected: attach it again once connected");
    item.state = "checking";
    this.onChange();
  }

  render(id, file) {
    const li = document.createElement("li");
    li.className = "attachment checking";
    li.dataset.id = id;
    const url = URL.createObjectURL(file);
    const img = document.createElement("img");
    img.src = url;
    img.alt = file.name || "pasted image";
    const caption = document.createElement("span");
    caption.className = "caption";
    caption.textContent = "checking…";
    li.append(img, caption);
    this.tray.append(li);
    const item = { li, url, caption, state: "checking" };
    this.items.set(id, item);
    return item;
  }

  has(id) {
    return this.items.has(id);
  }

  accepted(frame) {
    const item = this.items.get(frame.id);
    if (!item) return;
    item.state = "ok";
    item.li.className = "attachment ok";
    item.caption.textContent = `${frame.width}×${frame.height}`;
    this.onChange();
  }

  refuse(id, message) {
    const item = this.items.get(id);
    if (!item) return;
    item.state = "refused";
    item.li.className = "attachment refused";
    item.caption.textContent = message;
    item.caption.setAttribute("role", "alert");
    const dismiss = document.createElement("button");
    dismiss.type = "button";
    dismiss.className = "dismiss";
    dismiss.textContent = "×";
    dismiss.setAttribute("aria-label", "Dismiss refused image");
    dismiss.addEventListener("click", () => this.remove(id));
    item.li.append(dismiss);
    this.onChange();
  }

  remove(id) {
    const item = this.items.get(id);
    if (!item) return;
    item.li.remove();
    URL.revokeObjectURL(item.url);
    this.items.delete(id);
    this.onChange();
  }

  get checking() {
    return [...this.items.values()].some((i) => i.state === "checking");
  }

  get stagedCount() {
    return [...this.items.values()].filter((i) => i.state === "ok").length;
  }

  // The staged images leave the tray with the prompt; their thumbnails move into the message,
  // with their bytes (an edited message sends them again).
  takeStaged() {
    const images = [];
    for (const [id, item] of this.items) {
      if (item.state !== "ok") continue;
      images.push({ url: item.url, data: item.data });
      item.li.remove();
      this.items.delete(id);
    }
    this.onChange();
    return images;
  }

  // The server dropped what it had staged (reset, or a session it no longer had).
  dropStaged() {
    for (const [id, item] of this.items) if (item.state !== "refused") this.remove(id);
  }
}

function byteSize(n) {
  return n >= 1048576 ? `${(n / 1048576).toFixed(1)} MB` : `${Math.ceil(n / 1024)} kB`;
}

export function imageFiles(dataTransfer) {
  if (!dataTransfer) return [];
  return [...dataTransfer.files].filter((f) => f.type.startsWith("image/") || f.type === "");
}
