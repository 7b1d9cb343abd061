// The dashboard: one page of the task table polled every second (the counts are the whole
// queue's), a task's page, and actions when the listener allows them (the token comes from the
// address's #token=… or is asked for once).
"use strict";

const POLL_MS = 1000;
// The rows one screen shows; the listener cuts the table to them.
const PAGE_ROWS = 200;
let pageOffset = 0;
let allowActions = false;

function token() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash) {
    sessionStorage.setItem("cairn-token", fromHash);
    history.replaceState(null, "", location.pathname);
  }
  let stored = sessionStorage.getItem("cairn-token");
  if (!stored) {
    stored = prompt("The action token cairn printed at start:") || "";
    if (stored) sessionStorage.setItem("cairn-token", stored);
  }
  return stored;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  return duration(seconds) + " ago";
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  seconds = Math.round(seconds);
  if (seconds < 60) return seconds + "s";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m" + (seconds % 60) + "s";
  if (seconds < 86400) return Math.floor(seconds / 3600) + "h" + Math.floor((seconds % 3600) / 60) + "m";
  return Math.floor(seconds / 86400) + "d" + Math.floor((seconds % 86400) / 3600) + "h";
}

function submitterName(s) {
  if (!s) return "-";
  return s.user || String(s.uid);
}

function phaseCell(t) {
  if (!t.phase) return "-";
  if (t.phase_index !== null && t.phase_index !== undefined && t.phase_count) {
    return t.phase + "(" + (t.phase_index + 1) + "/" + t.phase_count + ")";
  }
  return t.phase;
}

function iterationCell(t) {
  const done = t.iteration, total = t.total;
  if (done !== null && done !== undefined && total !== null && total !== undefined) return done + "/" + total;
  if (done !== null && done !== undefined) return String(done);
  return "-";
}

function costCell(t) {
  const cost = t.cost === null || t.cost === undefined ? null : t.cost;
  const budget = t.budget === null || t.budget === undefined ? null : t.budget;
  if (cost === null && budget === null) return "-";
  return (cost === null ? "0" : String(cost)) + (budget === null ? "" : " / " + budget);
}

