// The memmesh cockpit: reads the node's local API (docs/api.md) and its event stream, and acts
// through the same commands the CLI runs (sync, share, grant, revoke, quarantine, release).
// No framework and no build step: the page must work offline from the files serve ships.
// Every number shown is a field of an API answer; the page only formats, sorts and picks.
"use strict";
(() => {
  const TOKEN_KEY = "memmesh.token"; // sessionStorage: this tab only, never a URL
  const RETRY_MAX_MS = 8000;
  const REFRESH_DELAY_MS = 120; // several events in a burst cost one re-fetch
  const BROWSE_PAGE = 10;
  const RECALL_MAX_OFFSET = 900; // recall's largest offset: a ranking pages down to its 1000th memory
  // Which API answers an event makes stale (the page re-fetches them, never patches numbers).
  const STALE_BY_EVENT = {
    "entry.accepted": ["status", "quarantines"], // a quarantine is an entry too (only read on a bank view)
    "entry.refused": ["status", "refusals", "peers"],
    "peer.connected": ["status", "peers"],
    "peer.lost": ["status", "peers"],
    "lag.changed": ["status"],
    "grant.changed": ["status", "agents", "grants", "quarantines"],
    "bank.imported": ["status", "peers", "agents", "grants"],
    "bank.shared": ["status", "peers", "agents", "grants"],
    "bank.unshared": ["status", "peers", "agents", "grants"],
  };
  const ALL = ["status", "peers", "refusals", "agents", "grants", "quarantines"];
  const TABS = ["overview", "banks", "peers", "refusals", "agents"];

  const $ = (id) => document.getElementById(id);
  const state = {
    status: null, peers: null, refusals: null, agents: null,
    grants: {}, // bank id -> the memory.grants answer (labels and what each key is)
    quarantines: null, // the memory.quarantines answer of the bank shown
    errors: {}, asOf: {},
    pages: [null], // the `before` cursor of each refusals page seen; the last is shown
    tab: "overview", bank: null,
    lastId: null, run: null, events: 0, restarts: 0, streamAbort: null,
    browse: {bank: null, agent: "", query: "", page: 0, memories: null, error: "", loading: false},
  };

  // ------------------------------------------------------------------ small helpers
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  const dash = "—";
  const num = (v) => (v === null || v === undefined ? dash : String(v));
  const has = (o, k) => o !== null && typeof o === "object" && k in o;
  const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;
  function shortKey(key) {
    if (!key) return dash;
    const s = String(key);
    const body = s.startsWith("ed25519:") ? s.slice(8) : s;
    return body.length > 14 ? `${body.slice(0, 10)}…` : body;
  }

  // Names, not keys: what this node calls a key, from the commands that know (agent list, the
  // node's own key in status, and each bank's `memory grants` labels). null: not known here.
  function nameOf(key) {
    if (!key) return null;
    if (state.status && key === state.status.peer_key) return {name: "this node", detail: "this node's peer key"};
    for (const a of (state.agents && state.agents.agents) || []) {
      if (a.key === key) return {name: a.name, detail: `local agent ${a.name}`};
    }
    for (const g of Object.values(state.grants)) {
      for (const k of (g && g.keys) || []) {
        if (k.key !== key) continue;
        const is = k.is || {};
        if (is.kind === "unknown") continue;
        const name = is.kind === "peer" && is.name ? `peer ${is.name}` : is.kind === "bank" ? `bank ${g.bank}` : (is.name || k.label);
        return {name, detail: is.detail || k.label};
      }
    }
    for (const d of dbs()) {
      for (const g of d.grants || []) if (g.key === key && g.name) return {name: g.name, detail: g.name};
    }
    return null;
  }
  function keyCell(key) {
    const known = nameOf(key);
    if (!key) return dash;
    if (known) return h("span", {class: "key named", title: `${known.detail} · ${key}`}, known.name);
    return h("span", {class: "key", title: `${key} (not known to this node)`}, h("code", {}, shortKey(key)));
  }
  // An error as its sentence: recorded link errors read "code: sentence"; the code goes on hover.
  function sentence(text) {
    if (!text) return null;
    const m = /^([a-z_]+(?:\.[a-z_]+)+): ([\s\S]*)$/.exec(String(text));
    return m ? h("span", {title: m[1]}, m[2]) : String(text);
  }
  function seconds(s) {
    if (s === null || s === undefined) return dash;
    if (s < 1) return "<1 s";
    if (s < 120) return `${Math.floor(s)} s`;
    if (s < 7200) return `${Math.floor(s / 60)} min`;
    return `${Math.floor(s / 3600)} h`;
  }
  function when(ms) { // an epoch-ms time from the API, as a clock time
    if (ms === null || ms === undefined) return "never";
    return new Date(ms).toLocaleTimeString();
  }
  function reasons(map) {
    const parts = Object.entries(map || {}).sort((a, b) => b[1] - a[1]).map(([r, n]) => `${r} ${n}`);
    return parts.length ? parts.join(", ") : "none";
  }
  // A table; each cell carries its column's name (data-label) so a phone shows rows as cards.
  function table(el, head, rows, empty) {
    for (const row of rows) [...row.children].forEach((td, i) => { if (head[i]) td.dataset.label = head[i]; });
    el.replaceChildren(h("thead", {}, h("tr", {}, head.map((c) => h("th", {scope: "col"}, c)))),
      h("tbody", {}, rows.length ? rows : [h("tr", {}, h("td", {colspan: head.length, class: "empty"}, empty))]));
  }
  const cell = (field, value, extra) => h("td", {"data-field": field, ...(extra || {})}, value);
  const dbName = (d) => d.name || d.id;

  // ------------------------------------------------------------------ the API
  const token = () => sessionStorage.getItem(TOKEN_KEY);
  class Unauthorized extends Error {}

  async function call(method, path, body) { // the whole answer: data, text, warnings
    const headers = {Authorization: `Bearer ${token()}`};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const resp = await fetch(path, {method, headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body)});
    let answer = null;
    try { answer = await resp.json(); } catch (e) { answer = null; }
    if (resp.status === 401) throw new Unauthorized(answer && answer.error ? answer.error.message : "unauthorized");
    if (!resp.ok) {
      const message = answer && answer.error ? answer.error.message : `${method} ${path}: HTTP ${resp.status}`;
      const err = new Error(message);
      err.status = resp.status;
      throw err;
    }
    return answer;
  }
  const api = async (method, path, body) => (await call(method, path, body)).data;

  const LOADERS = {
    status: () => api("GET", "/v1/status"),
    peers: () => api("GET", "/v1/peers"),
    agents: () => api("GET", "/v1/agent/list"),
    refusals: () => {
      const before = state.pages[state.pages.length - 1];
      return api("POST", "/v1/refusals", before === null ? {limit: 25} : {limit: 25, before});
    },
    // Every bank's labels: the names the page shows for keys (memory grants, per bank).
    grants: async () => {
      const list = (state.status || await api("GET", "/v1/status")).databases || [];
      const out = {};
      await Promise.all(list.filter((d) => d.kind === "bank").map(async (d) => {
        try { out[d.id] = await api("POST", "/v1/memory/grants", {bank: d.id}); } catch (e) {
          if (e instanceof Unauthorized) throw e;
        }
      }));
      return out;
    },
    quarantines: async () => {
      const d = dbs().find((x) => x.id === state.bank);
      if (state.tab !== "bank" || !d) return null;
      return api("POST", "/v1/memory/quarantines", {bank: d.id});
    },
  };

  async function load(which) {
    await Promise.all(which.map(async (name) => {
      try {
        state[name] = await LOADERS[name]();
        state.errors[name] = null;
        state.asOf[name] = new Date();
      } catch (e) {
        if (e instanceof Unauthorized) throw e;
        state.errors[name] = e.message;
      }
    }));
    render();
  }

  let pending = new Set();
  let timer = null;
  function stale(which) {
    which.forEach((w) => pending.add(w));
    if (timer) return;
    timer = setTimeout(async () => {
      const todo = [...pending];
      pending = new Set();
      timer = null;
      try { await load(todo); } catch (e) { if (e instanceof Unauthorized) signOut(e.message); }
    }, REFRESH_DELAY_MS);
  }

  // ------------------------------------------------------------------ the event stream
  function setStream(mode, text) {
    const el = $("stream");
    el.dataset.state = mode;
    if (state.lastId !== null) el.dataset.lastId = String(state.lastId);
    if (state.run !== null) el.dataset.run = state.run;
    $("stream-text").textContent = text;
  }

  function dispatch(ev) {
    if (ev.id !== null) state.lastId = ev.id;
    let data = null;
    try { data = ev.data ? JSON.parse(ev.data) : null; } catch (e) { data = null; }
    if (ev.type === "hello") {
      const first = state.run === null;
      if (!first && data && data.run !== state.run) { // serve restarted: ids begin anew
        state.lastId = data.last_id;
        state.restarts += 1;
      }
      if (data) state.run = data.run;
      if (state.lastId === null && data) state.lastId = data.last_id;
      stale(ALL); // whatever happened while we were not listening
    } else if (ev.type === "missed") {
      stale(ALL);
    } else {
      state.events += 1;
      stale(STALE_BY_EVENT[ev.type] || ALL);
    }
    setStream("live", `live · ${plural(state.events, "event", "events")}`);
  }

  function parseBlock(block) {
    const ev = {id: null, type: "message", data: ""};
    let data = [];
    let any = false;
    for (const line of block.split(/\r?\n/)) {
      if (!line || line.startsWith(":")) continue; // keepalive comments
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") ev.id = Number(value);
      else if (field === "event") ev.type = value;
      else if (field === "data") data.push(value);
      else continue;
      any = true;
    }
    ev.data = data.join("\n");
    return any ? ev : null;
  }

  async function stream() {
    let wait = 500;
    while (token()) {
      const ctrl = new AbortController();
      state.streamAbort = ctrl;
      setStream(state.run === null ? "connecting" : "reconnecting",
        state.run === null ? "connecting…" : "reconnecting…");
      let sentSince = false;
      try {
        sentSince = state.lastId !== null;
        const query = sentSince ? `?since=${encodeURIComponent(state.lastId)}` : "";
        const resp = await fetch(`/v1/events${query}`, {cache: "no-store", signal: ctrl.signal,
          headers: {Authorization: `Bearer ${token()}`, Accept: "text/event-stream"}});
        if (resp.status === 401) { signOut("the token was refused"); return; }
        if (resp.status === 400 && sentSince) {
          // The id is from an earlier serve run (ids restart with each run): follow the new
          // run from now on; its hello tells the new run and everything is re-fetched.
          state.lastId = null;
          continue;
        }
        if (!resp.ok || !resp.body) throw new Error(`HTTP ${resp.status}`);
        const reader = resp.body.getReader();
        const decoder = new TextDecoder();
        let buf = "";
        wait = 500;
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buf += decoder.decode(value, {stream: true});
          let m;
          while ((m = /\r?\n\r?\n/.exec(buf))) {
            const ev = parseBlock(buf.slice(0, m.index));
            buf = buf.slice(m.index + m[0].length);
            if (ev) dispatch(ev);
          }
        }
        throw new Error("the stream ended");
      } catch (e) {
        if (!token()) return;
        const why = e instanceof TypeError ? "serve is not answering" : (e.message || String(e));
        setStream("disconnected", `disconnected (${why}); retrying in ${Math.ceil(wait / 1000)} s`);
        await new Promise((r) => setTimeout(r, wait));
        wait = Math.min(wait * 2, RETRY_MAX_MS);
      }
    }
  }

  // ------------------------------------------------------------------ rendering
  function dbs() { return (state.status && state.status.databases) || []; }
  function syncOf(d) { return d.sync || null; }
  function worstPeer(d) {
    const s = syncOf(d);
    if (!s || !s.peers || !s.peers.length) return null;
    const lag = (p) => Math.max(p.peer_lacks || 0, p.we_lack || 0);
    return [...s.peers].sort((a, b) => lag(b) - lag(a) || (b.last_error ? 1 : 0) - (a.last_error ? 1 : 0))[0];
  }
  const errorText = (e) => { const s = sentence(e); return s instanceof Node ? s.textContent : s; };
  // A bank's state for the overview: a word, a class, and why (from the API's own fields).
  function verdictOf(d) {
    const s = syncOf(d);
    if (!d.shared && (!s || !s.peers || !s.peers.length)) return {word: "local", cls: "muted", why: "not shared"};
    if (!s) return {word: "unknown", cls: "warn", why: "this serve does not report sync per bank"};
    const p = worstPeer(d);
    if (!p) return {word: "no peers", cls: "muted", why: "shared, no peer has synced yet"};
    const why = [];
    if (p.peer_lacks) why.push(`peer lacks ${p.peer_lacks}`);
    if (p.we_lack) why.push(`we lack ${p.we_lack}`);
    if (p.last_error) why.push(`last error: ${errorText(p.last_error)}`);
    if (p.backoff_ms) why.push(`backing off ${seconds(p.backoff_ms / 1000)}`);
    if (s.stale) why.push(`no complete exchange for ${seconds(s.last_complete_exchange_age_s)}`);
    if (s.worst_lag || p.last_error || s.stale) {
      return {word: s.stale ? "stale" : "behind", cls: "bad", why: why.join("; "), peer: p};
    }
    return {word: "in sync", cls: "ok", why: "", peer: p};
  }

  function renderNode() {
    const st = state.status;
    const n = st && st.node;
    const line = $("node-line");
    if (!st) { line.textContent = ""; return; }
    line.replaceChildren(h("span", {class: "key", title: st.peer_key}, h("code", {}, shortKey(st.peer_key))),
      n && n.listeners ? ` · api ${n.listeners.api || "off"} · sync ${n.listeners.sync || "off"}` : "");
    const card = (label, value, id) => h("div", {class: "card"}, h("div", {class: "label"}, label),
      h("div", {class: "value", "data-testid": id, id}, value));
    const counts = (n && n.counts) || {};
    const verify = (n && n.verify) || {};
    $("node-cards").replaceChildren(
      card("banks", num(counts.banks), "node-banks"),
      card("databases", num(has(counts, "databases") ? counts.databases : dbs().length), "node-databases"),
      card("peers", num(counts.peers), "node-peers"),
      card("errors", num(counts.errors), "node-errors"),
      card("uptime", n ? seconds(n.uptime_s) : dash, "node-uptime"),
      card("verified entries", num(verify.entries), "node-verified"),
      card("verify rate /s", verify.per_s === null || verify.per_s === undefined ? dash : String(verify.per_s), "node-verify-rate"),
      card("discovery", n && n.discovery !== null && n.discovery !== undefined ? (n.discovery ? "on" : "off") : dash, "node-discovery"),
    );
  }

  function renderOverview() {
    const list = dbs();
    const shared = list.filter((d) => d.shared || (syncOf(d) && (syncOf(d).peers || []).length));
    const bad = shared.filter((d) => verdictOf(d).cls === "bad");
    const v = $("verdict");
    if (!state.status) { v.textContent = state.errors.status || "loading…"; v.className = "verdict"; }
    else if (!shared.length) { v.textContent = "No bank is shared with a peer: nothing to sync."; v.className = "verdict muted"; }
    else if (!bad.length) {
      v.textContent = shared.length === 1 ? "The 1 shared bank is in sync with every peer."
        : `All ${shared.length} shared banks are in sync with every peer.`;
      v.className = "verdict ok";
    } else {
      v.replaceChildren(`${bad.length} of ${shared.length} shared bank${shared.length === 1 ? " is" : "s are"} not in sync: `,
        ...bad.map((d, i) => { const x = verdictOf(d); return h("span", {}, i ? "; " : "", h("b", {}, dbName(d)),
          x.peer ? [" with ", keyCell(x.peer.peer)] : "", ` (${x.why})`); }));
      v.className = "verdict bad";
    }
    v.dataset.bad = String(bad.length);
    const rows = [...list].sort((a, b) => (b.shared ? 1 : 0) - (a.shared ? 1 : 0)).map((d) => {
      const x = verdictOf(d);
      const s = syncOf(d);
      return h("tr", {"data-testid": "overview-row", "data-db": d.id, class: x.cls},
        cell("name", h("a", {href: `#bank/${encodeURIComponent(d.id)}`}, dbName(d))),
        cell("kind", d.kind || dash),
        cell("entries", num(d.entries)),
        cell("state", h("span", {class: `badge ${x.cls}`}, x.word)),
        cell("peer", x.peer ? keyCell(x.peer.peer) : dash),
        cell("peer_lacks", x.peer ? num(x.peer.peer_lacks) : dash),
        cell("we_lack", x.peer ? num(x.peer.we_lack) : dash),
        cell("worst_lag", s ? num(s.worst_lag) : dash),
        cell("last_exchange_age", s ? seconds(s.last_complete_exchange_age_s) : dash),
        cell("why", x.why || dash, {class: x.cls === "bad" ? "why" : "quiet"}));
    });
    table($("overview-table"), ["bank", "kind", "entries", "state", "worst peer", "peer lacks", "we lack", "worst lag",
      "last complete exchange", "why"], rows, "no databases");
  }

  function renderBanks() {
    const rows = dbs().map((d) => h("tr", {"data-testid": "bank-row", "data-db": d.id},
      cell("name", h("a", {href: `#bank/${encodeURIComponent(d.id)}`}, dbName(d))),
      cell("kind", d.kind || dash),
      cell("entries", num(d.entries)),
      cell("authors", num(d.authors)),
      cell("heads", num((d.heads || []).length)),
      cell("pending", num(d.pending)),
      cell("payload_pending", num(d.payload_pending)),
      cell("refused", reasons(d.refused_by_reason)),
      cell("shared", d.shared ? "yes" : "no"),
      cell("id", h("code", {title: d.id}, shortKey(d.id)))));
    table($("banks-table"), ["bank", "kind", "entries", "authors", "heads", "pending", "payload pending",
      "refused by reason", "shared", "id"], rows, "no databases");
  }

  function section(title, ...kids) { return h("section", {class: "panel"}, h("h3", {}, title), ...kids); }
  function dl(pairs, testid) {
    return h("dl", {"data-testid": testid}, pairs.map(([k, v, field]) => [h("dt", {}, k), h("dd", {"data-field": field || k}, v)]));
  }
  const button = (text, testid, onclick, extra) => h("button", {type: "button", "data-testid": testid, onclick, ...(extra || {})}, text);

  function renderBank() {
    const box = $("bank-detail");
    const d = dbs().find((x) => x.id === state.bank);
    $("browser").hidden = !d;
    if (!d) {
      box.replaceChildren(h("p", {}, state.status ? `no database ${state.bank} on this node` : "loading…"));
      $("bank-more").replaceChildren();
      return;
    }
    const s = syncOf(d);
    const r = d.recall || null;
    const labels = new Map(((state.grants[d.id] || {}).keys || []).map((k) => [k.key, k]));
    const grants = (d.grants || []).map((g) => {
      const label = labels.get(g.key);
      const kind = label && label.is ? label.is.kind : null;
      // The bank's own key and this node's are what keep the bank administrable here.
      const revocable = g.status !== "revoked" && kind !== "bank" && kind !== "node";
      return h("tr", {"data-testid": "grant-row", "data-key": g.key, class: g.status === "revoked" ? "muted" : ""},
        cell("key", keyCell(g.key)), cell("level", g.level), cell("priority", num(g.priority)),
        cell("status", g.status), cell("granted_by", g.granted_by ? keyCell(g.granted_by) : dash),
        cell("entry", h("code", {title: g.entry}, shortKey(g.entry))),
        cell("actions", revocable ? button("Revoke", "revoke", () => actRevoke(d, g)) : ""));
    });
    const gt = h("table", {"data-testid": "grants-table"});
    table(gt, ["key", "level", "priority", "status", "granted by", "grant entry", ""], grants,
      has(d, "grants") ? "no grants" : "this serve does not report grants");
    const peers = ((s && s.peers) || []).map((p) => h("tr", {"data-testid": "bank-peer-row", "data-peer": p.peer},
      cell("peer", keyCell(p.peer)), cell("peer_lacks", num(p.peer_lacks)), cell("we_lack", num(p.we_lack)),
      cell("last_exchange", when(p.last_exchange_ms)), cell("last_error", sentence(p.last_error) || dash, {class: p.last_error ? "why" : ""}),
      cell("backoff", p.backoff_ms ? seconds(p.backoff_ms / 1000) : dash),
      cell("bytes_in", num(p.bytes_in)), cell("bytes_out", num(p.bytes_out)), cell("refused", reasons(p.refused))));
    const pt = h("table", {"data-testid": "bank-peers-table"});
    table(pt, ["peer", "peer lacks", "we lack", "last exchange", "last error", "backoff", "bytes in", "bytes out",
      "refused from it"], peers, s ? "no peers" : "this serve does not report sync per bank");
    const refused = Object.entries(d.refused_by_reason || {}).map(([reason, n]) =>
      h("tr", {"data-testid": "refused-reason-row", "data-reason": reason}, cell("reason", reason), cell("count", num(n))));
    const rt = h("table", {"data-testid": "bank-refused-table"});
    table(rt, ["reason", "entries refused"], refused, "nothing refused");
    const qs = ((state.quarantines && state.quarantines.bank === d.name ? state.quarantines.quarantines : null) || [])
      .map((q) => h("tr", {"data-testid": "quarantine-row", "data-id": q.id, class: q.active ? "" : "muted"},
        cell("who", keyCell(q.key)), cell("by", keyCell(q.by)), cell("when", q.when || dash),
        cell("hides", q.hides ? `${plural(q.hides.current, "current memory", "current memories")}, ${plural(q.hides.rows, "row", "rows")}` : dash),
        cell("active", q.active ? "active" : "released"),
        cell("actions", q.active ? button("Release", "release", () => actRelease(d, q)) : "")));
    const qt = h("table", {"data-testid": "quarantines-table"});
    table(qt, ["writer", "by", "when", "hides", "state", ""], qs, "no quarantines");
    const x = verdictOf(d);
    const isBank = d.kind === "bank";
    box.replaceChildren(
      h("h2", {}, dbName(d), " ", h("span", {class: `badge ${x.cls}`, "data-testid": "bank-state"}, x.word)),
      x.why ? h("p", {class: x.cls === "bad" ? "why" : "note"}, x.why) : "",
      h("div", {class: "actions", "data-testid": "bank-actions"},
        button("Sync now", "act-sync", () => actSync(d), {disabled: !d.shared}),
        isBank ? button("Share…", "act-share", () => actShare(d)) : "",
        button("Grant…", "act-grant", () => actGrant(d)),
        button("Quarantine…", "act-quarantine", () => actQuarantine(d))),
      dl([["id", h("code", {}, d.id)], ["kind", d.kind || dash], ["entries", num(d.entries)], ["authors", num(d.authors)],
        ["heads", num((d.heads || []).length)], ["pending", num(d.pending)], ["payload pending", num(d.payload_pending), "payload_pending"],
        ["worst lag", s ? num(s.worst_lag) : dash, "worst_lag"],
        ["last complete exchange", s && s.last_complete_exchange_age_s !== null && s.last_complete_exchange_age_s !== undefined
          ? `${seconds(s.last_complete_exchange_age_s)} ago` : "never", "last_exchange_age"],
        ["stale", s ? (s.stale ? "yes" : "no") : dash]], "bank-facts"));
    $("bank-more").replaceChildren(section("Peers", pt), section("Grants", gt), section("Quarantines", qt), section("Refused, by reason", rt),
      section("Recall engine", r ? dl(recallFacts(r), "bank-recall")
        : h("p", {}, "this serve does not report the recall engine")));
    renderBrowseAgents(d);
  }

  // The status API counts tiers for no reader: owner and peer are only told apart for a reading
  // agent (memmesh memory status BANK --agent NAME), so plain rows are shown as one count.
  function recallFacts(r) {
    const t = r.tiers || null;
    const q = r.quarantines || null;
    const tier = (k) => (t ? num(t[k]) : dash);
    return [["embedder", r.embedder || "none (BM25 only)"], ["memories", num(r.memories)],
      ["embeddable", num(r.embeddable)],
      ["with a vector", num(r.with_vectors), "with_vectors"],
      ["share of embeddable", r.share === null || r.share === undefined ? dash : `${(r.share * 100).toFixed(1)} %`, "share"],
      ["plain (owner or peer)", t ? num((t.owner || 0) + (t.peer || 0)) : dash, "tier_plain"],
      ["ingested", tier("ingested"), "tier_ingested"], ["flagged", tier("flagged"), "tier_flagged"],
      ["quarantined", tier("quarantined"), "tier_quarantined"],
      ["flagged per rule", has(r, "flagged_by_rule") ? reasons(r.flagged_by_rule) : dash, "flagged_by_rule"],
      ["secrets", num(r.secrets), "secrets"],
      ["active quarantines", q ? num(q.active) : dash, "quarantines_active"],
      ["released quarantines", q ? num(q.released) : dash, "quarantines_released"]];
  }

  function renderPeers() {
    const list = (state.peers && state.peers.peers) || [];
    const rows = list.map((p) => h("tr", {"data-testid": "peer-row", "data-peer": p.key},
      cell("key", keyCell(p.key)), cell("addresses", (p.addresses || []).join(" ") || dash),
      cell("how", p.how || dash), cell("connected", p.connected === undefined ? dash : (p.connected ? "yes" : "no")),
      cell("last_seen", when(p.last_seen_ms)), cell("last_error", sentence(p.last_error) || dash, {class: p.last_error ? "why" : ""}),
      cell("bytes_in", num(p.bytes_in)), cell("bytes_out", num(p.bytes_out)),
      cell("banks", (p.banks || []).join(", ") || dash), cell("refused", reasons(p.refused))));
    table($("peers-table"), ["peer", "addresses", "found by", "connected", "last seen", "last error", "bytes in",
      "bytes out", "banks shared", "refused from it"], rows, state.errors.peers || "no peers known");
  }

  function renderRefusals() {
    const data = state.refusals;
    const list = (data && data.refusals) || [];
    const rows = list.map((r) => h("tr", {"data-testid": "refusal-row", "data-entry": r.entry, "data-cursor": r.cursor},
      cell("first_seen", when(r.first_seen_ms)), cell("bank", r.bank || r.db || dash),
      cell("reason", h("span", {class: "badge bad"}, r.reason)), cell("source", keyCell(r.source)),
      cell("author", r.author ? keyCell(r.author) : dash),
      cell("explain", [h("code", {title: r.entry}, shortKey(r.entry)), h("pre", {class: "explain"}, r.explain || "")])));
    table($("refusals-table"), ["first seen", "bank", "reason", "from", "author", "entry and why"], rows,
      state.errors.refusals || "nothing refused");
    $("refusals-page").textContent = `page ${state.pages.length}`;
    $("refusals-older").disabled = !(data && data.next !== null && data.next !== undefined);
    $("refusals-newest").disabled = state.pages.length === 1;
  }

  function show(v) {
    if (v === null || v === undefined) return dash;
    if (Array.isArray(v)) return v.map(show).join(", ") || dash;
    if (typeof v === "object") return Object.entries(v).map(([k, x]) => `${k}: ${show(x)}`).join("; ") || dash;
    return String(v);
  }

  function renderAgents() {
    const list = (state.agents && state.agents.agents) || [];
    const rows = list.map((a) => h("tr", {"data-testid": "agent-row", "data-agent": a.name},
      cell("name", a.name), cell("key", h("span", {class: "key", title: a.key}, h("code", {}, shortKey(a.key)))),
      cell("attached", has(a, "attached") ? show(a.attached) : dash), cell("config", has(a, "config") ? show(a.config) : dash)));
    table($("agents-table"), ["agent", "key", "attached banks", "auto-recall config"], rows, state.errors.agents || "no agents");
    const select = $("preview-agent");
    const chosen = select.value;
    select.replaceChildren(...list.map((a) => h("option", {value: a.name}, a.name)));
    if (list.some((a) => a.name === chosen)) select.value = chosen;
  }

  function render() {
    renderNode(); renderOverview(); renderBanks(); renderBank(); renderPeers(); renderRefusals(); renderAgents();
    const err = ALL.filter((k) => state.errors[k]).map((k) => `${k}: ${state.errors[k]}`).join(" · ");
    $("load-error").textContent = err;
    $("as-of").textContent = state.asOf.status ? `status as of ${state.asOf.status.toLocaleTimeString()}` : "";
  }

  // ------------------------------------------------------------------ the memory browser
  // The recall command as an agent of this node that may read the bank (recall is an agent's
  // tool: its trust labels are that reader's). Empty search: newest first. Paged on the page.
  function readers(d) {
    if (d.kind === "agent") return [d.name];
    const keys = ((state.grants[d.id] || {}).keys || []).filter((k) => k.status === "active" && k.is && k.is.kind === "agent" && k.is.name);
    return [...new Set(keys.map((k) => k.is.name))];
  }

  function renderBrowseAgents(d) {
    const b = state.browse;
    const names = readers(d);
    const select = $("browse-agent");
    if ([...select.options].map((o) => o.value).join("\n") !== names.join("\n")) {
      select.replaceChildren(...names.map((n) => h("option", {value: n}, n)));
    }
    if (b.bank !== d.id) {
      Object.assign(b, {bank: d.id, agent: "", query: "", page: 0, memories: null, error: ""});
      $("browse-query").value = "";
    }
    if (!b.agent && names.length) { b.agent = names[0]; select.value = b.agent; runBrowse(); }
    else if (b.agent && names.includes(b.agent)) select.value = b.agent;
    if (!names.length) {
      b.memories = null;
      b.error = state.grants[d.id] || d.kind !== "bank" ? `no agent of this node may read ${dbName(d)}: grant one read to browse it` : "loading…";
    }
    renderBrowse();
  }

  async function runBrowse() {
    const b = state.browse;
    if (!b.agent || !b.bank) return;
    b.loading = true;
    renderBrowse();
    try {
      const data = await api("POST", `/v1/agents/${encodeURIComponent(b.agent)}/tools/recall`,
        {query: b.query, bank: b.bank, limit: BROWSE_PAGE + 1, offset: b.page * BROWSE_PAGE});
      b.memories = data.memories || []; // this page, and one more to tell whether a next page exists
      b.error = "";
    } catch (e) {
      if (e instanceof Unauthorized) { signOut(e.message); return; }
      b.memories = null;
      b.error = e.message;
    } finally {
      b.loading = false;
    }
    renderBrowse();
  }

  const TIER_CLASS = {owner: "ok", derived: "ok", peer: "", ingested: "warn", flagged: "bad", quarantined: "bad"};

  function memoryItem(m) {
    const flags = [].concat(m.flags || [], m.flagged ? [m.flagged] : [], m.secret ? ["contains a secret"] : []);
    const explain = h("pre", {class: "explain", "data-testid": "memory-explain"});
    const details = h("details", {ontoggle: async () => {
      if (!details.open || explain.dataset.ready) return;
      explain.textContent = "asking…";
      try {
        const data = await api("POST", "/v1/explain", {entry_id: m.entry, bank: state.browse.bank});
        explain.textContent = data.explanation || show(data);
      } catch (e) { explain.textContent = e.message; }
      explain.dataset.ready = "true";
    }}, h("summary", {}, "explain"), explain);
    return h("li", {class: "memory", "data-testid": "memory-row", "data-entry": m.entry, "data-key": m.key},
      h("div", {class: "memory-head"}, h("b", {"data-field": "key"}, m.key), " ",
        h("span", {class: `badge ${TIER_CLASS[m.trust] || ""}`, "data-field": "trust", title: "trust tier for the reading agent"}, m.trust || dash),
        flags.map((f) => h("span", {class: "badge bad", "data-field": "flag"}, show(f)))),
      h("p", {class: "memory-value", "data-field": "value"}, m.value),
      h("div", {class: "memory-meta"}, "by ", h("span", {"data-field": "author"}, keyCell(m.written_by)),
        " · ", h("time", {"data-field": "time", datetime: m.time || ""}, m.time ? new Date(m.time).toLocaleString() : dash),
        (m.tags || []).length ? [" · tags ", (m.tags || []).join(", ")] : ""),
      details);
  }

  function renderBrowse() {
    const b = state.browse;
    const list = b.memories || [];
    const start = b.page * BROWSE_PAGE;
    const shown = list.slice(0, BROWSE_PAGE);
    $("browse-list").replaceChildren(h("ul", {class: "memories"}, shown.map(memoryItem)));
    let note = b.loading ? "searching…" : b.error;
    if (!note && b.memories) {
      note = !list.length ? "no memory matched" : `${b.query ? "best matches" : "newest first"}, ${start + 1}–${start + shown.length}`
        + ` (read as ${b.agent})`;
      if (list.length > BROWSE_PAGE && start + BROWSE_PAGE > RECALL_MAX_OFFSET) note += `: pages reach the first ${RECALL_MAX_OFFSET + BROWSE_PAGE}; narrow the search`;
    }
    $("browse-note").textContent = note || "";
    $("browse-note").className = b.error ? "error" : "note";
    $("browse-page").textContent = b.memories ? `page ${b.page + 1}` : "";
    $("browse-prev").disabled = b.page === 0 || b.loading;
    $("browse-next").disabled = b.loading || list.length <= BROWSE_PAGE || start + BROWSE_PAGE > RECALL_MAX_OFFSET;
  }

  // ------------------------------------------------------------------ actions
  // Each action is the registry command the CLI runs, confirmed first in a dialog, its answer's
  // text shown after (the same line the terminal prints).
  function ask(title, text, fields, okText) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    const inputs = {};
    $("confirm-fields").replaceChildren(...(fields || []).map((f) => {
      let input;
      if (f.options) input = h("select", {name: f.name}, f.options.map((o) => h("option", {value: o, selected: o === f.value}, o)));
      else input = h("input", {name: f.name, value: f.value || "", list: f.list || null, spellcheck: "false", required: f.required});
      input.dataset.testid = `confirm-${f.name}`;
      inputs[f.name] = input;
      return h("label", {class: "field"}, f.label, input);
    }));
    dialog.querySelector("[data-testid=confirm-ok]").textContent = okText || "Confirm";
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => {
        if (dialog.returnValue !== "ok") { resolve(null); return; }
        resolve(Object.fromEntries(Object.entries(inputs).map(([k, el]) => [k, el.value.trim()])));
      }, {once: true});
    });
  }

  function showResult(text, ok) {
    const el = $("action-result");
    el.hidden = false;
    el.className = `result ${ok ? "ok" : "bad"}`;
    el.dataset.ok = String(ok);
    el.textContent = text;
  }

  async function perform(what, fn) {
    try {
      const answer = await fn();
      showResult(answer.text || `${what}: done`, true);
      return answer;
    } catch (e) {
      if (e instanceof Unauthorized) { signOut(e.message); return null; }
      showResult(`${what}: ${e.message}`, false);
      return null;
    } finally {
      stale(ALL);
    }
  }

  const label = (key) => { const k = nameOf(key); return k ? k.name : shortKey(key); };

  async function actSync(d) {
    if (!await ask(`Sync ${dbName(d)} now`, `Exchange ${dbName(d)} with each of its peers now (memmesh sync --bank ${dbName(d)}).`, [], "Sync now")) return;
    await perform("sync", () => call("POST", "/v1/sync", {bank: d.id}));
  }

  async function actShare(d) {
    const v = await ask(`Share ${dbName(d)}`, "Make a signed ticket another peer imports the bank with (memmesh memory share).",
      [{name: "perm", label: "the importing peer may", options: ["read", "write", "admin"], value: "write"},
        {name: "expires", label: "valid for (30m, 12h, 7d)", value: "7d", required: true}], "Make ticket");
    if (!v) return;
    const answer = await perform("share", () => call("POST", "/v1/memory/share", {bank: d.id, perm: v.perm, expires: v.expires}));
    if (!answer) return;
    showResult(`made a ${v.perm} ticket for ${dbName(d)} (shown once)`, true);
    $("ticket-text").value = answer.data.ticket;
    $("ticket-note").textContent = (answer.text || "").split("\n").slice(1).join(" ").trim();
    $("ticket").showModal();
    $("ticket-text").select();
  }

  function holderOptions() {
    const names = ((state.agents && state.agents.agents) || []).map((a) => a.name);
    const labels = Object.values(state.grants).flatMap((g) => ((g && g.keys) || []).map((k) => k.label));
    return [...new Set([...names, ...labels])];
  }

  async function actGrant(d) {
    const list = h("datalist", {id: "holders"}, holderOptions().map((n) => h("option", {value: n})));
    $("confirm-fields").after(list);
    const v = await ask(`Grant on ${dbName(d)}`, "Let a local agent, a peer or any key read or write this bank (memmesh memory grant).",
      [{name: "agent", label: "who (agent name, label or ed25519:… key)", list: "holders", required: true},
        {name: "perm", label: "may", options: ["read", "write"], value: "read"}], "Grant");
    list.remove();
    if (!v || !v.agent) return;
    await perform("grant", () => call("POST", "/v1/memory/grant", {bank: d.id, agent: v.agent, perm: v.perm}));
  }

  async function actRevoke(d, g) {
    if (!await ask(`Revoke ${label(g.key)}`, `${label(g.key)} (${g.key}) loses its ${g.level} on ${dbName(d)}, on every replica (memmesh memory revoke).`, [], "Revoke")) return;
    await perform("revoke", () => call("POST", "/v1/memory/revoke", {bank: d.id, agent: g.key}));
  }

  async function actQuarantine(d) {
    const writers = (d.grants || []).filter((g) => g.status === "active" && (g.level === "write" || g.level === "admin"))
      .map((g) => g.key).filter((k) => { const n = nameOf(k); return !n || (n.name !== "this node" && !n.name.startsWith("bank ")); });
    const byName = new Map(writers.map((k) => [`${label(k)} (${shortKey(k)})`, k]));
    if (!byName.size) { showResult(`quarantine: ${dbName(d)} has no writer to quarantine`, false); return; }
    const v = await ask(`Quarantine a writer of ${dbName(d)}`, "Hide every row a writer signed, on every replica, until released. The next step shows how many rows it hides.",
      [{name: "who", label: "writer", options: [...byName.keys()]}], "Preview");
    if (!v) return;
    const who = byName.get(v.who);
    let preview;
    try { preview = await call("POST", "/v1/memory/quarantine", {bank: d.id, who, preview: true}); } catch (e) {
      if (e instanceof Unauthorized) { signOut(e.message); return; }
      showResult(`quarantine: ${e.message}`, false);
      return;
    }
    if (!await ask(`Quarantine ${label(who)}`, preview.text, [], "Quarantine")) return;
    await perform("quarantine", () => call("POST", "/v1/memory/quarantine", {bank: d.id, who}));
  }

  async function actRelease(d, q) {
    if (!await ask(`Release the quarantine of ${label(q.key)}`, `What it hid in ${dbName(d)} is recalled again (memmesh memory release).`, [], "Release")) return;
    await perform("release", () => call("POST", "/v1/memory/release", {bank: d.id, quarantine: q.id}));
  }

  // ------------------------------------------------------------------ tabs (WAI-ARIA tabs)
  function route() {
    const hash = decodeURIComponent(location.hash.replace(/^#/, ""));
    const before = `${state.tab}/${state.bank}`;
    if (hash.startsWith("bank/")) { state.tab = "bank"; state.bank = hash.slice(5); }
    else state.tab = TABS.includes(hash) ? hash : "overview";
    document.querySelectorAll(".tab").forEach((el) => { el.hidden = el.id !== `tab-${state.tab}`; });
    const selected = state.tab === "bank" ? "banks" : state.tab;
    document.querySelectorAll("#tabs [role=tab]").forEach((a) => {
      const on = a.dataset.tab === selected;
      a.classList.toggle("active", on);
      a.setAttribute("aria-selected", String(on));
      a.tabIndex = on ? 0 : -1;
    });
    document.body.dataset.tab = state.tab;
    renderBank();
    if (state.tab === "bank" && before !== `${state.tab}/${state.bank}` && token()) stale(["quarantines"]);
  }

  $("tabs").addEventListener("keydown", (ev) => {
    const tabs = [...document.querySelectorAll("#tabs [role=tab]")];
    const i = tabs.indexOf(document.activeElement);
    if (i < 0) return;
    const next = {ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1}[ev.key];
    if (next === undefined && ev.key !== " ") return;
    ev.preventDefault();
    const target = ev.key === " " ? tabs[i] : tabs[(next + tabs.length) % tabs.length];
    target.focus();
    location.hash = target.dataset.tab; // selection follows focus
  });

  // ------------------------------------------------------------------ the token
  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (state.streamAbort) state.streamAbort.abort();
    $("app").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    setStream("idle", "not connected");
  }

  async function signIn() {
    $("login").hidden = true;
    $("app").hidden = false;
    $("logout").hidden = false;
    route();
    try {
      await load(ALL);
    } catch (e) {
      if (e instanceof Unauthorized) { signOut(`The token was refused: ${e.message}`); return; }
    }
    stream();
  }

  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("token-input").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("token-input").value = "";
    signIn();
  });
  $("logout").addEventListener("click", () => signOut(""));
  $("refusals-older").addEventListener("click", () => {
    if (state.refusals && state.refusals.next !== null && state.refusals.next !== undefined) {
      state.pages.push(state.refusals.next);
      stale(["refusals"]);
    }
  });
  $("refusals-newest").addEventListener("click", () => { state.pages = [null]; stale(["refusals"]); });
  $("preview-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const agent = $("preview-agent").value;
    const messages = $("preview-messages").value.split(/\r?\n/).filter((m) => m.trim());
    const out = $("preview-block");
    $("preview-error").textContent = "";
    out.dataset.ready = "false";
    try {
      // A preview: no model sees this block, so its lines are not counted as injections.
      const data = await api("POST", `/v1/agents/${encodeURIComponent(agent)}/autorecall`, {messages, no_count: true});
      out.textContent = data.block; // verbatim: exactly what the agent would get
      const lines = (data.lines || []).map((l) => h("tr", {"data-testid": "preview-line"},
        cell("text", l.text), cell("bank", l.bank || "own memory"), cell("key", l.key || dash),
        cell("score", typeof l.score === "number" ? l.score.toPrecision(4) : num(l.score), {title: String(l.score)})));
      table($("preview-lines"), ["line", "bank", "key", "score"], lines,
        has(data, "lines") ? "no memory matched" : "this serve does not report lines");
      out.dataset.ready = "true";
    } catch (e) {
      if (e instanceof Unauthorized) { signOut(e.message); return; }
      $("preview-error").textContent = e.message;
    }
  });
  $("browse-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    Object.assign(state.browse, {query: $("browse-query").value.trim(), agent: $("browse-agent").value, page: 0});
    runBrowse();
  });
  $("browse-next").addEventListener("click", () => { state.browse.page += 1; runBrowse(); });
  $("browse-prev").addEventListener("click", () => { state.browse.page = Math.max(0, state.browse.page - 1); runBrowse(); });
  $("ticket-copy").addEventListener("click", async () => {
    const text = $("ticket-text");
    text.select();
    try { await navigator.clipboard.writeText(text.value); $("ticket-copy").textContent = "Copied"; } catch (e) {
      $("ticket-copy").textContent = "Press Ctrl+C"; // clipboard refused (not a secure context): it is selected
    }
  });
  // The ticket is shown once: closing the dialog forgets it.
  $("ticket").addEventListener("close", () => { $("ticket-text").value = ""; $("ticket-copy").textContent = "Copy"; });
  window.addEventListener("hashchange", route);

  if (token()) signIn(); else signOut("");
})();
