/* llmgate status page, the gateway keys table: shown only when gateway keys are on.

   One row per key, from two sources. What the key used since this instance started
   (requests, billed tokens, spend) comes from the snapshot status.js just polled (its
   "keys", summed over the instance's workers). What is left of each of the key's limits in
   the current windows comes from admin/usage (the shared counters every instance counts in).
   admin/usage is an operator endpoint like status.json: the browser sends it the credentials
   it was given for this page. It answers 404 when keys are off: the table stays hidden and
   the page asks again once a minute.

   For tests and scripts: <section id="keys" data-state="on|off|error" data-keys="N">; each
   row <tr data-key="name"> carries data-requests, data-not-2xx, data-prompt-tokens,
   data-completion-tokens, data-usd (empty without a price table) and data-left-<limit> for
   each limit the key has (requests_per_minute, tokens_per_day, usd_per_day, max_streams, …;
   empty when the counters could not be read). */
"use strict";

(() => {
  const FETCH_TIMEOUT_MS = 5000;
  const OFF_RECHECK_MS = 60000;
  const LOW = 0.1; // a limit with less than this share left is marked
  // (limit field, admin/usage's count against it, its name on the page, money?)
  const LIMITS = [
    ["requests_per_minute", "requests_this_minute", "requests this minute", false],
    ["tokens_per_minute", "tokens_this_minute", "tokens this minute", false],
    ["tokens_per_day", "tokens_today", "tokens today", false],
    ["tokens_per_month", "tokens_this_month", "tokens this month", false],
    ["usd_per_day", "usd_today", "today", true],
    ["usd_per_month", "usd_this_month", "this month", true],
    ["max_streams", "streams_open", "streams", false],
  ];

  const section = document.getElementById("keys");
  let busy = false;
  let offUntil = 0;

  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);
  const integer = (v) => Math.round(num(v)).toLocaleString("en-US");
  // Cents once there are dollars; a few calls of a cheap model cost fractions of a cent.
  const dollars = (v) => `$${num(v).toFixed(num(v) >= 1 || num(v) === 0 ? 2 : 6)}`;

  function cell(row, text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  // What is left of each limit the key has: [field, left or null when unknown, text, low?].
  function limitsLeft(entry, countersRead) {
    const out = [];
    for (const [field, count, label, money] of LIMITS) {
      const limit = num(entry.limits && entry.limits[field]);
      if (!limit) continue;
      const used = entry[count];
      if (!countersRead || typeof used !== "number") {
        out.push([field, null, `${label}: ? of ${money ? dollars(limit) : integer(limit)} (counters unavailable)`, false]);
        continue;
      }
      const left = Math.max(0, limit - used);
      const shown = money ? `${dollars(left)} of ${dollars(limit)} ${label}` : `${integer(left)} of ${integer(limit)} ${label}`;
      out.push([field, left, shown, left < LOW * limit]);
    }
    return out;
  }

  function draw(used, usage) {
    const priced = usage.prices_version !== null && usage.prices_version !== undefined;
    const configured = new Map((usage.keys || []).map((k) => [k.name, k]));
    const names = [...new Set([...configured.keys(), ...Object.keys(used)])].sort();
    const rows = document.getElementById("key-rows");
    rows.replaceChildren();
    for (const name of names) {
      const u = used[name] || {};
      const entry = configured.get(name);
      const row = document.createElement("tr");
      row.dataset.key = name;
      row.dataset.requests = String(num(u.requests));
      row.setAttribute("data-not-2xx", String(num(u.not_2xx)));
      row.dataset.promptTokens = String(num(u.prompt_tokens));
      row.dataset.completionTokens = String(num(u.completion_tokens));
      row.dataset.usd = priced ? String(num(u.cost_usd)) : "";
      const why = !entry ? " (not in the keys file)" : entry.revoked ? " (revoked)" : "";
      cell(row, name + why, "name");
      cell(row, integer(u.requests) + (num(u.not_2xx) ? ` (${integer(u.not_2xx)} not 2xx)` : ""), "n");
      cell(row, `${integer(u.prompt_tokens)} / ${integer(u.completion_tokens)}`, "n");
      cell(row, priced ? dollars(u.cost_usd) : "–", "n spend");
      const limits = cell(row, "", "limits");
      const left = entry ? limitsLeft(entry, usage.counters_available !== false) : [];
      if (!left.length) limits.textContent = entry ? "no limits" : "–";
      for (const [field, value, text, low] of left) {
        row.setAttribute(`data-left-${field}`, value === null ? "" : String(value));
        const item = document.createElement("span");
        item.className = low ? "limit low" : "limit";
        item.textContent = text;
        limits.appendChild(item);
      }
      rows.appendChild(row);
    }
    section.classList.toggle("unpriced", !priced);
    document.getElementById("keys-note").textContent =
      "Requests, tokens and spend: since this instance started, all its workers. " +
      "Left: in the current windows, counted for every instance" +
      (priced ? `; prices ${usage.prices_version}.` : "; no price table, so no spend.");
    section.dataset.keys = String(names.length);
    section.dataset.state = "on";
    section.hidden = false;
  }

  async function refresh(snapshot) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
    try {
      const response = await fetch("admin/usage", { cache: "no-store", signal: abort.signal });
      if (response.status === 404) { // gateway keys are off
        section.dataset.state = "off";
        section.hidden = true;
        offUntil = Date.now() + OFF_RECHECK_MS;
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      draw(snapshot.keys || {}, await response.json());
    } catch (err) {
      section.dataset.state = "error";
      document.getElementById("keys-note").textContent = `no answer from admin/usage (${err.message || err}); retrying`;
    } finally {
      clearTimeout(timer);
    }
  }

  // Once per snapshot polled, unless the last question is still out or keys were off.
  document.addEventListener("llmgate:status", async (event) => {
    if (busy || Date.now() < offUntil) return;
    busy = true;
    try {
      await refresh(event.detail || {});
    } finally {
      busy = false;
    }
  });
})();
