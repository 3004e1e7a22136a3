// dispatch's operator page: plain JavaScript, no build step, no library, nothing fetched
// from anywhere but this page's own origin (the API). The bearer token lives in this tab's
// sessionStorage and travels in the Authorization header only. Live updates read the API's
// SSE routes with fetch() streaming, since EventSource can't send a header.
"use strict";

(function () {
  const TOKEN_KEY = "dispatch.token";
  const PAGE = 50;
  const LABELS = { "release": "Release", "resubmit": "Resubmit", "cancel": "Cancel",
    "give-up": "Give up", "abandon": "Abandon", "supersede": "Supersede",
    "emergency-stop": "Emergency stop", "hold": "Hold" };
  const STATES = ["pending", "held", "running", "recovering", "succeeded", "failed",
    "cancelled", "unknown"];

  let me = null;              // {name, kind} of the token
  let viewAbort = null;       // aborts the current view's requests and streams
  let listState = { offset: 0, state: "", cluster: "", needs: false };

  // ---------------------------------------------------------------- small helpers

  function $(id) { return document.getElementById(id); }

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "text") el.textContent = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "";
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 86400) return Math.floor(s / 3600) + "h";
    return Math.floor(s / 86400) + "d";
  }

  // A time as the CLI shows it (dispatch_cli.render.when): HH:MM:SS today, else
  // YYYY-MM-DD HH:MM:SS, in local time; the full ISO time on hover.
  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    const p = (n) => String(n).padStart(2, "0");
    const time = p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
    const text = d.toDateString() === new Date().toDateString() ? time :
      d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + " " + time;
    return h("time", { datetime: iso, title: iso }, text);
  }

  // Seconds as the CLI's plan shows them (dispatch_cli.render._duration).
  function duration(seconds) {
    if (seconds >= 3600 && seconds % 3600 === 0) return (seconds / 3600) + " h";
    if (seconds >= 60) return (seconds / 60) + " min";
    return seconds + " s";
  }

  function since(iso) {
    return iso ? age((Date.now() - Date.parse(iso)) / 1000) : "";
  }

  function stateCell(state) {
    return h("span", { class: "state state-" + state, text: state });
  }

  function causeText(cause) {
    if (!cause) return "";
    return cause.kind + (cause.detail ? ": " + cause.detail : "");
  }

  function showNotice(text) {
    const n = $("notice");
    n.textContent = text;
    n.hidden = !text;
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // ---------------------------------------------------------------- the API

  function randomKey() {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function token() { return sessionStorage.getItem(TOKEN_KEY); }

  function headers(extra) {
    return Object.assign({ "Authorization": "Bearer " + token() }, extra || {});
  }

  async function api(method, path, body, opts) {
    const init = { method: method, headers: headers(), signal: opts && opts.signal };
    if (body !== undefined) {
      if (typeof body === "string") {
        init.body = body;
        init.headers["Content-Type"] = "text/plain";
      } else {
        init.body = JSON.stringify(body);
        init.headers["Content-Type"] = "application/json";
      }
    }
    if (opts && opts.idempotent) init.headers["Idempotency-Key"] = randomKey();
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (e) {
      // Navigated away mid-answer: the caller's own abort, not an empty answer.
      if (init.signal && init.signal.aborted) throw e;
      data = null;
    }
    if (!response.ok) {
      const err = (data && data.error) || { code: "http-" + response.status,
        message: response.statusText };
      if (response.status === 401 && !(opts && opts.signingIn)) tokenRefused(err.message);
      throw new ApiError(response.status, err.code, err.message);
    }
    return data;
  }

  // While a live stream is down (the API restarting, the network gone) the page says so.
  const downStreams = new Set();
  function streamDown(key, down) {
    if (down) downStreams.add(key); else downStreams.delete(key);
    const note = $("reconnecting");
    if (note) note.hidden = downStreams.size === 0;
  }

  // Follow an SSE route with fetch streaming; calls onEvent(name, data) per event, and
  // reconnects (with Last-Event-ID) until signal aborts, backing off from 0.5 s to 10 s. The
  // back-off restarts only once a stream has stayed up a while: one that opens and drops at
  // once is retried ever more slowly. onOpen() is called each time a stream (re)opens: the
  // routes send only what changes next, so the caller reloads what it shows.
  async function follow(path, onEvent, signal, onOpen) {
    const key = {};
    let lastId = null;
    let wait = 500;
    signal.addEventListener("abort", () => streamDown(key, false));
    while (!signal.aborted) {
      let opened = 0;
      try {
        const extra = lastId === null ? {} : { "Last-Event-ID": lastId };
        const response = await fetch(path, { headers: headers(extra), signal: signal });
        if (response.status === 401) {
          const data = await response.json().catch(() => null);
          tokenRefused(data && data.error ? data.error.message : "token refused");
          return;
        }
        if (!response.ok || !response.body) throw new Error("stream " + response.status);
        opened = Date.now();
        streamDown(key, false);
        if (onOpen) onOpen();
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            let name = "message";
            const data = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) name = line.slice(6).trim();
              else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
              else if (line.startsWith("id:")) lastId = line.slice(3).trim();
            }
            if (data.length) onEvent(name, JSON.parse(data.join("\n")));
          }
        }
      } catch (e) {
        if (signal.aborted) return;
      }
      if (signal.aborted) return;
      streamDown(key, true);
      if (opened && Date.now() - opened > 30000) wait = 500;
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(wait * 2, 10000);
    }
  }

  // ---------------------------------------------------------------- sign-in

  function tokenRefused(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    me = null;
    showSignIn("The API refused your token (" + message + "): it is wrong, expired or " +
      "revoked. Sign in again.");
  }

  function showSignIn(error) {
    if (viewAbort) viewAbort.abort();
    $("view").hidden = true;
    $("nav").hidden = true;
    $("whoami").hidden = true;
    $("signout").hidden = true;
    $("signin-view").hidden = false;
    const e = $("signin-error");
    e.textContent = error || "";
    e.hidden = !error;
    $("token").focus();
  }

  async function signIn(candidate) {
    sessionStorage.setItem(TOKEN_KEY, candidate);
    try {
      me = await api("GET", "/ui/api/me", undefined, { signingIn: true });
    } catch (err) {
      sessionStorage.removeItem(TOKEN_KEY);
      showSignIn(err.status === 401
        ? "That token is not valid: " + err.message
        : "Could not sign in: " + err.message);
      return;
    }
    $("signin-view").hidden = true;
    $("nav").hidden = false;
    $("whoami").hidden = false;
    $("whoami").textContent = "signed in as " + me.name + " (" + me.kind + ")";
    $("signout").hidden = false;
    route();
  }

  // ---------------------------------------------------------------- answering

  let pendingConfirm = null;

  function confirmReason(title, what) {
    const dialog = $("confirm-dialog");
    $("confirm-title").textContent = title;
    $("confirm-what").textContent = what;
    $("confirm-reason").value = "";
    dialog.showModal();
    $("confirm-reason").focus();
    return new Promise((resolve) => { pendingConfirm = resolve; });
  }

  function closeConfirm(value) {
    $("confirm-dialog").close();
    if (pendingConfirm) {
      const resolve = pendingConfirm;
      pendingConfirm = null;
      resolve(value);
    }
  }

  // Give `command` to `jobId` with a reason asked for and confirmed; show the API's answer
  // (a refusal shows the core's reason) in `out`.
  async function answer(jobId, command, out, extra) {
    const reason = await confirmReason(LABELS[command] + " " + jobId,
      "This gives the command " + command + " to job " + jobId + ".");
    if (reason === null) return null;
    return give(jobId, command, reason, out, extra);
  }

  async function give(jobId, command, reason, out, extra) {
    const body = Object.assign({ reason: reason }, extra || {});
    out.className = "answer-result";
    out.textContent = command + ": sending...";
    try {
      const result = await api("POST", "/v1/jobs/" + encodeURIComponent(jobId) + "/" + command,
        body, { idempotent: true });
      out.className = "answer-result ok";
      out.textContent = command + " done: the job is " + result.status.state +
        (result.new_job_id ? "; new job " + result.new_job_id : "");
      return result;
    } catch (err) {
      out.className = "answer-result refused";
      out.textContent = command + " refused (" + err.code + "): " + err.message;
      return null;
    }
  }

  function answerButtons(jobId, answers, out, target) {
    return answers
      .filter((a) => a !== "abandon" || (me && me.kind === "human"))
      .map((a) => h("button", {
        type: "button", class: "answer", "data-answer": a,
        onclick: () => answer(jobId, a, out, a === "abandon" && target ? { target: target } : null),
      }, LABELS[a] || a));
  }

  // ---------------------------------------------------------------- views

  function setView(...children) {
    const view = $("view");
    view.replaceChildren(...children);
    view.hidden = false;
  }

  function markNav(id) {
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.id === id);
  }

  async function jobsView(signal) {
    markNav("nav-jobs");
    const stateSel = h("select", { id: "f-state", "aria-label": "state",
      onchange: () => { listState.state = stateSel.value; listState.offset = 0; load(); } },
      h("option", { value: "" }, "any state"),
      STATES.map((s) => h("option", { value: s, selected: listState.state === s }, s)));
    const clusterSel = h("select", { id: "f-cluster", "aria-label": "cluster",
      onchange: () => { listState.cluster = clusterSel.value; listState.offset = 0; load(); } },
      h("option", { value: "" }, "any cluster"));
    const needs = h("input", { type: "checkbox", id: "f-needs", checked: listState.needs,
      onchange: () => { listState.needs = needs.checked; listState.offset = 0; load(); } });
    const info = h("span", { id: "page-info" });
    const prev = h("button", { type: "button", id: "prev",
      onclick: () => { listState.offset = Math.max(0, listState.offset - PAGE); load(); } }, "Previous");
    const next = h("button", { type: "button", id: "next",
      onclick: () => { listState.offset += PAGE; load(); } }, "Next");
    const tbody = h("tbody", { id: "jobs-body" });
    const table = h("table", { id: "jobs" },
      h("thead", {}, h("tr", {},
        h("th", {}, "job"), h("th", { class: "wide" }, "name"), h("th", { class: "wide" }, "cluster"),
        h("th", {}, "state"), h("th", {}, "cause"), h("th", { class: "wide" }, "submission"),
        h("th", { class: "wide" }, "epoch"), h("th", { class: "wide" }, "age"), h("th", {}, "escalations"))),
      tbody);
    setView(h("h1", {}, "Jobs"),
      h("div", { class: "filters" }, stateSel, clusterSel,
        h("label", {}, needs, " needs a person")),
      h("div", { class: "pager" }, prev, next, info),
      h("div", { class: "table-wrap" }, table));

    let shown = new Map();
    let reloadTimer = null;
    let loads = 0;
    async function load() {
      const mine = ++loads;  // an answer to an older request (a quick click) is dropped
      const q = new URLSearchParams({ offset: listState.offset, limit: PAGE });
      if (listState.state) q.set("state", listState.state);
      if (listState.cluster) q.set("cluster", listState.cluster);
      if (listState.needs) q.set("needs", "person");
      let page;
      try {
        page = await api("GET", "/ui/api/jobs?" + q, undefined, { signal: signal });
      } catch (err) {
        if (!signal.aborted && err.status !== 401) showNotice("Jobs: " + err.message);
        return;
      }
      if (mine !== loads || !page) return;
      if (clusterSel.options.length === 1) {
        for (const c of page.clusters) {
          clusterSel.append(h("option", { value: c, selected: listState.cluster === c }, c));
        }
      }
      // A reload (live, or the stream reconnecting) keeps the keyboard's place in the list.
      const active = document.activeElement;
      const focused = active && tbody.contains(active) ? active.closest("tr").dataset.job : null;
      shown = new Map();
      tbody.replaceChildren(...page.jobs.map((j) => {
        const tr = h("tr", { "data-job": j.job_id },
          h("td", { class: "c-job" }, h("a", { href: "#/job/" + encodeURIComponent(j.job_id) }, j.job_id)),
          h("td", { class: "wide" }, j.name),
          h("td", { class: "wide" }, j.cluster || ""),
          h("td", { class: "c-state" }, stateCell(j.state)),
          h("td", { class: "c-cause", title: j.cause.detail || "" }, j.cause.kind),
          h("td", { class: "wide" }, j.submission === null ? "" : j.submission),
          h("td", { class: "wide" }, j.epoch === null ? "" : j.epoch),
          h("td", { class: "wide" }, age(j.age_s)),
          h("td", {}, j.open_escalations.join(", ")));
        shown.set(j.job_id, tr);
        return tr;
      }));
      if (focused && shown.has(focused)) shown.get(focused).querySelector("a").focus();
      const end = Math.min(page.offset + page.jobs.length, page.total);
      info.textContent = page.total === 0 ? "no jobs" :
        (page.offset + 1) + "-" + end + " of " + page.total;
      prev.disabled = page.offset === 0;
      next.disabled = end >= page.total;
      document.body.dataset.jobsLoaded = String(Date.now());
    }
    function reloadSoon() {
      if (reloadTimer === null) {
        reloadTimer = setTimeout(() => { reloadTimer = null; if (!signal.aborted) load(); }, 1500);
      }
    }
    await load();
    follow("/ui/api/changes", (name, job) => {
      if (name !== "job") return;
      const tr = shown.get(job.job_id);
      if (tr && !listState.state && !listState.needs) {
        tr.querySelector(".c-state").replaceChildren(stateCell(job.state));
        const cause = tr.querySelector(".c-cause");
        cause.textContent = job.cause.kind;
        cause.title = job.cause.detail || "";
      } else {
        reloadSoon();
      }
    }, signal, () => { if (!signal.aborted) load(); });
  }

  function kv(pairs) {
    return h("dl", { class: "kv" }, pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  // A planned rule as the CLI's plan shows it (dispatch_cli.render.plan_lines).
  function ruleText(r) {
    let text = r.action + " on " + r.on.join(", ");
    if (["resubmit", "restart", "requeue"].includes(r.action)) text += " (budget " + r.budget + ")";
    if (r.action === "hold") text += " (overdue after " + duration(r.hold_for_s) + ")";
    if (r.free_if_progress) text += " (free if progress)";
    if (r.max_without_progress !== null && r.max_without_progress !== undefined) {
      text += " (hold after " + r.max_without_progress + " without progress)";
    }
    if (r.clusters && r.clusters.length) text += " (fail over: " + r.clusters.join(" -> ") + ")";
    if (r.wait_s !== null && r.wait_s !== undefined) {
      text += " (no capacity for " + duration(r.wait_s) + ": stop and apply)";
    }
    if (r.substituted_for) text += " [instead of " + r.substituted_for + "]";
    return text;
  }

  function planView(plan) {
    return h("div", { id: "plan" },
      plan.rules.length ? h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "rule"),
        h("th", {}, "what it does"), h("th", {}, "enforcer"))),
      h("tbody", {}, plan.rules.map((r) => h("tr", {},
        h("td", {}, r.rule), h("td", { class: "c-rule" }, ruleText(r)),
        h("td", {}, r.enforcer + (r.unenforced ? ": " + r.unenforced : "")))))) :
        h("p", { id: "no-rules" }, "no rules: every cause is uncovered"),
      h("p", { id: "uncovered" }, h("strong", {}, "Uncovered causes: "),
        plan.uncovered.length ? plan.uncovered.join(", ") : "none",
        plan.uncovered.length ? " (an execution ending with one of these fails the job)" : ""),
      plan.substitutions.length ? h("ul", {}, plan.substitutions.map((s) =>
        h("li", {}, "rule " + s.rule + ": " + s.original + " became " + s.substitute + ": " + s.reason))) : null);
  }

  function summarize(event) {
    const skip = new Set(["type", "job_id", "at", "spec", "policy", "plan", "declarations"]);
    return Object.entries(event).filter(([k]) => !skip.has(k))
      .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join("  ");
  }

  // DISPATCH_EPOCH of one execution (seed 004, dispatch_core/epoch.py):
  // G * 10**12 + N * 10**6 + R; BigInt, as G * 10**12 may pass 2**53.
  function epochOf(generation, submission, restart) {
    return (BigInt(generation) * 1000000000000n + BigInt(submission) * 1000000n +
      BigInt(restart)).toString();
  }

  function executions(events) {
    // One row per object the record launched or found, with its ended executions.
    const rows = new Map();
    for (const { event } of events) {
      if (event.type === "launch.recorded") {
        rows.set(event.ref.cluster + "/" + event.ref.id, { ref: event.ref, submission: event.submission,
          attempt: event.attempt, ends: [] });
      } else if (event.type === "execution.ended") {
        const key = event.ref.cluster + "/" + event.ref.id;
        if (!rows.has(key)) rows.set(key, { ref: event.ref, submission: event.submission, attempt: "", ends: [] });
        rows.get(key).ends.push(event);
      }
    }
    return [...rows.values()];
  }

  async function jobView(jobId, signal) {
    markNav(null);
    const out = h("p", { id: "answer-result", class: "answer-result", "aria-live": "polite" });
    const head = h("div", { id: "job-status" });
    const history = h("div", { id: "history" });
    const execs = h("div", { id: "executions" });
    const escal = h("div", { id: "job-escalations" });
    const record = h("details", { id: "record" }, h("summary", {}, "Record (events)"));
    const created = h("div", { id: "created" });
    const commands = h("div", { id: "commands", class: "buttons" });
    setView(h("h1", { id: "job-title" }, "Job " + jobId), head, out,
      h("h2", {}, "Waiting for a person"), escal,
      h("h2", {}, "Commands"), commands,
      h("h2", {}, "History"), history,
      h("h2", {}, "Executions"), execs,
      h("h2", {}, "Plan"), created, record);

    function renderStatus(s) {
      const cause = s.cause;
      head.replaceChildren(kv([
        ["state", h("span", { id: "job-state", class: "state state-" + s.state, text: s.state })],
        ["cause", h("span", { id: "job-cause" }, cause.kind)],
        ["provenance", h("span", { id: "job-provenance" }, cause.provenance)],
        ["actor", cause.actor ? cause.actor.name + " (" + cause.actor.kind + ")" : ""],
        ["detail", h("span", { id: "job-detail", class: "verbatim" }, cause.detail || "")],
        ["submission", s.submission === null ? "" : s.submission],
        ["epoch", s.epoch === null || s.epoch === undefined ? "" : s.epoch],
        ["objects", s.objects.map((o) => o.cluster + "/" + o.id).join(", ")],
        ["hold", s.hold ? s.hold.kind + " hold by " + s.hold.by.name + ": " + s.hold.reason : ""],
        ["supersedes", s.supersedes ? h("a", { id: "supersedes",
          href: "#/job/" + encodeURIComponent(s.supersedes) }, s.supersedes) : ""],
        ["superseded by", s.superseded_by ? h("a", { id: "superseded-by",
          href: "#/job/" + encodeURIComponent(s.superseded_by) }, s.superseded_by) : ""],
      ]));
      history.replaceChildren(s.history.length === 0 ? h("p", { class: "none" }, "none yet") :
        h("table", {}, h("tbody", {}, s.history.map((t) => h("tr", {},
        h("td", { class: "c-at" }, when(t.at)), h("td", {}, stateCell(t.state)), h("td", {}, t.cause.kind),
        h("td", { class: "verbatim" }, (t.cause.actor ? t.cause.actor.name + ": " : "") + (t.detail || t.cause.detail || "")))))));
    }

    let lastSeq = -1;
    async function loadRecord() {
      const rec = await api("GET", "/v1/jobs/" + encodeURIComponent(jobId) + "/record", undefined, { signal: signal });
      const first = rec.events[0] && rec.events[0].event;
      if (first && first.type === "job.created") {
        created.replaceChildren(planView(first.plan), kv([
          ["cluster", first.spec.cluster],
          ["checkpoint root", h("span", { id: "checkpoint-root", class: "verbatim" },
            first.spec.checkpoint || "(none)")],
          ["submitted by", first.by.name + " (" + first.by.kind + ")"],
          ["generation", first.generation],
        ]));
      }
      const generation = first && first.type === "job.created" ? first.generation || 0 : 0;
      execs.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "object"),
        h("th", {}, "submission/attempt"),
        h("th", {}, "ended executions (restart, epoch: cause, nodes)"))),
      h("tbody", {}, executions(rec.events).map((x) => h("tr", { "data-object": x.ref.id },
        h("td", {}, x.ref.cluster + "/" + x.ref.id), h("td", {}, x.submission + "/" + x.attempt),
        h("td", { class: "ends" }, x.ends.map((e) => "R" + e.restart + ", epoch " +
          epochOf(generation, e.submission, e.restart) + ": " + causeText(e.cause) +
          (e.cause.nodes && e.cause.nodes.length ? " on " + e.cause.nodes.join(",") : "")).join("; ")))))));
      record.replaceChildren(h("summary", {}, "Record (" + rec.events.length + " events)"),
        h("table", { id: "events" }, h("tbody", {}, rec.events.map((r) => h("tr", {},
          h("td", {}, r.seq), h("td", {}, when(r.event.at)), h("td", {}, r.event.type),
          h("td", {}, r.writer), h("td", {}, h("code", {}, summarize(r.event))))))));
    }

    // The commands that can apply to the job now are the core's (dispatch_core
    // job_commands, sent with the job's inbox); abandon, a person's only, names the target
    // of the open escalation that asks for it.
    async function loadEscalations() {
      const inbox = await api("GET", "/ui/api/inbox?job=" + encodeURIComponent(jobId), undefined, { signal: signal });
      escal.replaceChildren(inbox.items.length ? inboxList(inbox.items, out) : h("p", {}, "Nothing."));
      const asking = inbox.items.find((i) => i.abandon_target);
      const target = asking ? asking.abandon_target : null;
      commands.replaceChildren(...answerButtons(jobId,
        inbox.commands.filter((c) => c !== "abandon" || target !== null), out, target));
    }

    try {
      const [status] = await Promise.all([
        api("GET", "/v1/jobs/" + encodeURIComponent(jobId), undefined, { signal: signal }),
        loadRecord(), loadEscalations()]);
      renderStatus(status);
      lastSeq = status.seq;
    } catch (err) {
      if (!signal.aborted && err.status !== 401) {
        $("view").hidden = true;  // the notice alone: no skeleton of a job that isn't there
        $("view").replaceChildren();
        showNotice("Job " + jobId + ": " + err.message);
      }
      return;
    }
    follow("/v1/jobs/" + encodeURIComponent(jobId) + "/stream", (name, status) => {
      if (name !== "status") return;
      renderStatus(status);
      if (status.seq !== lastSeq) {
        lastSeq = status.seq;
        loadRecord().catch(() => {});
        loadEscalations().catch(() => {});
      }
    }, signal);
  }

  function inboxList(items, out) {
    return h("ul", { class: "items", id: "inbox-items" }, items.map((i) => {
      const local = h("p", { class: "answer-result", "aria-live": "polite" });
      return h("li", { class: "item sev-" + i.severity, "data-job": i.job_id, "data-esc": i.id },
        h("div", {}, h("strong", {}, i.id), " · ",
          h("a", { href: "#/job/" + encodeURIComponent(i.job_id) }, i.job_id), " · ",
          stateCell(i.state), " · ", i.severity, " · ", since(i.at), " old"),
        h("div", { class: "detail" }, i.detail),
        h("div", { class: "meaning" }, i.meaning),
        i.advice ? h("div", { class: "advice" }, i.advice) : null,
        h("div", { class: "buttons" }, answerButtons(i.job_id, i.answers, out || local, i.abandon_target)),
        out ? null : local);
    }));
  }

  async function inboxView(signal) {
    markNav("nav-inbox");
    const body = h("div", { id: "inbox" }, "loading...");
    setView(h("h1", {}, "Escalations inbox"), body);
    async function load() {
      try {
        const inbox = await api("GET", "/ui/api/inbox", undefined, { signal: signal });
        body.replaceChildren(inbox.items.length ? inboxList(inbox.items, null) :
          h("p", { id: "inbox-empty" }, "Nothing waits for a person."));
        document.body.dataset.inboxLoaded = String(Date.now());
      } catch (err) {
        if (!signal.aborted && err.status !== 401) showNotice("Inbox: " + err.message);
      }
    }
    await load();
    let timer = null;
    follow("/ui/api/changes", () => {
      if (timer === null) timer = setTimeout(() => { timer = null; if (!signal.aborted) load(); }, 1500);
    }, signal, () => { if (!signal.aborted) load(); });
  }

  function submitView(signal) {
    markNav("nav-submit");
    const file = h("textarea", { id: "jobfile", "aria-label": "job file (TOML)",
      placeholder: 'name = "digits"\n\n[spec]\ncluster = "local"\ncommand = ["python", "train.py"]\n\n[[policy.rules]]\non = ["preempted", "node-lost"]\naction = "resubmit"\nbudget = 3' });
    const result = h("div", { id: "preview-result" });
    let previewed = null;
    const confirmBtn = h("button", { type: "button", id: "confirm-submit", disabled: true,
      onclick: async () => {
        try {
          const answer = await api("POST", "/v1/jobs", previewed, { idempotent: true });
          location.hash = "#/job/" + encodeURIComponent(answer.job_id);
        } catch (err) {
          result.append(h("p", { class: "refused" }, "Refused (" + err.code + "): " + err.message));
        }
      } }, "Submit");
    const previewBtn = h("button", { type: "button", id: "preview",
      onclick: async () => {
        previewed = null;
        confirmBtn.disabled = true;
        try {
          const answer = await api("POST", "/ui/api/preview", file.value, { signal: signal });
          previewed = answer.body;
          result.replaceChildren(h("h2", {}, "Plan"), planView(answer.plan));
          confirmBtn.disabled = false;
        } catch (err) {
          result.replaceChildren(h("p", { class: "refused" },
            (err.code || "error") + ": " + err.message));
        }
      } }, "Show the plan");
    // An edit makes the plan shown stale: Submit waits for a new preview of the new text.
    file.addEventListener("input", () => {
      previewed = null;
      confirmBtn.disabled = true;
    });
    setView(h("h1", {}, "Submit a job"),
      h("p", {}, "Paste a job file (TOML, as dispatch submit takes). Its plan is shown before anything is submitted."),
      file, h("div", { class: "buttons" }, previewBtn, confirmBtn), result);
  }

  function route() {
    if (!token()) { showSignIn(""); return; }
    if (!me) { signIn(token()); return; }
    if (viewAbort) viewAbort.abort();
    viewAbort = new AbortController();
    const signal = viewAbort.signal;
    showNotice("");
    const hash = location.hash || "#/jobs";
    let m;
    if ((m = /^#\/job\/(.+)$/.exec(hash))) jobView(decodeURIComponent(m[1]), signal);
    else if (hash === "#/inbox") inboxView(signal);
    else if (hash === "#/submit") submitView(signal);
    else jobsView(signal);
  }

  // For the tests and the curious: give a command as the page does, reason given.
  window.dispatchPage = {
    give: (jobId, command, reason, extra) => give(jobId, command, reason, $("answer-result") ||
      document.body.appendChild(h("p", { id: "answer-result" })), extra),
  };

  window.addEventListener("unhandledrejection", (e) => {
    if (e.reason && e.reason.name === "AbortError") e.preventDefault();
  });

  document.addEventListener("DOMContentLoaded", () => {
    $("signin").addEventListener("submit", (e) => {
      e.preventDefault();
      const value = $("token").value.trim();
      $("token").value = "";
      if (value) signIn(value);
    });
    $("signout").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      me = null;
      showSignIn("");
    });
    $("confirm-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const reason = $("confirm-reason").value.trim();
      if (reason) closeConfirm(reason);
    });
    $("confirm-cancel").addEventListener("click", () => closeConfirm(null));
    $("confirm-dialog").addEventListener("cancel", () => closeConfirm(null));
    window.addEventListener("hashchange", route);
    route();
  });
})();