async function act(action, body, message) {
  message.textContent = action + "…";
  message.classList.remove("error");
  try {
    const answer = await fetch("/api/actions/" + action, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Cairn-Token": token() },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    const text = await answer.text();
    message.textContent = text;
    if (!answer.ok) message.classList.add("error");
  } catch (e) {
    message.textContent = action + ": " + e;
    message.classList.add("error");
  }
}

// The first screen.

function renderQueue(status) {
  document.getElementById("queue").textContent = status.queue;
  document.getElementById("daemon").textContent = status.daemon && status.daemon.running
    ? "daemon running" + (status.daemon.pid ? " (pid " + status.daemon.pid + ")" : "")
    : (status.nodes ? status.nodes.filter(n => n.alive).length + " daemon(s) alive" : "no daemon running");
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  const counts = status.counts || {};
  const countsNode = document.getElementById("counts");
  countsNode.replaceChildren(...Object.keys(counts).sort().map(s => el("span", s + " " + counts[s], "count-" + s)));
  fillSelect("filter-state", Object.keys(counts).filter(s => s !== "rejected").sort());
  fillSelect("filter-submitter", status.submitter_names || []);
  document.querySelector("#tasks tbody").replaceChildren(...status.tasks.map(taskRow));
  const first = status.matching ? status.offset + 1 : 0;
  const last = status.offset + status.tasks.length;
  document.getElementById("shown").textContent = "tasks " + first + "–" + last + " of " + status.matching +
    (status.matching !== status.total ? " matching (" + status.total + " in all)" : "");
  document.getElementById("page-back").disabled = status.offset === 0;
  document.getElementById("page-on").disabled = last >= status.matching;
  const rejections = (status.recent_rejections || []).map(t => {
    const li = el("li");
    const a = el("a", t.id);
    a.href = "/task/" + encodeURIComponent(t.id);
    li.append(a, el("span", " " + (t.error || "")));
    return li;
  });
  document.getElementById("rejections").replaceChildren(...(rejections.length ? rejections : [el("li", "none")]));
}

function fillSelect(id, values) {
  const select = document.getElementById(id);
  const current = select.value;
  const have = [...select.options].map(o => o.value).slice(1);
  if (have.join("\n") === values.join("\n")) return;
  select.replaceChildren(el("option", "all"), ...values.map(v => { const o = el("option", v); o.value = v; return o; }));
  select.options[0].value = "";
  select.value = values.includes(current) ? current : "";
}

function taskRow(t) {
  const tr = el("tr");
  tr.dataset.id = t.id;
  const link = el("a", t.id);
  link.href = "/task/" + encodeURIComponent(t.id);
  const idCell = el("td");
  idCell.append(link);
  const cells = [
    idCell,
    el("td", t.state, "state state-" + t.state),
    el("td", phaseCell(t)),
    el("td", iterationCell(t), "num iteration"),
    el("td", t.rate_per_min === null || t.rate_per_min === undefined ? "-" : t.rate_per_min.toFixed(1) + "/min", "num"),
    el("td", duration(t.eta_seconds), "num"),
    el("td", costCell(t), "num"),
    el("td", ago(t.last_checkpoint_age_seconds), "num"),
    el("td", t.attempts === null || t.attempts === undefined ? "-" : t.attempts, "num"),
    el("td", submitterName(t.submitted_by)),
    el("td", t.node || "-"),
  ];
  const actions = el("td", null, "actions-only");
  for (const action of ["pause", "resume", "cancel", "retry"]) {
    const button = el("button", action);
    button.type = "button";
    button.dataset.action = action;
    button.addEventListener("click", () => act(action, { id: t.id }, document.getElementById("message")));
    actions.append(button);
  }
  tr.append(...cells, actions);
  return tr;
}

function statusQuery() {
  const query = new URLSearchParams({ offset: pageOffset, limit: PAGE_ROWS });
  const state = document.getElementById("filter-state").value;
  const submitter = document.getElementById("filter-submitter").value;
  if (state) query.set("state", state);
  if (submitter) query.set("submitter", submitter);
  return "/api/status?" + query;
}

let pollTimer = null;

async function pollQueue() {
  clearTimeout(pollTimer);
  try {
    const answer = await fetch(statusQuery(), { cache: "no-store" });
    if (answer.ok) renderQueue(await answer.json());
    else document.getElementById("updated").textContent = "not updated: " + await answer.text();
  } catch (e) {
    document.getElementById("updated").textContent = "not updated: " + e;
  }
  clearTimeout(pollTimer);
  pollTimer = setTimeout(pollQueue, POLL_MS);
}

// A task's page.
function renderTask(doc) {
  document.getElementById("queue").textContent = doc.queue;
  document.getElementById("daemon").textContent = doc.daemon && doc.daemon.running ? "daemon running" : "no daemon running here";
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  document.getElementById("task-title").textContent = doc.id + " — " + doc.state;
  const s = doc.status || {};
  const summary = document.getElementById("task-summary");
  summary.replaceChildren(
    el("p", "phase " + phaseCell(s) + ", iteration " + iterationCell(s) + ", attempts " + (doc.attempts ?? "-") +
      ", cost " + costCell(s) + ", checkpoint " + ago(s.last_checkpoint_age_seconds) + ", submitter " + submitterName(doc.submitted_by)));
  const phases = document.getElementById("task-phases");
  phases.replaceChildren(headRow(["#", "name", "kind", "state", "iteration", "output"]),
    ...(doc.phases || []).map((p, i) => row([i + 1, p.name, p.kind || "-", p.state, iterationCell(p), p.output === undefined || p.output === null ? "-" : JSON.stringify(p.output)])));
  const checkpoint = document.getElementById("task-checkpoint");
  const cp = doc.checkpoints;
  if (cp && cp.latest) {
    const gens = (cp.generations || []).map(g => "generation " + g.generation + ": " + (g.iteration_count ?? "?") + " iterations, " + g.bytes + " bytes").join("\n");
    const state = el("pre", JSON.stringify(cp.latest.state, null, 2), "checkpoint-state");
    checkpoint.replaceChildren(el("p", "phase " + cp.latest.phase + ", " + cp.latest.iteration_count + " iterations, written " + cp.latest.last_checkpoint_at), state, el("pre", gens));
  } else {
    checkpoint.replaceChildren(el("p", "no checkpoint"));
  }
  const logs = document.getElementById("task-logs");
  const tails = (doc.log_tails || []).map(l => { const d = el("div"); d.append(el("h3", l.name + " (" + l.bytes + " bytes)"), el("pre", l.tail ?? l.unreadable, "log-tail")); return d; });
  logs.replaceChildren(...(tails.length ? tails : [el("p", "no log here")]));
  const errors = document.getElementById("task-errors");
  const lines = [];
  if (doc.error) lines.push(el("p", doc.error, "error"));
  for (const e of doc.earlier_failures || []) lines.push(el("pre", JSON.stringify(e, null, 2)));
  errors.replaceChildren(...(lines.length ? lines : [el("p", "none")]));
  const timeline = document.getElementById("task-timeline");
  timeline.replaceChildren(headRow(["at", "event", "details"]),
    ...(doc.timeline || []).map(e => { const { at, event, ...rest } = e; return row([at, event, JSON.stringify(rest)]); }));
  document.getElementById("task-definition").textContent = JSON.stringify(doc.definition, null, 2);
}

function headRow(names) { const tr = el("tr"); tr.append(...names.map(n => el("th", n))); return tr; }
function row(values) { const tr = el("tr"); tr.append(...values.map(v => el("td", v))); return tr; }

async function pollTask(id) {
  try {
    const answer = await fetch("/api/task/" + encodeURIComponent(id), { cache: "no-store" });
    if (answer.ok) renderTask(await answer.json());
    else document.getElementById("task-message").textContent = await answer.text();
  } catch (e) {
    document.getElementById("task-message").textContent = String(e);
  }
  setTimeout(() => pollTask(id), POLL_MS * 2);
}

async function start() {
  try {
    const info = await (await fetch("/api/info", { cache: "no-store" })).json();
    allowActions = !!info.actions;
  } catch (e) { allowActions = false; }
  document.body.classList.toggle("read-only", !allowActions);
  document.getElementById("mode").textContent = allowActions ? "actions allowed" : "read-only";
  if (allowActions && location.hash.includes("token=")) token();
  const match = location.pathname.match(/^\/task\/(.+)$/);
  if (match) {
    const id = decodeURIComponent(match[1]);
    document.getElementById("task-view").hidden = false;
    const message = document.getElementById("task-message");
    for (const button of document.querySelectorAll("#task-actions button")) {
      button.addEventListener("click", () => {
        const action = button.dataset.action;
        const body = { id };
        if (action === "fork") {
          const patch = document.getElementById("fork-patch").value.trim();
          const as = document.getElementById("fork-as").value.trim();
          if (patch) body.patch = patch;
          if (as) body.as = as;
        }
        act(action, body, message);
      });
    }
    pollTask(id);
  } else {
    document.getElementById("queue-view").hidden = false;
    const message = document.getElementById("message");
    const submitter = () => document.getElementById("filter-submitter").value;
    document.getElementById("bulk-retry-failed").addEventListener("click", () => act("retry-failed", {}, message));
    document.getElementById("bulk-pause").addEventListener("click", () => act("pause-submitter", { submitter: submitter() }, message));
    document.getElementById("bulk-resume").addEventListener("click", () => act("resume-submitter", { submitter: submitter() }, message));
    for (const id of ["filter-state", "filter-submitter"]) {
      document.getElementById(id).addEventListener("change", () => { pageOffset = 0; pollQueue(); });
    }
    document.getElementById("page-back").addEventListener("click", () => { pageOffset = Math.max(0, pageOffset - PAGE_ROWS); pollQueue(); });
    document.getElementById("page-on").addEventListener("click", () => { pageOffset += PAGE_ROWS; pollQueue(); });
    pollQueue();
  }
}

start();
