// What the server's frames do to the conversation on the page (PROTOCOL.md): the reply in flight
// streams, settles into its place (or is shown as not kept), an edit's rewind goes on to its new
// prompt, and after a reconnect the page holds what the server holds.

import { setConnection } from "./net.js";
import { ERROR_HINTS, clearNotice, notice, ui } from "./page.js";
import { send, settleReply, state } from "./session.js";

// The frame handler table: onFrame(frame) for session.js. sendTurn(text, images) is the
// composer's (composer.js), updateControls() the page's (app.js).
export function conversation({ transcript, attachments, updateControls, sendTurn }) {
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

  // After a resume (PROTOCOL.md section 10): a reply that ended while the connection was away is
  // in the conversation exactly when it is `resumed.last_prompt`; an edit's rewind took effect when
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

  function applyLimits(ready) {
    const limit = ready.limits.max_new_tokens;
    ui.maxNew.max = String(limit);
    ui.maxNewLimit.textContent = `1–${limit}`;
    ui.attach.hidden = !ready.capabilities.images;
  }

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

  return function onFrame(frame) {
    const handler = handlers[frame.type];
    if (handler) handler(frame);
  };
}
