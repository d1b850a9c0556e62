// The wschat dashboard: one `stats` frame a second from /v1/stats, drawn as tiles, charts and
// a table of live sessions.

import { LineChart } from "./chart.js";
import { Backoff, diagnose, getToken, openSocket, readFrame, setConnection, setToken } from "./net.js";

const $ = (id) => document.getElementById(id);
const conn = $("conn");
const charts = {
  tokens: new LineChart($("c-tokens"), 1),
  generations: new LineChart($("c-generations"), 3, { integer: true }),
  ttft: new LineChart($("c-ttft"), 2),
};
const backoff = new Backoff();
let socket = null;

function formatDuration(s) {
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  return `${m}m ${Math.floor(s % 60)}s`;
}

const ms = (v) => (v === null || v === undefined ? "–" : `${Math.round(v)} ms`);
// Bytes held of the budget, both in the budget's unit: "3.5 of 8.0 GiB".
function ofBudget(bytes, budget) {
  const unit = budget >= 2 ** 30 ? ["GiB", 2 ** 30] : ["MiB", 2 ** 20];
  return `${(bytes / unit[1]).toFixed(1)} of ${(budget / unit[1]).toFixed(1)} ${unit[0]}`;
}

// Tokens and bytes held, of the budget; servers before kv_bytes send only the tokens.
function kvText(stats) {
  if (stats.kv_tokens === null) return "n/a";
  const tokens = `${stats.kv_tokens.toLocaleString()} tokens`;
  if (stats.kv_bytes === undefined || stats.kv_bytes === null) return tokens;
  return `${tokens} · ${ofBudget(stats.kv_bytes, stats.kv_budget_bytes)}`;
}

// Rewinds, then regenerates; servers before rewind send neither.
function rewindsText(stats) {
  if (stats.rewinds === undefined || stats.rewinds === null) return "–";
  return `${stats.rewinds} / ${stats.regenerates ?? 0}`;
}

function show(stats) {
  $("model").textContent = stats.model;
  $("model").title = stats.device ? `${stats.model} on ${stats.device}` : stats.model;
  $("t-sessions").textContent = stats.sessions;
  $("t-running").textContent = stats.running;
  $("t-queued").textContent = stats.queued;
  $("t-tokens").textContent = stats.tokens_per_s.toFixed(1);
  $("t-p50").textContent = ms(stats.ttft_p50_ms);
  $("t-p95").textContent = ms(stats.ttft_p95_ms);
  $("t-cancel").textContent = stats.cancellations;
  $("t-rewinds").textContent = rewindsText(stats);
  const errors = Object.entries(stats.errors);
  $("t-errors").textContent = errors.length ? errors.map(([code, n]) => `${code}: ${n}`).join(", ") : "none";
  $("t-kv").textContent = kvText(stats);
  $("t-device").textContent = stats.device || "–";
  $("t-uptime").textContent = formatDuration(stats.uptime_s);
  charts.tokens.push([stats.tokens_per_s]);
  charts.generations.push([stats.running, stats.queued, stats.sessions]);
  charts.ttft.push([stats.ttft_p50_ms, stats.ttft_p95_ms]);
  showSessions(stats.live || []);
}

// The samples of the last minutes a socket's first frame carries (PROTOCOL.md "stats"), so the
// charts do not start blank; servers before history send none.
function showHistory(h) {
  const rows = (...names) => h[names[0]].map((_, i) => names.map((n) => h[n][i]));
  charts.tokens.extend(rows("tokens_per_s"));
  charts.generations.extend(rows("running", "queued", "sessions"));
  charts.ttft.extend(rows("ttft_p50_ms", "ttft_p95_ms"));
  document.body.dataset.history = String(h.tokens_per_s.length);
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// The reply in flight's tokens; servers before the reply field send none.
function replyTokens(row) {
  return row.reply === undefined || row.reply === null ? "–" : row.reply;
}

function showSessions(rows) {
  const body = $("sessions").tBodies[0];
  body.replaceChildren(
    ...rows.map((r) => {
      const tr = document.createElement("tr");
      tr.dataset.id = r.id;
      tr.append(cell(r.id, "id"), cell(r.state, `state-${r.state}`), cell(r.tokens, "num"), cell(replyTokens(r), "num"), cell(r.turns ?? "", "num"));
      return tr;
    }),
  );
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell("No sessions open.");
    td.colSpan = 5;
    tr.append(td);
    body.append(tr);
  }
}

function connect() {
  setConnection(conn, "connecting", "Connecting…");
  const ws = openSocket("/v1/stats", { token: getToken() });
  socket = ws;
  let opened = false;
  ws.onopen = () => {
    opened = true;
    backoff.reset();
    $("token-form").hidden = true;
    setConnection(conn, "connected", "Live");
  };
  ws.onmessage = (event) => {
    const frame = readFrame(event);
    if (frame.type !== "stats") return;
    if (frame.history) showHistory(frame.history);
    show(frame);
  };
  ws.onclose = async () => {
    if (socket !== ws) return;
    socket = null;
    const verdict = opened ? "lost" : await diagnose(getToken());
    if (verdict === "needs-token" || verdict === "refused-token") {
      setConnection(conn, "auth", "Token needed");
      $("token-form").hidden = false;
      $("token-message").textContent =
        verdict === "needs-token" ? "This server needs an access token." : "The server refused this access token.";
      $("token").focus();
      return;
    }
    const delay = backoff.next();
    setConnection(conn, "disconnected", `Disconnected — retrying in ${Math.max(1, Math.round(delay / 1000))} s`);
    setTimeout(connect, delay);
  };
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setToken($("token").value.trim());
  $("token").value = "";
  backoff.reset();
  connect();
});

connect();
