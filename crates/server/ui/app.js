// Permit's dashboard. Plain JavaScript, no dependencies, nothing fetched from elsewhere.
//
// Initial state comes from the JSON API; after that the event stream (`GET /v1/events`, read
// with fetch so that it can carry the token) says when something changed, and the view re-reads
// the JSON of what it shows. Charts and grants per second start from the node's history of each
// semaphore (`GET /v1/semaphores/{name}/history`: the last 15 minutes, read once per name), then
// go on from the events seen since.
'use strict';

(() => {
  const TOKEN_KEY = 'permit.token';
  const LEVEL = { read: 1, write: 2, admin: 3 };
  const SERIES_SECONDS = 900;
  const SPARK_SECONDS = 60;
  const NAMES_TRACKED_MAX = 500;
  // Items listed on a queue's page (the first, in id order).
  const QUEUE_ITEMS_SHOWN = 100;
  // Histories read for a list view, at most, and at most this many at a time.
  const LIST_HISTORIES_MAX = 100;
  const HISTORY_READS_IN_FLIGHT = 4;
  // Sortable, filterable columns of each list view: key, header, value to sort by.
  const COLUMNS = {
    semaphores: [
      ['name', 'Name', (s) => s.name],
      ['held', 'Held / capacity', (s) => s.held],
      ['holders', 'Holders', (s) => s.holders],
      ['waiters', 'Waiters', (s) => s.waiters],
      ['oldest', 'Oldest wait', (s) => s.oldest_wait_ms ?? -1],
      ['grants', 'Grants/s (1 min)', (s) => grantRate(s.name)],
    ],
    elections: [
      ['name', 'Name', (e) => e.name],
      ['leader', 'Leader', (e) => (e.leader ? e.leader.session_name || e.leader.session : '')],
      ['value', 'Value', (e) => (e.leader ? e.leader.value : '')],
      ['token', 'Token', (e) => (e.leader ? e.leader.token : -1)],
      ['tenure', 'Tenure', (e) => (e.leader ? e.leader.held_ms || 0 : -1)],
      ['candidates', 'Candidates', (e) => e.candidates],
    ],
    queues: [
      ['name', 'Name', (q) => q.name],
      ['pending', 'Pending', (q) => q.pending],
      ['claimed', 'Claimed', (q) => q.claimed],
      ['delayed', 'Delayed', (q) => q.delayed],
      ['claimers', 'Waiting workers', (q) => q.claimers],
      ['oldest', 'Oldest pending', (q) => q.oldest_pending_ms ?? -1],
    ],
    sessions: [
      ['name', 'Name', (s) => s.name || ''],
      ['id', 'Id', (s) => s.id],
      ['ttl', 'TTL', (s) => s.ttl_ms],
      ['remaining', 'Remaining', (s) => s.remaining_ms ?? -1],
      ['holds', 'Holds', (s) => s.holds],
      ['waits', 'Waits', (s) => s.waits],
    ],
  };
  // What a list view's filter matches: the name (and a session's id).
  const FILTERED = {
    semaphores: (s) => [s.name],
    elections: (e) => [e.name],
    queues: (q) => [q.name],
    sessions: (s) => [s.name || '', s.id],
  };

  const S = {
    auth: false,
    token: sessionStorage.getItem(TOKEN_KEY),
    rules: null,
    whoami: '',
    lastSeq: null,
    mode: 'connecting',
    stream: null,
    grants: new Map(), // semaphore -> Map(second -> grants)
    queuedAt: new Map(), // semaphore -> Map(session -> local ms it queued, or was first seen waiting)
    queuedSeen: new Map(), // semaphore -> Set(session) whose queued event this page saw
    series: new Map(), // semaphore -> [{t, held, waiting, capacity}]
    last: new Map(), // semaphore -> {held, waiting, capacity}
    data: null, // what the current view last read, with the local time it was read
    route: null,
    refreshTimer: null,
    refreshing: false,
    refreshAgain: false,
    pollTimer: null,
    node: { id: null, addr: '', role: '' },
    histories: new Map(), // semaphore -> seconds of history read or being read (once per tab and length)
    historyQueue: [],
    historyReads: 0,
    lists: {}, // view -> {sort, dir, filter}
    generation: 0, // bumped when the token is forgotten: answers read with it are dropped
  };

  // ---- DOM helpers (no innerHTML: every value from the server goes in as text) ----

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') el.className = value;
      else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function svg(tag, attrs, ...children) {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
    for (const child of children) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    return el;
  }

  function td(label, value, cls) {
    return h('td', { 'data-label': label, class: cls }, value);
  }

  function $(id) {
    return document.getElementById(id);
  }

  function duration(ms) {
    if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
    const s = Math.max(0, Math.floor(ms / 1000));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  }

  // A length of time that may be under a second (a rate's period, a lock-delay).
  function period(ms) {
    return ms < 1000 ? `${ms} ms` : duration(ms);
  }

  function short(id) {
    return id ? id.slice(0, 8) : '';
  }

  // ---- API ----

  function headers(extra) {
    const all = Object.assign({ Accept: 'application/json' }, extra || {});
    if (S.auth && S.token) all.Authorization = `Bearer ${S.token}`;
    return all;
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(`${code}: ${message}`);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    const init = { method, headers: headers(body ? { 'Content-Type': 'application/json' } : {}) };
    if (body) init.body = JSON.stringify(body);
    const res = await fetch(path, init);
    const text = await res.text();
    const json = text ? JSON.parse(text) : null;
    if (!res.ok) {
      const error = (json && json.error) || { code: `http_${res.status}`, message: text };
      throw new ApiError(res.status, error.code, error.message);
    }
    return json;
  }

  // What the token may do, as the server decides it: the matching rule with the longest prefix.
  function can(resource, name, access) {
    if (!S.auth) return true;
    // The root token may do everything, also on resources newer than its stored rules.
    if (S.root) return true;
    if (!S.rules) return false;
    let best = null;
    for (const rule of S.rules) {
      if (rule.resource !== resource || !name.startsWith(rule.prefix)) continue;
      if (!best || rule.prefix.length > best.prefix.length) best = rule;
    }
    return !!best && LEVEL[best.access] >= LEVEL[access];
  }

  // ---- live state from events ----

  function bump(map, name, key, fn) {
    let inner = map.get(name);
    if (!inner) {
      if (map.size >= NAMES_TRACKED_MAX) return;
      inner = new Map();
      map.set(name, inner);
    }
    fn(inner, key);
  }

  function forgetWaiter(name, session) {
    const waits = S.queuedAt.get(name);
    if (waits) waits.delete(session);
    const seen = S.queuedSeen.get(name);
    if (seen) seen.delete(session);
  }

  function onEvent(event) {
    if (typeof event.seq === 'number') S.lastSeq = event.seq;
    if (event.object_kind === 'semaphore' && event.name) {
      const name = event.name;
      switch (event.kind) {
        case 'queued':
          bump(S.queuedAt, name, event.session, (m, k) => m.set(k, Date.now()));
          if (!S.queuedSeen.has(name)) S.queuedSeen.set(name, new Set());
          S.queuedSeen.get(name).add(event.session);
          break;
        case 'granted': {
          const second = Math.floor(Date.now() / 1000);
          bump(S.grants, name, second, (m, k) => m.set(k, (m.get(k) || 0) + 1));
          forgetWaiter(name, event.session);
          break;
        }
        case 'wait_ended':
        case 'released':
        case 'expired':
        case 'revoked':
          forgetWaiter(name, event.session);
          break;
        default:
          break;
      }
    }
    refreshSoon();
  }

  function onFrame(frame) {
    let type = 'message';
    const data = [];
    for (const line of frame.split('\n')) {
      if (line === '' || line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'event') type = value;
      else if (field === 'data') data.push(value);
      else if (field === 'id' && /^\d+$/.test(value)) S.lastSeq = Number(value);
    }
    if (data.length === 0) return;
    if (type === 'missed') {
      refreshSoon();
      return;
    }
    try {
      onEvent(JSON.parse(data.join('\n')));
    } catch (error) {
      console.warn('unreadable event', error);
    }
  }

  function setMode(mode) {
    S.mode = mode;
    const live = $('live');
    live.dataset.mode = mode;
    live.textContent = {
      events: 'live',
      polling: 'live (polling: no event stream)',
      connecting: 'connecting',
      offline: 'reconnecting',
    }[mode];
  }

  async function stream() {
    for (let attempt = 0; ; attempt += 1) {
      const controller = new AbortController();
      S.stream = controller;
      try {
        const extra = S.lastSeq === null ? {} : { 'Last-Event-ID': String(S.lastSeq) };
        const res = await fetch('/v1/events', {
          headers: headers(Object.assign({ Accept: 'text/event-stream' }, extra)),
          signal: controller.signal,
          cache: 'no-store',
        });
        if (res.status === 404) {
          setMode('polling');
          startPolling();
          return;
        }
        if (!res.ok || !res.body) throw new Error(`event stream answered ${res.status}`);
        setMode('events');
        attempt = 0;
        refreshSoon();
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            onFrame(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
          }
        }
      } catch (error) {
        if (controller.signal.aborted) return;
      }
      if (controller.signal.aborted) return;
      setMode('offline');
      await new Promise((resolve) => setTimeout(resolve, Math.min(5000, 250 * 2 ** Math.min(attempt, 5))));
      if (controller.signal.aborted) return;
    }
  }

  // Only when the server has no event stream: re-read the current view's JSON twice a second.
  function startPolling() {
    if (S.pollTimer) return;
    S.pollTimer = setInterval(refreshSoon, 500);
  }

  // ---- history: the node's last 15 minutes of a semaphore, read once per name ----

  // The list's sparklines need a minute; a semaphore's chart the whole 15 minutes.
  function loadHistory(name, seconds) {
    const had = S.histories.get(name) || 0;
    if (had >= seconds || (!had && S.histories.size >= NAMES_TRACKED_MAX)) return;
    S.histories.set(name, seconds);
    S.historyQueue.push([name, seconds, had]);
    pumpHistories();
  }

  function pumpHistories() {
    while (S.historyReads < HISTORY_READS_IN_FLIGHT && S.historyQueue.length) {
      const [name, seconds, had] = S.historyQueue.shift();
      const generation = S.generation;
      S.historyReads += 1;
      api('GET', `/v1/semaphores/${encodeURIComponent(name)}/history?seconds=${seconds}`)
        .then((body) => {
          if (generation !== S.generation) return;
          mergeHistory(name, body, Date.now());
          paint();
        })
        .catch(() => { // read again when next shown
          if (generation !== S.generation) return;
          if (had) S.histories.set(name, had);
          else S.histories.delete(name);
        })
        .finally(() => {
          S.historyReads -= 1;
          pumpHistories();
        });
    }
  }

  // Puts the history before what the page saw itself: chart points older than its first own
  // point, and grants of each second (the larger count where both saw the second). Times are
  // the node's clock, shifted to this browser's by the difference at the answer.
  function mergeHistory(name, body, receivedAt) {
    const shift = receivedAt - body.now_ms;
    let series = S.series.get(name);
    if (!series) {
      if (S.series.size >= NAMES_TRACKED_MAX) return;
      series = [];
      S.series.set(name, series);
    }
    const firstOwn = series.length ? series[0].t : Infinity;
    const older = body.samples
      .map((p) => ({ t: p.at_ms + shift, held: p.held, waiting: p.waiters, capacity: p.capacity }))
      .filter((p) => p.t < firstOwn && p.t >= receivedAt - SERIES_SECONDS * 1000);
    series.unshift(...older);
    const oldest = Math.floor(receivedAt / 1000) - SPARK_SECONDS;
    for (const p of body.samples) {
      const second = Math.floor((p.at_ms + shift) / 1000);
      if (second < oldest || p.grants === 0) continue;
      bump(S.grants, name, second, (m, k) => m.set(k, Math.max(m.get(k) || 0, p.grants)));
    }
    if (!S.last.has(name) && body.samples.length) {
      const p = body.samples[body.samples.length - 1];
      S.last.set(name, { held: p.held, waiting: p.waiters, capacity: p.capacity });
    }
  }

  // ---- the node this page talks to ----

  async function readNode() {
    try {
      // A 503 (not ready) carries the same report: only an unreadable answer is unreachable.
      const res = await fetch('/v1/health', { headers: { Accept: 'application/json' }, cache: 'no-store' });
      const health = await res.json();
      S.node.id = health.node_id;
      S.node.role = health.raft_role;
    } catch (error) {
      S.node.role = 'unreachable';
    }
    paintNode();
  }

  function paintNode() {
    const el = $('node');
    el.dataset.role = S.node.role;
    el.replaceChildren(
      h('span', { id: 'node-id' }, `node ${S.node.id ?? '?'}`), ' ',
      h('code', { id: 'node-addr' }, S.node.addr), ' ',
      h('span', { id: 'node-role', class: 'pill' }, S.node.role || '…'));
  }

  // ---- views ----

  function routeOf(hash) {
    const parts = hash.replace(/^#\/?/, '').split('/');
    const view = parts[0] || 'semaphores';
    if (view === 'semaphore' && parts[1]) return { view, name: decodeURIComponent(parts.slice(1).join('/')) };
    if (view === 'session' && /^[0-9a-f]{32}$/.test(parts[1] || '')) return { view, id: parts[1] };
    if (view === 'queue' && parts[1]) return { view, name: decodeURIComponent(parts.slice(1).join('/')) };
    if (['semaphores', 'elections', 'queues', 'sessions'].includes(view)) {
      // `#/elections/NAME`: the list, filtered by that name.
      return { view, filter: parts[1] ? decodeURIComponent(parts.slice(1).join('/')) : null };
    }
    if (view === 'cluster') return { view };
    return { view: 'semaphores' };
  }

  const LOADERS = {
    async cluster() {
      const health = await api('GET', '/v1/health');
      const cluster = can('cluster', '', 'read') ? await api('GET', '/v1/cluster') : null;
      return { health, cluster };
    },
    async semaphores() {
      return api('GET', '/v1/semaphores?limit=1000');
    },
    async semaphore(route) {
      return api('GET', `/v1/semaphores/${encodeURIComponent(route.name)}`);
    },
    async elections() {
      return api('GET', '/v1/elections?limit=1000');
    },
    async queues() {
      return api('GET', '/v1/queues?limit=1000');
    },
    async queue(route) {
      const name = encodeURIComponent(route.name);
      const [queue, items] = await Promise.all([
        api('GET', `/v1/queues/${name}`),
        api('GET', `/v1/queues/${name}/items?limit=${QUEUE_ITEMS_SHOWN}`),
      ]);
      return { queue, items };
    },
    async sessions() {
      return api('GET', '/v1/sessions?limit=1000');
    },
    async session(route) {
      return api('GET', `/v1/sessions/${route.id}`);
    },
  };

  function refreshSoon() {
    if (S.refreshTimer) return;
    S.refreshTimer = setTimeout(() => {
      S.refreshTimer = null;
      refresh();
    }, 100);
  }

  async function refresh() {
    if (S.refreshing) {
      S.refreshAgain = true;
      return;
    }
    const route = S.route;
    if (!route) return;
    S.refreshing = true;
    try {
      const body = await LOADERS[route.view](route);
      if (route !== S.route) return;
      S.data = { route, body, at: Date.now() };
      remember(route, body);
      if (route.view === 'semaphore') loadHistory(body.name, SERIES_SECONDS);
      if (route.view === 'semaphores') body.semaphores.slice(0, LIST_HISTORIES_MAX).forEach((sem) => loadHistory(sem.name, SPARK_SECONDS));
      paint();
      $('updated').textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      if (route === S.route) showError(error);
    } finally {
      S.refreshing = false;
      if (S.refreshAgain) {
        S.refreshAgain = false;
        refreshSoon();
      }
    }
  }

  // Keeps the last known numbers of each semaphore for its charts, and the first time each
  // waiter was seen (when its `queued` event came before the page loaded).
  function remember(route, body) {
    if (route.view === 'semaphores') {
      for (const s of body.semaphores) S.last.set(s.name, { held: s.held, waiting: s.waiters, capacity: s.capacity });
    } else if (route.view === 'semaphore') {
      S.last.set(body.name, { held: body.held, waiting: body.waiters.length, capacity: body.capacity });
      // Every change read is a point of its chart (the 1 s tick adds points between changes).
      const series = S.series.get(body.name);
      if (series) series.push(Object.assign({ t: Date.now() }, S.last.get(body.name)));
      const known = new Set(body.waiters.map((w) => w.session));
      bump(S.queuedAt, body.name, null, (m) => {
        for (const session of known) if (!m.has(session)) m.set(session, Date.now());
        for (const session of [...m.keys()]) if (!known.has(session)) m.delete(session);
      });
    }
  }

  function sample() {
    const t = Date.now();
    for (const [name, last] of S.last) {
      let series = S.series.get(name);
      if (!series) {
        if (S.series.size >= NAMES_TRACKED_MAX) continue;
        series = [];
        S.series.set(name, series);
      }
      series.push(Object.assign({ t }, last));
      while (series.length && series[0].t < t - SERIES_SECONDS * 1000) series.shift();
    }
    const oldest = Math.floor(t / 1000) - SPARK_SECONDS;
    for (const counts of S.grants.values()) for (const second of counts.keys()) if (second < oldest) counts.delete(second);
  }

  function showError(error) {
    const content = $('content') || $('view');
    content.replaceChildren(h('p', { class: 'error', id: 'view-error' }, error.message || String(error)));
  }

  function paint() {
    if (!S.data || S.data.route !== S.route) return;
    const { route, body, at } = S.data;
    const age = Date.now() - at;
    const content = $('content');
    const painter = {
      cluster: paintCluster,
      semaphores: paintSemaphores,
      semaphore: paintSemaphore,
      elections: paintElections,
      queues: paintQueues,
      queue: paintQueue,
      sessions: paintSessions,
      session: paintSession,
    }[route.view];
    content.replaceChildren(...painter(body, age, route));
    // Numeric columns: the header aligns as its cells do.
    for (const table of content.querySelectorAll('table')) {
      const first = table.querySelector('tbody tr');
      if (!first) continue;
      table.querySelectorAll('thead th').forEach((th, i) => {
        if (first.cells[i] && first.cells[i].classList.contains('num')) th.classList.add('num');
      });
    }
  }

  // A link to a session's page, shown by its name (or its short id).
  // A link to a session's page; with its acquire's group, when it named one.
  function sessionLink(id, name, group) {
    const link = h('a', { href: `#/session/${id}`, class: 'session-link', 'data-session': id }, name || short(id));
    return group ? h('span', {}, link, ' ', h('span', { class: 'pill group' }, group)) : link;
  }

  // The list view's sort and filter, kept while the tab lives.
  function listState(view) {
    if (!S.lists[view]) S.lists[view] = { sort: null, dir: 1, filter: '' };
    return S.lists[view];
  }

  // The items of a list view that pass its filter, in its sort order.
  function sortedFiltered(view, items) {
    const state = listState(view);
    const needle = state.filter.trim().toLowerCase();
    let shown = needle ? items.filter((item) => FILTERED[view](item).some((v) => v.toLowerCase().includes(needle))) : items.slice();
    const column = COLUMNS[view].find(([key]) => key === state.sort);
    if (column) {
      const value = column[2];
      shown = shown.sort((a, b) => {
        const x = value(a);
        const y = value(b);
        const order = typeof x === 'string' ? x.localeCompare(y) : x - y;
        return order * state.dir;
      });
    }
    return shown;
  }

  // A list view's table: headers that sort on a click, the rows given.
  function listTable(view, id, rows, total) {
    const state = listState(view);
    const heads = COLUMNS[view].map(([key, label]) => {
      const sorted = state.sort === key;
      return h('th', {
        class: 'sortable', 'data-sort': key, tabindex: 0,
        'aria-sort': sorted ? (state.dir > 0 ? 'ascending' : 'descending') : 'none',
        onclick: () => sortBy(view, key),
        onkeydown: (event) => { if (event.key === 'Enter') sortBy(view, key); },
      }, label, sorted ? (state.dir > 0 ? ' ▲' : ' ▼') : '');
    });
    const out = [h('table', { class: 'responsive', id }, h('thead', {}, h('tr', {}, heads)), h('tbody', {}, rows))];
    if (rows.length < total) out.push(h('p', { class: 'muted', id: 'filtered' }, `${rows.length} of ${total} shown (filter)`));
    return out;
  }

  function sortBy(view, key) {
    const state = listState(view);
    if (state.sort === key) state.dir = -state.dir;
    else Object.assign(state, { sort: key, dir: 1 });
    paint();
  }

  // The filter box of a list view: outside the repainted content, so that typing survives.
  function filterBox(view, preset) {
    const state = listState(view);
    if (preset !== null && preset !== undefined) state.filter = preset;
    const input = h('input', { id: 'filter', type: 'search', placeholder: 'Filter by name', 'aria-label': 'Filter by name', value: state.filter });
    input.addEventListener('input', () => {
      state.filter = input.value;
      paint();
    });
    return h('div', { class: 'toolbar' }, input);
  }

  function stat(key, value, id) {
    return h('div', { class: 'stat' }, h('div', { class: 'k' }, key), h('div', { class: 'v', id }, value));
  }

  function paintCluster({ health, cluster }) {
    const out = [h('h1', {}, 'Cluster')];
    out.push(
      h('div', { class: 'grid' },
        stat('This node', health.node_id),
        stat('Leader', cluster ? (cluster.leader ?? 'none') : (health.raft_leader ?? 'none'), 'cluster-leader'),
        stat('Term', cluster ? cluster.term : health.raft_term),
        stat('Commit index', cluster ? (cluster.commit_index ?? '—') : '—'),
        stat('Applied index', health.applied_index),
        stat('Status', health.status)),
    );
    if (!cluster) {
      out.push(h('p', { class: 'muted' }, 'This token lacks cluster read access: members are not shown.'));
      return out;
    }
    const rows = cluster.members.map((m) =>
      h('tr', { 'data-member': m.id },
        td('Id', m.id, 'num'),
        td('Address', h('code', {}, m.addr)),
        td('Role', h('span', { class: m.leader ? 'pill leader' : 'pill' }, m.leader ? 'leader' : m.role)),
        td('Matched', m.matched_index ?? '—', 'num'),
        td('Applied', m.applied_index ?? '—', 'num'),
        td('Health', h('span', { class: m.reachable ? 'pill ok' : 'pill down' }, m.reachable ? 'reachable' : 'unreachable'))));
    out.push(h('h2', {}, 'Members'));
    out.push(h('table', { class: 'responsive', id: 'members' },
      h('thead', {}, h('tr', {}, ['Id', 'Address', 'Role', 'Matched index', 'Applied index', 'Health'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows)));
    return out;
  }

  function capacityBar(held, capacity) {
    const ratio = capacity > 0 ? Math.min(1, held / capacity) : 0;
    const bar = h('div', { class: `bar${held > capacity ? ' over' : held === capacity ? ' full' : ''}`, role: 'img', 'aria-label': `${held} of ${capacity}` });
    const fill = h('span');
    fill.style.width = `${(ratio * 100).toFixed(1)}%`;
    bar.append(fill);
    return bar;
  }

  // Grants per second over the last 10 s.
  function grantRate(name) {
    const counts = S.grants.get(name);
    if (!counts) return 0;
    const now = Math.floor(Date.now() / 1000);
    let sum = 0;
    for (let s = now - 9; s <= now; s += 1) sum += counts.get(s) || 0;
    return sum / 10;
  }

  function sparkline(name) {
    const counts = S.grants.get(name) || new Map();
    const now = Math.floor(Date.now() / 1000);
    const values = [];
    for (let s = now - SPARK_SECONDS + 1; s <= now; s += 1) values.push(counts.get(s) || 0);
    const max = Math.max(1, ...values);
    const points = values.map((v, i) => `${(i * 120) / (SPARK_SECONDS - 1)},${(22 - (v / max) * 20 + 1).toFixed(1)}`).join(' ');
    const last10 = grantRate(name);
    return h('div', { class: 'grants', 'data-total': values.reduce((a, b) => a + b, 0) },
      svg('svg', { class: 'spark', viewBox: '0 0 120 24', preserveAspectRatio: 'none', role: 'img', 'aria-label': 'grants per second, last minute' },
        svg('polyline', { points })),
      h('span', { class: 'muted' }, `${last10.toFixed(1)}/s`));
  }

  function oldestWait(name, waiters, oldestMs, age) {
    if (!waiters) return '—';
    if (oldestMs !== null && oldestMs !== undefined) return duration(oldestMs + age);
    const waits = S.queuedAt.get(name);
    if (!waits || waits.size === 0) return '?';
    const since = Math.min(...waits.values());
    const exact = S.queuedSeen.get(name);
    const sure = exact && [...waits.entries()].every(([session]) => exact.has(session));
    return `${sure ? '' : '≥ '}${duration(Date.now() - since)}`;
  }

  function paintSemaphores(body, age) {
    const out = [h('h1', {}, 'Semaphores')];
    if (body.semaphores.length === 0) {
      out.push(h('p', { class: 'muted', id: 'empty' }, 'No semaphores (or none this token may read).'));
      return out;
    }
    const rows = sortedFiltered('semaphores', body.semaphores).map((s) =>
      h('tr', { 'data-name': s.name },
        td('Name', h('a', { href: `#/semaphore/${encodeURIComponent(s.name)}` }, s.name)),
        td('Held / capacity', h('div', {}, capacityBar(s.held, s.capacity), h('span', { class: 'mono' }, `${s.held} / ${s.capacity}`))),
        td('Holders', s.holders, 'num'),
        td('Waiters', s.waiters, 'num'),
        td('Oldest wait', oldestWait(s.name, s.waiters, s.oldest_wait_ms, age), 'num'),
        td('Grants/s', sparkline(s.name))));
    out.push(...listTable('semaphores', 'semaphores', rows, body.semaphores.length));
    if (body.next_after) out.push(h('p', { class: 'muted' }, 'Only the first 1000 are shown.'));
    return out;
  }

  function paintQueues(body, age) {
    const out = [h('h1', {}, 'Queues')];
    if (body.queues.length === 0) {
      out.push(h('p', { class: 'muted', id: 'empty' }, 'No queues (or none this token may read).'));
      return out;
    }
    const rows = sortedFiltered('queues', body.queues).map((q) =>
      h('tr', { 'data-name': q.name },
        td('Name', h('a', { href: `#/queue/${encodeURIComponent(q.name)}` }, q.name)),
        td('Pending', q.pending, 'num'),
        td('Claimed', q.claimed, 'num'),
        td('Delayed', q.delayed, 'num'),
        td('Waiting workers', q.claimers, 'num'),
        td('Oldest pending', q.oldest_pending_ms === null ? '—' : duration(q.oldest_pending_ms + age), 'num')));
    out.push(...listTable('queues', 'queues', rows, body.queues.length));
    if (body.next_after) out.push(h('p', { class: 'muted' }, 'Only the first 1000 are shown.'));
    return out;
  }

  function paintQueue(body, age) {
    const { queue, items } = body;
    const out = [
      h('p', {}, h('a', { href: '#/queues' }, '← Queues')),
      h('h1', {}, queue.name),
      h('div', { class: 'grid', id: 'queue-stats' },
        stat('Pending', queue.pending),
        stat('Claimed', queue.claimed),
        stat('Delayed', queue.delayed),
        stat('Waiting workers', queue.claimers),
        stat('Oldest pending', queue.oldest_pending_ms === null ? '—' : duration(queue.oldest_pending_ms + age)),
        stat('Max attempts', queue.max_attempts),
        stat('Dead letters to', queue.dead_letter || '— (kept here)'),
        stat('Max items', queue.max_items)),
      h('h2', {}, `Items${items.next_after ? ` (the first ${items.items.length})` : ` (${items.items.length})`}`),
    ];
    const rows = items.items.map((item) =>
      h('tr', { 'data-item': item.id, 'data-state': item.state },
        td('Id', h('code', {}, item.id)),
        td('Seq', item.seq, 'num'),
        td('State', h('span', { class: item.state === 'claimed' ? 'pill leader' : 'pill' }, item.state)),
        td('Attempt', item.attempt, 'num'),
        td('Claimed by', item.session ? sessionLink(item.session, null) : '—'),
        td('Token', item.token ?? '—', 'num'),
        td('Age', duration(item.age_ms + age), 'num'),
        td('Last error', item.last_error || ''),
        td('Payload', h('code', { class: 'payload' }, preview(item.payload)))));
    out.push(rows.length
      ? h('table', { class: 'responsive', id: 'items' },
        h('thead', {}, h('tr', {}, ['Id', 'Seq', 'State', 'Attempt', 'Claimed by', 'Token', 'Age', 'Last error', 'Payload'].map((c) => h('th', {}, c)))),
        h('tbody', {}, rows))
      : h('p', { class: 'muted', id: 'items' }, 'The queue is empty.'));
    return out;
  }

  // A payload's JSON, cut to a line.
  function preview(payload) {
    const text = JSON.stringify(payload);
    return text.length > 120 ? `${text.slice(0, 119)}…` : text;
  }

  function chart(name) {
    const series = S.series.get(name) || [];
    const width = 600;
    const height = 140;
    const now = Date.now();
    // The last 15 minutes, or the time since the history starts when that is shorter (at least 10 s).
    const first = series.length ? series[0].t : now;
    const span = Math.min(SERIES_SECONDS * 1000, Math.max(10_000, now - first));
    const max = Math.max(1, ...series.map((p) => Math.max(p.held, p.waiting, p.capacity)));
    const x = (t) => (((t - (now - span)) / span) * width).toFixed(1);
    const y = (v) => (height - 4 - (v / max) * (height - 12)).toFixed(1);
    const line = (key, cls) => svg('polyline', { class: cls, points: series.map((p) => `${x(p.t)},${y(p[key])}`).join(' ') });
    return h('div', { class: 'card' },
      h('div', { class: 'legend' }, h('span', { class: 'held' }, '— held'), h('span', { class: 'waiting' }, '— waiting'),
        h('span', { class: 'cap' }, '- - capacity'), h('span', { class: 'muted' }, `scale 0–${max}, last ${duration(span)} to now`)),
      svg('svg', { class: 'chart', id: 'chart', 'data-points': series.length, 'data-first': series.length ? Math.round(series[0].t) : '', viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': 'held and waiting permits over the last minutes' },
        line('capacity', 'cap'), line('held', 'held'), line('waiting', 'waiting')));
  }

  function paintSemaphore(body, age) {
    const admin = can('semaphore', body.name, 'admin');
    const out = [
      h('p', {}, h('a', { href: '#/semaphores' }, '← Semaphores')),
      h('h1', {}, 'Semaphore ', h('code', { id: 'semaphore-name' }, body.name), body.ephemeral ? h('span', { class: 'pill' }, 'ephemeral') : null),
      h('div', { class: 'grid' },
        stat('Capacity', body.capacity, 'capacity'),
        stat('Held', body.held, 'held'),
        stat('Available', body.available, 'available'),
        stat('Waiting', body.waiters.length, 'waiting'),
        stat('Grants/s', sparkline(body.name))),
      policyCard(body),
      h('h2', {}, 'Held and waiting, last 15 minutes'),
      chart(body.name),
      h('h2', {}, `Holders (${body.holders.length})`),
    ];
    const holderRows = body.holders.map((holder) =>
      h('tr', { 'data-session': holder.session },
        td('Session', sessionLink(holder.session, holder.session_name || '(unnamed)', holder.group)),
        td('Id', h('code', { title: holder.session }, short(holder.session))),
        td('Permits', holder.permits, 'num'),
        td('Token', holder.token, 'num'),
        td('Held for', duration((holder.held_ms || 0) + age), 'num'),
        admin ? td('', h('button', { class: 'danger revoke', type: 'button', 'data-session': holder.session, onclick: () => revoke(body.name, holder) }, 'Revoke')) : null));
    out.push(holderRows.length
      ? h('table', { class: 'responsive', id: 'holders' },
        h('thead', {}, h('tr', {}, ['Session', 'Id', 'Permits', 'Token', 'Held for'].concat(admin ? [''] : []).map((c) => h('th', {}, c)))),
        h('tbody', {}, holderRows))
      : h('p', { class: 'muted', id: 'holders' }, 'Nobody holds a permit.'));
    out.push(h('h2', {}, `Queue (${body.waiters.length})`));
    const waits = S.queuedAt.get(body.name) || new Map();
    const seen = S.queuedSeen.get(body.name) || new Set();
    const waiterRows = body.waiters.map((waiter) => {
      const since = waits.get(waiter.session);
      let waited = since === undefined ? '—' : `${seen.has(waiter.session) ? '' : '≥ '}${duration(Date.now() - since)}`;
      if (waiter.waiting_ms !== null && waiter.waiting_ms !== undefined) waited = duration(waiter.waiting_ms + age);
      return h('tr', { 'data-session': waiter.session },
        td('Position', waiter.position, 'num'),
        td('Session', waiter.take ? h('span', { class: 'muted' }, 'take (no session)')
          : sessionLink(waiter.session, waiter.session_name || '(unnamed)', waiter.group)),
        td('Id', h('code', { title: waiter.session }, short(waiter.session))),
        td('Permits', waiter.permits, 'num'),
        td('Waiting', waited, 'num'));
    });
    out.push(waiterRows.length
      ? h('table', { class: 'responsive', id: 'queue' },
        h('thead', {}, h('tr', {}, ['Position', 'Session', 'Id', 'Permits', 'Waiting'].map((c) => h('th', {}, c)))),
        h('tbody', {}, waiterRows))
      : h('p', { class: 'muted', id: 'queue' }, 'Nobody waits.'));
    if (admin) out.push(adminForm(body));
    return out;
  }

  // A semaphore's policies (rate, lock-delay, group cap) and their state; nothing without any.
  function policyCard(body) {
    const delayed = body.delayed || [];
    const groups = body.groups || [];
    if (!body.rate && !body.lock_delay_ms && !body.group_max && !groups.length && !delayed.length) return null;
    const parts = [];
    if (body.rate) {
      const r = body.rate;
      const next = r.available > 0 ? `${r.available} available now` : `next in ${period(r.next_in_ms)}`;
      parts.push(h('div', { id: 'rate' }, h('strong', {}, 'Rate '), `${r.permits} per ${period(r.per_ms)}, burst ${r.burst}: `, next));
    }
    if (body.lock_delay_ms || delayed.length) {
      const out = delayed.map((d) => `${d.permits} back in ${period(d.remaining_ms)}`).join(', ');
      parts.push(h('div', { id: 'lock-delay' }, h('strong', {}, 'Lock-delay '), period(body.lock_delay_ms),
        delayed.length ? h('span', { class: 'bad', id: 'delayed' }, ` (delayed: ${out})`) : ''));
    }
    if (body.group_max || groups.length) {
      const list = groups.map((g) => `${g.group}: ${g.held} held, ${g.waiters} waiting`).join('; ');
      parts.push(h('div', { id: 'groups' }, h('strong', {}, 'Groups '),
        body.group_max ? `at most ${body.group_max} each` : 'no cap', list ? ` (${list})` : ''));
    }
    return h('div', { class: 'card', id: 'policy' }, ...parts);
  }

  // The admin form outlives repaints (a repaint every second would lose what is being typed).
  let capacityForm = null;
  function adminForm(body) {
    if (!capacityForm || capacityForm.dataset.name !== body.name) {
      const input = h('input', { id: 'capacity-input', type: 'number', min: 1, max: 1000000, required: true, value: body.capacity });
      const message = h('span', { id: 'admin-message', class: 'muted' });
      capacityForm = h('form', { class: 'card inline', id: 'admin', 'data-name': body.name },
        h('strong', {}, 'Admin'),
        h('label', {}, 'Capacity ', input),
        h('button', { type: 'submit', id: 'set-capacity' }, 'Set capacity'),
        message);
      capacityForm.addEventListener('submit', async (event) => {
        event.preventDefault();
        try {
          await api('PUT', `/v1/semaphores/${encodeURIComponent(body.name)}`, { capacity: Number(input.value) });
          message.className = 'ok';
          message.textContent = `capacity set to ${input.value}`;
        } catch (error) {
          message.className = 'error';
          message.textContent = error.message;
        }
        refreshSoon();
      });
    }
    return capacityForm;
  }

  async function revoke(name, holder) {
    const who = holder.session_name || holder.session;
    if (!window.confirm(`Revoke the hold of ${who} (token ${holder.token}) on ${name}?`)) return;
    try {
      await api('POST', `/v1/semaphores/${encodeURIComponent(name)}/revoke`, { session: holder.session });
    } catch (error) {
      showError(error);
    }
    refreshSoon();
  }

  function paintElections(body) {
    const out = [h('h1', {}, 'Elections')];
    if (body.elections.length === 0) {
      out.push(h('p', { class: 'muted', id: 'empty' }, 'No elections (or none this token may read).'));
      return out;
    }
    const age = Date.now() - S.data.at;
    const rows = sortedFiltered('elections', body.elections).map((e) => {
      // Tenure in leader time, counted on from the read; "since" by this browser's clock.
      const tenure = e.leader ? (e.leader.held_ms || 0) + age : null;
      return h('tr', { 'data-name': e.name },
        td('Name', e.name),
        td('Leader', e.leader ? sessionLink(e.leader.session, e.leader.session_name) : h('span', { class: 'bad' }, 'none')),
        td('Value', e.leader ? h('code', {}, e.leader.value) : '—'),
        td('Token', e.leader ? e.leader.token : '—', 'num'),
        td('Tenure', e.leader
          ? h('span', { title: `leads since ${new Date(Date.now() - tenure).toLocaleString()}` }, duration(tenure),
            h('span', { class: 'muted' }, ` since ${new Date(Date.now() - tenure).toLocaleTimeString()}`))
          : '—', 'num'),
        td('Candidates', e.candidates, 'num'));
    });
    out.push(...listTable('elections', 'elections', rows, body.elections.length));
    return out;
  }

  function paintSessions(body, age) {
    const out = [h('h1', {}, 'Sessions')];
    if (body.sessions.length === 0) {
      out.push(h('p', { class: 'muted', id: 'empty' }, 'No sessions (or none this token may read).'));
      return out;
    }
    const rows = sortedFiltered('sessions', body.sessions).map((s) =>
      h('tr', { 'data-session': s.id },
        td('Name', sessionLink(s.id, s.name || '(unnamed)')),
        td('Id', h('code', { title: s.id }, short(s.id))),
        td('TTL', duration(s.ttl_ms), 'num'),
        td('Remaining', s.remaining_ms === null || s.remaining_ms === undefined ? '—' : duration(s.remaining_ms - age), 'num'),
        td('Holds', s.holds ? h('a', { href: `#/session/${s.id}` }, s.holds) : s.holds, 'num'),
        td('Waits', s.waits, 'num')));
    out.push(...listTable('sessions', 'sessions', rows, body.sessions.length));
    out.push(h('p', { class: 'muted' }, 'Remaining counts down from the last read; keepalives are not events, so it is re-read on the next change.'));
    return out;
  }

  // One session: its holds and waits, each linked to its semaphore (or election).
  function paintSession(body) {
    const objectLink = (item) => item.kind === 'semaphore'
      ? h('a', { href: `#/semaphore/${encodeURIComponent(item.name)}`, class: 'object-link' }, item.name)
      : h('a', { href: `#/elections/${encodeURIComponent(item.name)}`, class: 'object-link' }, item.name);
    const out = [
      h('p', {}, h('a', { href: '#/sessions' }, '← Sessions')),
      h('h1', {}, 'Session ', h('code', { id: 'session-name' }, body.name || '(unnamed)'), ' ', h('code', { class: 'muted' }, body.id)),
      h('div', { class: 'grid' }, stat('TTL', duration(body.ttl_ms)), stat('Holds', body.holds.length), stat('Waits', body.waits.length)),
      h('h2', {}, `Holds (${body.holds.length})`),
    ];
    out.push(body.holds.length
      ? h('table', { class: 'responsive', id: 'session-holds' },
        h('thead', {}, h('tr', {}, ['Name', 'Kind', 'Permits', 'Token'].map((c) => h('th', {}, c)))),
        h('tbody', {}, body.holds.map((hold) => h('tr', { 'data-name': hold.name },
          td('Name', objectLink(hold)), td('Kind', hold.kind), td('Permits', hold.permits, 'num'), td('Token', hold.token, 'num')))))
      : h('p', { class: 'muted', id: 'session-holds' }, 'No holds.'));
    out.push(h('h2', {}, `Waits (${body.waits.length})`));
    out.push(body.waits.length
      ? h('table', { class: 'responsive', id: 'session-waits' },
        h('thead', {}, h('tr', {}, ['Name', 'Kind', 'Permits', 'Position'].map((c) => h('th', {}, c)))),
        h('tbody', {}, body.waits.map((wait) => h('tr', { 'data-name': wait.name },
          td('Name', objectLink(wait)), td('Kind', wait.kind), td('Permits', wait.permits, 'num'), td('Position', wait.position, 'num')))))
      : h('p', { class: 'muted', id: 'session-waits' }, 'No waits.'));
    return out;
  }

  // ---- navigation, login ----

  function navigate() {
    const route = routeOf(location.hash);
    S.route = route;
    S.data = null;
    for (const link of document.querySelectorAll('nav a')) {
      const active = link.dataset.view === route.view
        || (route.view === 'semaphore' && link.dataset.view === 'semaphores')
        || (route.view === 'queue' && link.dataset.view === 'queues')
        || (route.view === 'session' && link.dataset.view === 'sessions');
      link.classList.toggle('active', active);
    }
    const toolbar = FILTERED[route.view] ? filterBox(route.view, route.filter) : null;
    $('view').replaceChildren(...[toolbar, h('div', { id: 'content' }, h('p', { class: 'muted' }, 'Loading…'))].filter(Boolean));
    refresh();
  }

  function showLogin(message) {
    $('login').hidden = false;
    $('view').hidden = true;
    $('logout').hidden = true;
    const error = $('login-error');
    error.hidden = !message;
    error.textContent = message || '';
    $('token').focus();
  }

  async function start() {
    if (S.auth) {
      if (!S.token) {
        showLogin();
        return;
      }
      try {
        const self = await api('GET', '/v1/acl/tokens/self');
        S.rules = self.rules;
        S.root = /^0+$/.test(self.id || '');
        S.whoami = self.name;
      } catch (error) {
        sessionStorage.removeItem(TOKEN_KEY);
        S.token = null;
        showLogin(error.status === 401 ? 'That token is unknown (or was deleted).' : error.message);
        return;
      }
      $('logout').hidden = false;
      $('whoami').textContent = `token: ${S.whoami}`;
    }
    $('login').hidden = true;
    $('view').hidden = false;
    navigate();
    stream();
  }

  async function main() {
    const config = await (await fetch('/ui/config.json', { cache: 'no-store' })).json();
    S.auth = !!config.auth;
    S.node.id = config.node_id;
    S.node.addr = config.addr || location.host;
    paintNode();
    // The header's role (and the node's) is re-read every 2 s: Raft roles are not events.
    readNode();
    setInterval(readNode, 2000);
    window.addEventListener('hashchange', navigate);
    $('login').addEventListener('submit', (event) => {
      event.preventDefault();
      S.token = $('token').value.trim();
      $('token').value = '';
      sessionStorage.setItem(TOKEN_KEY, S.token);
      start();
    });
    $('logout').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      S.token = null;
      S.rules = null;
      if (S.stream) S.stream.abort();
      if (S.pollTimer) clearInterval(S.pollTimer);
      S.pollTimer = null;
      $('whoami').textContent = '';
      // Nothing read with the old token stays on the page.
      S.route = null;
      S.data = null;
      for (const map of [S.grants, S.queuedAt, S.queuedSeen, S.series, S.last, S.histories]) map.clear();
      S.historyQueue = [];
      S.generation += 1;
      capacityForm = null;
      $('view').replaceChildren();
      setMode('connecting');
      showLogin();
    });
    // Once a second: sample the charts and repaint the ages from what was last read (no fetch).
    setInterval(() => {
      sample();
      paint();
    }, 1000);
    // Raft membership and health are not events: the cluster view re-reads them every 2 s.
    setInterval(() => {
      if (S.route && S.route.view === 'cluster' && !$('view').hidden) refreshSoon();
    }, 2000);
    await start();
  }

  main().catch((error) => showError(error));
})();
