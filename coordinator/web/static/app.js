// heft dashboard: renders the fleet from GET /api/v1/workers and keeps it
// live through the /api/v1/events stream (a whole "workers" event first,
// then "changes"). Plain JavaScript, no build step, no external assets, no
// inline script or style (the coordinator's Content-Security-Policy forbids
// them). Every text from the fleet goes through esc(): HTML-escaped, with
// control and bidi characters shown as visible \u{...} escapes.
'use strict';

const SEVERITY = { critical: 0, warning: 1, info: 2 };
const STATES = ['pending', 'measuring', 'admitted', 'stale', 'held', 'offline'];

const ui = {
  workers: [],
  received: null, // when the last update arrived
  filters: { model: '', state: '', warning: '', q: '' },
  collapsed: new Set(JSON.parse(localStorage.getItem('heft-collapsed') || '[]')),
  results: new Map(), // worker id -> {text, error}: what the last admin action did
  adminToken: sessionStorage.getItem('heft-admin-token') || '',
  viewerToken: new URLSearchParams(location.search).get('token') || sessionStorage.getItem('heft-viewer-token') || '',
  source: null,
  lostAt: null, // when the live stream broke
  pending: [], // nodes awaiting approval, from GET /api/v1/nodes?state=pending
};

const $ = (sel, root = document) => root.querySelector(sel);

// INVISIBLE matches what must be seen, never obeyed: C0 and C1 controls,
// bidi embeddings, overrides, isolates and marks (which can make one name
// display as another), zero-width characters and the BOM.
const INVISIBLE = /[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;

function visible(s) {
  return String(s ?? '').replace(INVISIBLE, c => '\\u{' + c.codePointAt(0).toString(16).padStart(4, '0') + '}');
}

function esc(s) {
  return visible(s).replace(/[&<>"']/g, c => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}

// clipText shortens a text for places CSS cannot clip (a select's options).
function clipText(s, n) {
  s = String(s ?? '');
  return s.length > n ? s.slice(0, n - 1) + '…' : s;
}

function num(n, digits = 0) {
  if (n === null || n === undefined || !isFinite(n)) return '—';
  return Number(n).toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function plural(n, word) { return `${num(n)} ${word}${n === 1 ? '' : 's'}`; }

function gib(bytes) { return (bytes / 2 ** 30).toFixed(1); }

function ago(iso) {
  if (!iso) return 'never';
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.round(s)}s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} days ago`;
}

function when(iso) { return iso ? new Date(iso).toLocaleString() : ''; }

function slug(s) { return String(s).replace(/[^a-zA-Z0-9_-]+/g, '-'); }

// ---------- data ----------

function authHeaders(admin) {
  const h = {};
  const token = admin ? ui.adminToken : ui.viewerToken;
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

async function loadOnce() {
  const resp = await fetch('api/v1/workers', { headers: authHeaders(false) });
  if (resp.status === 401) {
    showViewerPrompt();
    return false;
  }
  if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
  update((await resp.json()).workers || []);
  return true;
}

function connect() {
  if (ui.source) ui.source.close();
  const q = ui.viewerToken ? '?token=' + encodeURIComponent(ui.viewerToken) : '';
  const es = new EventSource('api/v1/events' + q);
  ui.source = es;
  es.addEventListener('workers', ev => {
    setLive(true);
    try {
      update(JSON.parse(ev.data).workers || []);
    } catch (e) {
      console.error('bad update', e);
    }
  });
  es.addEventListener('changes', ev => {
    setLive(true);
    try {
      const c = JSON.parse(ev.data);
      const byId = new Map(ui.workers.map(w => [w.id, w]));
      for (const w of c.workers || []) byId.set(w.id, w);
      for (const id of c.removed || []) byId.delete(id);
      update([...byId.values()].sort(byPlace));
    } catch (e) {
      console.error('bad update', e);
    }
  });
  es.onopen = () => setLive(true);
  es.onerror = () => {
    setLive(false);
    // The browser retries by itself; if the stream was refused outright, poll.
    if (es.readyState === EventSource.CLOSED) setTimeout(connect, 3000);
  };
}

function setLive(ok) {
  const el = $('#live');
  if (ok) ui.lostAt = null;
  else if (!ui.lostAt) ui.lostAt = new Date();
  el.className = 'live ' + (ok ? 'ok' : 'lost');
  el.dataset.live = ok ? 'connected' : 'lost';
  el.textContent = ok
    ? `live${ui.received ? ' · updated ' + ui.received.toLocaleTimeString() : ''}`
    : ui.received
      ? `connection lost at ${ui.lostAt.toLocaleTimeString()} — reconnecting; showing data from ${ui.received.toLocaleTimeString()}`
      : 'connecting…';
}

// byPlace orders workers as the coordinator does: model, node, URL, id.
function byPlace(a, b) {
  return cmp(a.model, b.model) || cmp(a.node, b.node) || cmp(a.url, b.url) || cmp(a.id, b.id);
}

function cmp(a, b) { return a < b ? -1 : a > b ? 1 : 0; }

function update(workers) {
  ui.workers = workers;
  ui.received = new Date();
  if ($('#live').dataset.live === 'connected') setLive(true);
  render();
}

// ---------- rendering ----------

function render() {
  renderFilters();
  renderSummary();
  renderPending();
  renderWarnings();
  renderModels();
}

// ---------- nodes awaiting approval ----------

async function loadPending() {
  try {
    // The node list takes the viewer or the admin token even where other
    // reads are open: with the admin's, once entered, the list shows.
    const resp = await fetch('api/v1/nodes?state=pending', { headers: authHeaders(!!ui.adminToken) });
    if (!resp.ok) return;
    ui.pending = (await resp.json()).nodes || [];
    renderPending();
  } catch (e) {
    // The stream's status already says when the coordinator is away.
  }
}

function renderPending() {
  const el = $('#pending');
  el.classList.toggle('hidden', ui.pending.length === 0);
  const body = ui.pending.map(n => `<li data-pending-node="${esc(n.name)}">
      <span class="clip" title="${esc(n.name)}"><strong>${esc(n.name)}</strong></span>
      <span class="meta">host ${esc(n.hostname || '?')} · from ${esc(n.address || '?')} · agent ${esc(n.agent_version || '?')} · first seen ${esc(ago(n.since))}</span>
      <span class="actions"><button data-node-action="approve" data-node="${esc(n.name)}">Approve</button>
      <button data-node-action="reject" data-node="${esc(n.name)}">Reject</button></span></li>`).join('');
  const list = $('#pending ul');
  if (list.dataset.html !== body) {
    list.innerHTML = body;
    list.dataset.html = body;
  }
  $('#pending-count').textContent = `${ui.pending.length}`;
}

async function nodeAct(action, name) {
  try {
    const resp = await fetch(`api/v1/nodes/${encodeURIComponent(name)}/${action}`, { method: 'POST', headers: authHeaders(true) });
    const data = await resp.json().catch(() => ({}));
    if (!resp.ok) return toast(`${action} ${visible(name)} failed: ${resp.status === 401 ? 'admin token rejected' : (data.error || 'HTTP ' + resp.status)}`, true);
    toast(`node ${visible(name)} ${action === 'approve' ? 'approved: its agent is admitted at its next connection' : 'rejected'}`);
    loadPending();
  } catch (e) {
    toast(`${action} failed: ${e.message}`, true);
  }
}

// bulkApprove approves every pending node a selector names, in one call
// (POST api/v1/nodes/approve): {name: pattern}, {address: range}, both,
// or {all: true}.
async function bulkApprove(selector) {
  try {
    const resp = await fetch('api/v1/nodes/approve', { method: 'POST', headers: { ...authHeaders(true), 'Content-Type': 'application/json' },
      body: JSON.stringify(selector) });
    const data = await resp.json().catch(() => ({}));
    if (!resp.ok) return toast(`approve failed: ${resp.status === 401 ? 'admin token rejected' : (data.error || 'HTTP ' + resp.status)}`, true);
    const n = (data.approved || []).length;
    const failed = (data.failed || []).map(f => `${visible(f.node)}: ${f.error}`).join('; ');
    toast(`${n} node${n === 1 ? '' : 's'} approved${failed ? '; not approved: ' + failed : ''}`, !!failed || n === 0);
    loadPending();
  } catch (e) {
    toast(`approve failed: ${e.message}`, true);
  }
}

function matches(w) {
  const f = ui.filters;
  if (f.model && w.model !== f.model) return false;
  if (f.state && w.state !== f.state) return false;
  if (f.warning && !(w.warnings || []).some(x => x.code === f.warning)) return false;
  if (f.q) {
    const hay = `${w.node} ${w.url} ${w.engine} ${w.id}`.toLowerCase();
    if (!hay.includes(f.q.toLowerCase())) return false;
  }
  return true;
}

function renderFilters() {
  const models = [...new Set(ui.workers.map(w => w.model))].sort();
  const codes = [...new Set(ui.workers.flatMap(w => (w.warnings || []).map(x => x.code)))].sort();
  fillSelect($('#f-model'), models, 'all models', ui.filters.model);
  fillSelect($('#f-state'), STATES, 'all states', ui.filters.state);
  fillSelect($('#f-warning'), codes, 'any warning', ui.filters.warning);
}

function fillSelect(sel, values, allLabel, current) {
  const html = `<option value="">${esc(allLabel)}</option>` +
    values.map(v => `<option value="${esc(v)}"${v === current ? ' selected' : ''}>${esc(clipText(v, 80))}</option>`).join('');
  if (sel.dataset.html !== html) {
    sel.innerHTML = html;
    sel.dataset.html = html;
  }
}

function renderSummary() {
  const counts = {};
  for (const w of ui.workers) counts[w.state] = (counts[w.state] || 0) + 1;
  const models = new Set(ui.workers.map(w => w.model)).size;
  const parts = [`<span class="chip" id="count-workers" data-count="${ui.workers.length}">${plural(ui.workers.length, 'worker')}</span>`,
    `<span class="chip">${plural(models, 'model')}</span>`];
  for (const s of STATES) if (counts[s]) parts.push(`<span class="chip" data-state-count="${s}">${counts[s]} ${s}</span>`);
  $('#summary').innerHTML = parts.join('');
}

function renderWarnings() {
  const items = [];
  for (const w of ui.workers) {
    if (!matches(w)) continue;
    for (const x of w.warnings || []) if (!ui.filters.warning || x.code === ui.filters.warning) items.push({ w, x });
  }
  items.sort((a, b) => (SEVERITY[a.x.severity] ?? 3) - (SEVERITY[b.x.severity] ?? 3) ||
    new Date(a.x.since) - new Date(b.x.since) || a.w.node.localeCompare(b.w.node));
  $('#warnings-count').textContent = items.length ? `${items.length}` : 'none';
  const body = items.length === 0
    ? '<div class="empty">No warnings. Every worker looks healthy.</div>'
    : '<ul>' + items.map(({ w, x }) => `
      <li class="warning" data-warning-code="${esc(x.code)}" data-worker-id="${esc(w.id)}" data-severity="${esc(x.severity)}">
        <span class="sev ${esc(x.severity)}">${esc(x.severity)}</span>
        <span><strong>${esc(x.code)}</strong> — <span class="msg">${esc(x.message)}</span><br>
          <span class="where"><a class="clip" href="#worker-${esc(w.id)}" title="${esc(w.node)} · ${esc(w.model)}">${esc(w.node)} · ${esc(w.engine)} · ${esc(w.model)}</a> · since ${esc(ago(x.since))} (${esc(when(x.since))})</span></span>
      </li>`).join('') + '</ul>';
  const el = $('#warnings .body');
  if (el.dataset.html !== body) {
    el.innerHTML = body;
    el.dataset.html = body;
  }
}

function renderModels() {
  const root = $('#models');
  const byModel = new Map();
  for (const w of ui.workers) {
    if (!matches(w)) continue;
    if (!byModel.has(w.model)) byModel.set(w.model, []);
    byModel.get(w.model).push(w);
  }
  const wanted = new Set();
  const models = [...byModel.keys()].sort();
  const sections = new Map([...root.children].map(s => [s.dataset.model, s]));
  for (const model of models) {
    wanted.add(model);
    let sec = sections.get(model);
    if (!sec) {
      sec = document.createElement('section');
      sec.id = 'model-' + slug(model);
      sec.className = 'panel model';
      sec.dataset.model = model;
      sec.innerHTML = `<h2 role="button" tabindex="0"><span class="name clip" title="${esc(model)}">${esc(model)}</span><span class="count"></span></h2><div class="body"><div class="deployments"></div><div class="workers"></div></div>`;
      clickable(sec.querySelector('h2'), () => toggle(model, sec));
    }
    if (root.children[wanted.size - 1] !== sec) root.insertBefore(sec, root.children[wanted.size - 1] || null); // model order
    setCollapsed(sec, ui.collapsed.has(model));
    const list = byModel.get(model);
    const admitted = list.filter(w => w.state === 'admitted').length;
    const stale = list.filter(w => w.state === 'stale').length; // agent gone, still routed at its last weight
    sec.querySelector('.count').textContent = `${plural(list.length, 'worker')}, ${admitted} admitted` + (stale ? `, ${stale} stale` : '');
    const maxWeight = Math.max(1, ...list.map(w => w.weight ?? 0));
    renderDeployments(sec.querySelector(':scope > .body > .deployments'), list.filter(w => w.deployment), maxWeight);
    renderWorkers(sec.querySelector(':scope > .body > .workers'), list.filter(w => !w.deployment), maxWeight);
  }
  for (const sec of [...root.children]) if (!wanted.has(sec.dataset.model)) sec.remove();
  $('#no-workers').classList.toggle('hidden', ui.workers.length !== 0);
}

function toggle(model, sec) {
  if (ui.collapsed.has(model)) ui.collapsed.delete(model); else ui.collapsed.add(model);
  localStorage.setItem('heft-collapsed', JSON.stringify([...ui.collapsed]));
  setCollapsed(sec, ui.collapsed.has(model));
}

function setCollapsed(sec, collapsed) {
  sec.classList.toggle('collapsed', collapsed);
  sec.querySelector('h2').setAttribute('aria-expanded', String(!collapsed));
}

// clickable makes a heading act as a button for the mouse and the keyboard.
function clickable(el, fn) {
  el.addEventListener('click', fn);
  el.addEventListener('keydown', ev => {
    if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); fn(); }
  });
}

// renderDeployments shows each multi-node data-parallel deployment as one
// group: a heading for the whole deployment (its address, ranks and
// nodes), then each node's worker by first rank, its card saying which
// ranks run there.
function renderDeployments(container, list, maxWeight) {
  const byAddr = new Map();
  for (const w of list) {
    if (!byAddr.has(w.deployment.address)) byAddr.set(w.deployment.address, []);
    byAddr.get(w.deployment.address).push(w);
  }
  const groups = new Map([...container.children].map(g => [g.dataset.deployment, g]));
  const addrs = [...byAddr.keys()].sort();
  addrs.forEach((addr, i) => {
    const members = byAddr.get(addr).sort((a, b) => a.deployment.start_rank - b.deployment.start_rank || cmp(a.node, b.node));
    let group = groups.get(addr);
    if (!group) {
      group = document.createElement('div');
      group.className = 'deployment';
      group.dataset.deployment = addr;
      group.innerHTML = '<h3 class="clip"></h3><div class="workers"></div>';
    }
    if (container.children[i] !== group) container.insertBefore(group, container.children[i] || null);
    const d = members[0].deployment;
    const nodes = [...new Set(members.flatMap(w => w.deployment.nodes))];
    const h = group.querySelector('h3');
    h.textContent = `data-parallel deployment${d.size ? ` of ${plural(d.size, 'rank')}` : ''} across ${plural(nodes.length, 'node')}: ${nodes.join(', ')} · ${addr}`;
    h.title = 'one engine whose data-parallel ranks run on several nodes; heft judges its ranks as one set (imbalance, hold, completeness)';
    group.dataset.nodes = nodes.join(',');
    renderWorkers(group.querySelector('.workers'), members, maxWeight);
  });
  for (const g of [...container.children]) if (!byAddr.has(g.dataset.deployment)) g.remove();
}

// span says which of a deployment's ranks run on the worker's node.
function span(w) {
  const d = w.deployment;
  if (!d) return '';
  const ranks = d.local_ranks > 1 ? `DP ${d.start_rank}–${d.start_rank + d.local_ranks - 1}` : d.local_ranks === 1 ? `DP ${d.start_rank}` : `from DP ${d.start_rank}`;
  return `<div class="row"><span class="label">Deployment</span><span class="val" data-deployment-span="${d.start_rank}:${d.local_ranks}">${ranks}${d.size ? ` of ${d.size}` : ''} on this node</span></div>`;
}

// renderWorkers replaces only the cards whose content changed. A replaced
// card keeps the weight an admin was typing and the focus.
function renderWorkers(container, list, maxWeight) {
  const keep = new Set();
  const cards = new Map([...container.children].map(c => [c.dataset.workerId, c]));
  list.forEach((w, i) => {
    const html = workerCard(w, maxWeight);
    keep.add(w.id);
    let card = cards.get(w.id);
    if (!card || card.dataset.html !== html) {
      const tmp = document.createElement('template');
      tmp.innerHTML = html;
      const fresh = tmp.content.firstElementChild;
      fresh.dataset.html = html;
      sizeBars(fresh);
      if (card) swapCard(card, fresh); else container.appendChild(fresh);
      card = fresh;
    }
    // Move a card only when it is out of place: moving blurs an input.
    if (container.children[i] !== card) container.insertBefore(card, container.children[i] || null);
  });
  for (const card of [...container.children]) if (!keep.has(card.dataset.workerId)) card.remove();
}

// sizeBars sets the widths of bars from their data-w (per cent): through
// the CSSOM, which the Content-Security-Policy allows, where a style=""
// attribute in markup is refused.
function sizeBars(root) {
  for (const el of root.querySelectorAll('[data-w]')) el.style.width = el.dataset.w + '%';
}

function swapCard(old, fresh) {
  const input = old.querySelector('[data-pin-input]');
  const freshInput = fresh.querySelector('[data-pin-input]');
  if (input && freshInput) freshInput.value = input.value;
  const focused = old.contains(document.activeElement) ? document.activeElement : null;
  old.replaceWith(fresh);
  if (!focused) return;
  let twin = null;
  if (focused.dataset.pinInput !== undefined) twin = freshInput;
  else if (focused.dataset.action) twin = fresh.querySelector(`button[data-action="${focused.dataset.action}"]`);
  (twin || fresh).focus({ preventScroll: true });
}

function gpuSummary(gpus) {
  if (!gpus || gpus.length === 0) return 'no GPUs reported';
  const counts = new Map();
  for (const g of gpus) counts.set(g.name || 'GPU', (counts.get(g.name || 'GPU') || 0) + 1);
  return [...counts].map(([n, c]) => `${n} × ${c}`).join(', ');
}

function workerCard(w, maxWeight) {
  const weight = w.weight;
  const pinned = w.pinned_weight !== null && w.pinned_weight !== undefined;
  const m = w.measurement;
  const cold = w.throughput_tps && w.warmup_tps ? w.throughput_tps / w.warmup_tps : null;
  const res = ui.results.get(w.id);
  return `<article class="worker state-${esc(w.state)}" id="worker-${esc(w.id)}" data-worker-id="${esc(w.id)}" data-state="${esc(w.state)}">
  <div class="top"><span class="node clip" title="${esc(w.node)}">${esc(w.node)}</span><span class="state ${esc(w.state)}">${esc(w.state)}</span></div>
  <div class="meta clip" title="${esc(w.url)}">${esc(w.engine)}${w.engine_version ? ' ' + esc(w.engine_version) : ''} · ${esc(w.url)} · ${esc(gpuSummary(w.gpus))}</div>
  <div class="row"><span class="label">Throughput</span><span class="val num" data-throughput="${w.throughput_tps ?? ''}">
    ${w.throughput_tps != null ? `<strong>${num(w.throughput_tps)}</strong> tok/s` : (m ? 'no valid measurement' : 'not measured yet')}
    ${w.measured_at ? `<span class="meta" title="${esc(when(w.measured_at))}${m ? ` · ${m.requests}×${m.tokens_per_request} tokens, ${num(m.wall_seconds, 2)} s${m.trigger ? ` · ${esc(m.trigger)}` : ''}${m.cause ? ` (${esc(m.cause)})` : ''}` : ''}"> · measured ${esc(ago(w.measured_at))}</span>` : ''}${probeChip(w.probe_status)}</span></div>
  <div class="row"><span class="label">Warm-up</span><span class="val num" data-warmup="${w.warmup_tps ?? ''}">
    ${w.warmup_tps != null ? `${num(w.warmup_tps)} tok/s${cold && cold > 1.05 ? ` <span class="chip" title="measured / warm-up">cold ×${num(cold, 1)}</span>` : ''}` : '—'}</span></div>
  <div class="row"><span class="label">Weight</span><div class="val">
    <div class="weightbar${pinned ? ' pinned' : ''}" title="${pinned ? 'pinned by an admin' : 'throughput / model median'}"><span data-w="${weight != null ? Math.min(100, 100 * weight / maxWeight).toFixed(1) : 0}"></span></div></div>
    <span class="num weight" data-weight="${weight ?? ''}" data-pinned="${pinned}">${weight != null ? num(weight, 2) : `<span class="meta">${esc(noWeight(w))}</span>`}${pinned ? ` <span class="chip pin" title="pinned by an admin; computed ${num(w.computed_weight, 2)}">pinned</span>` : ''}${w.weight_source === 'rescaled' ? ` <span class="chip" data-source="rescaled" title="its pace is ${num(w.pace_factor, 2)}× slower than when measured: the measurement over ${num(w.pace_factor, 2)} counts ${w.pace_tentative ? 'on one reading, until the next confirms or ends it' : 'until it is measured again'}">rescaled</span>` : ''}${w.weight_source === 'gpu_clock' ? ` <span class="chip" data-source="gpu_clock" title="its GPUs report a slowdown and clock ${num(w.clock_factor, 2)}× lower than when measured: the measurement over ${num(w.clock_factor, 2)} counts until its pace says how much slower it runs">throttled</span>` : ''}</span></div>
  ${span(w)}
  ${prefill(w)}
  ${context(w)}
  ${history(w.history)}
  ${pools(w)}
  ${gpus(w.gpus)}
  ${(w.warnings || []).length ? `<div class="wwarn">${w.warnings.map(x => `<div data-worker-warning="${esc(x.code)}" title="${esc(x.message)}"><span class="sev ${esc(x.severity)}">${esc(x.severity)}</span> ${esc(x.code)}</div>`).join('')}</div>` : ''}
  <div class="actions">
    <button data-action="probe" data-id="${esc(w.id)}">Re-measure</button>
    <input type="number" min="0.01" step="0.05" placeholder="weight" data-pin-input="${esc(w.id)}" aria-label="pinned weight">
    <button data-action="pin" data-id="${esc(w.id)}">Pin</button>
    ${pinned ? `<button data-action="unpin" data-id="${esc(w.id)}">Unpin</button>` : ''}
    ${w.state !== 'admitted' && w.state !== 'stale' ? `<button data-action="admit" data-id="${esc(w.id)}">Admit</button>` : ''}
    ${w.state !== 'held' ? `<button data-action="hold" data-id="${esc(w.id)}">Hold</button>` : ''}
    <span class="result${res && res.error ? ' error' : ''}" data-result="${esc(w.id)}">${res ? esc(res.text) : ''}</span>
  </div>
</article>`;
}

function probeChip(status) {
  const text = { running: 'probe running', draining: 'drained at the gateways while measured', deferred_busy: 'probe waits: engine busy', failed: 'last probe failed' }[status];
  return text ? ` <span class="chip probe ${esc(status)}" data-probe-status="${esc(status)}">${text}</span>` : '';
}

// noWeight says why a worker is not in the weight table.
function noWeight(w) {
  switch (w.state) {
    case 'held': return 'held out';
    case 'offline': return 'offline';
    case 'measuring': case 'pending': return 'not yet';
    default: return '—';
  }
}

// prefill shows how fast the worker reads prompts and the prefill weight
// gateways that route long prompts apart use.
function prefill(w) {
  const p = w.measurement && w.measurement.prefill;
  const pinned = w.pinned_prefill_weight !== null && w.pinned_prefill_weight !== undefined;
  let text;
  if (w.prefill_tps != null) {
    text = `<strong>${num(w.prefill_tps)}</strong> prompt tok/s · weight <span class="num weight" data-prefill-weight="${w.prefill_weight ?? ''}" data-prefill-pinned="${pinned}">${w.prefill_weight != null ? num(w.prefill_weight, 2) : esc(noWeight(w))}</span>` +
      (pinned ? ` <span class="chip pin" title="pinned by an admin; computed ${num(w.computed_prefill_weight, 2)}">pinned</span>` : '') +
      (p ? `<span class="meta" title="${p.requests} prompts of ${num(p.prompt_length)} tokens, ${num(p.wall_seconds, 2)} s"> · ${p.requests}×${num(p.prompt_length)} tokens</span>` : '');
  } else if (p && p.failure) {
    text = `<span class="meta" title="${esc((p.problems || [])[0] || '')}">not measured: ${esc(p.failure)}</span>`;
  } else {
    text = `<span class="meta">${w.measurement ? 'no prefill burst in the last probe' : 'not measured yet'}</span>`;
  }
  return `<div class="row"><span class="label">Prefill</span><span class="val num" data-prefill-tps="${w.prefill_tps ?? ''}">${text}</span></div>`;
}

// context shows the longest sequence the worker really holds: its maximum
// model length, or its smallest pool where that is smaller.
function context(w) {
  const ctx = w.max_context_tokens, len = w.max_model_len;
  let text = '<span class="meta">unknown</span>';
  if (ctx != null) {
    text = `<strong>${num(ctx)}</strong> tokens`;
    if (len != null && len > ctx) text += ` <span class="meta">(max model length ${num(len)}; the smallest pool holds less)</span>`;
  }
  return `<div class="row"><span class="label">Context</span><span class="val num" data-max-context="${ctx ?? ''}">${text}</span></div>`;
}

function history(points) {
  const pts = (points || []).filter(p => p.valid && p.throughput_tps > 0);
  if (pts.length < 2) return '';
  const w = 300, h = 28, pad = 3;
  const ys = pts.map(p => p.throughput_tps);
  const lo = Math.min(...ys), hi = Math.max(...ys), span = hi - lo || 1;
  const xy = pts.map((p, i) => [pad + (w - 2 * pad) * i / (pts.length - 1), h - pad - (h - 2 * pad) * (p.throughput_tps - lo) / span]);
  const last = xy[xy.length - 1];
  return `<div class="row"><span class="label">History</span><span class="val history"><svg class="spark" viewBox="0 0 ${w} ${h}" preserveAspectRatio="none" data-history="${pts.length}" role="img" aria-label="last ${pts.length} measurements, ${num(lo)} to ${num(hi)} tok/s">
    <title>last ${pts.length} measurements: ${num(lo)}–${num(hi)} tok/s</title>
    <polyline points="${xy.map(p => p.map(v => v.toFixed(1)).join(',')).join(' ')}"/><circle cx="${last[0].toFixed(1)}" cy="${last[1].toFixed(1)}" r="2.5"/></svg><span class="range num">${num(lo)}–${num(hi)}</span></span></div>`;
}

// pools shows each rank's KV pool, and a rank the engine runs without a
// pool as such: an incomplete set gets no min/max and is never shown as
// balanced.
function pools(w) {
  const ranks = w.ranks || [];
  const missing = w.missing_ranks || [];
  if (ranks.length === 0 && missing.length === 0) return logSource(w);
  const max = Math.max(...ranks.map(r => r.kv_tokens), 1);
  const ratio = w.pool_min_over_max;
  const incomplete = w.complete === false;
  const rows = [...ranks.map(r => ({ ...r, missing: false })), ...missing.map(dp => ({ dp_rank: dp, missing: true }))]
    .sort((a, b) => a.dp_rank - b.dp_rank);
  const head = incomplete
    ? `<br><span class="chip incomplete" data-pools-incomplete="${ranks.length}/${w.expected_ranks}" title="min/max is unknown until every rank has printed its pool">${ranks.length} of ${w.expected_ranks} ranks</span>`
    : (ratio != null && ranks.length > 1 ? `<br><span class="num" data-pool-ratio="${ratio}">min/max ${num(ratio, 2)}</span>` : '');
  return `<div class="row"><span class="label">KV pools${head}</span><span class="val pools" data-pools="${ranks.length}" data-pools-complete="${w.complete == null ? 'unknown' : w.complete}">
    ${rows.map(r => r.missing
      ? `<div class="pool missing" data-pool-rank="${r.dp_rank}" data-pool-missing="true" title="this rank has printed no KV pool: still starting, failed, or on another node">
      <span>DP${r.dp_rank}</span><div class="poolbar"></div><span class="num">no pool yet</span></div>`
      : `<div class="pool${r.kv_tokens < 0.5 * max ? ' small' : ''}" data-pool-rank="${r.dp_rank}" data-kv-tokens="${r.kv_tokens}">
      <span>DP${r.dp_rank}</span><div class="poolbar"><span data-w="${(100 * r.kv_tokens / max).toFixed(1)}"></span></div><span class="num">${num(r.kv_tokens)}</span></div>`).join('')}
  </span></div>${logSource(w)}`;
}

// logSource says where the agent reads the engine's start-up log, and
// when it cannot.
function logSource(w) {
  const l = w.log_source;
  if (!l) return '';
  const where = l.resolved && l.resolved !== l.spec ? ` → ${esc(l.resolved)}` : '';
  const how = l.wrapper && l.wrapper !== 'none' ? ` (${esc(l.wrapper)})` : '';
  return `<div class="row"><span class="label">Log</span><span class="val meta" data-log-source="${esc(l.spec)}" data-log-error="${l.error ? 'true' : 'false'}">${esc(l.spec)}${where}${how}${l.error
    ? ` · <span class="sev warning">cannot be read</span> <span title="${esc(l.error)}">${esc(l.error)}</span>` : ` · ${num(l.lines)} lines`}</span></div>`;
}

function gpus(list) {
  if (!list || list.length === 0) return '';
  return `<div class="row"><span class="label">GPUs</span><span class="val gpus">${list.map(g => {
    const foreign = (g.processes || []).filter(p => p.foreign);
    const reasons = (g.clock_event_reasons || []).filter(r => r !== 'gpu_idle');
    return `<div data-gpu="${esc(g.uuid)}">GPU${g.index} ${esc(g.name)} · SM ${num(g.sm_clock_mhz)}/${num(g.sm_clock_max_mhz)} MHz · ${gib(g.memory_free_bytes)}/${gib(g.memory_total_bytes)} GiB free${reasons.length ? ` · <span class="sev warning">${esc(reasons.join(', '))}</span>` : ''}${foreign.length ? `<br><span class="foreign">foreign: ${foreign.map(p => `pid ${p.pid}${p.name ? ' (' + esc(p.name) + ')' : ''} ${gib(p.used_memory_bytes)} GiB`).join('; ')}</span>` : ''}</div>`;
  }).join('')}</span></div>`;
}

// ---------- admin ----------

async function act(action, id) {
  const base = `api/v1/workers/${encodeURIComponent(id)}`;
  let method = 'POST', url = base + '/' + action, body;
  if (action === 'pin') {
    const input = document.querySelector(`[data-pin-input="${CSS.escape(id)}"]`);
    const v = parseFloat(input && input.value);
    if (!(v > 0)) return say(id, 'enter a weight above 0 to pin', true);
    body = JSON.stringify({ weight: v });
  }
  if (action === 'unpin') { method = 'DELETE'; url = base + '/pin'; }
  say(id, `${action}…`, false);
  try {
    const resp = await fetch(url, { method, body, headers: { ...authHeaders(true), 'Content-Type': 'application/json' } });
    const data = await resp.json().catch(() => ({}));
    if (!resp.ok) {
      const msg = resp.status === 401 ? 'admin token rejected' : (data.error || `HTTP ${resp.status}`);
      return say(id, `${action} failed: ${msg}`, true);
    }
    const done = {
      probe: 're-measurement requested', pin: `pinned to ${num(data.pinned_weight, 2)}`, unpin: 'pin cleared',
      admit: 'admitted by admin', hold: 'held by admin',
    }[action];
    if (action === 'pin') {
      const input = document.querySelector(`[data-pin-input="${CSS.escape(id)}"]`);
      if (input) input.value = '';
    }
    say(id, `${done} at ${new Date().toLocaleTimeString()}`, false);
    if (data && data.id) { // show the new state at once, without waiting for the stream
      ui.workers = ui.workers.map(w => w.id === data.id ? data : w);
      render();
    }
  } catch (e) {
    say(id, `${action} failed: ${e.message}`, true);
  }
}

function say(id, text, error) {
  ui.results.set(id, { text, error });
  const el = document.querySelector(`[data-result="${CSS.escape(id)}"]`);
  if (el) {
    el.textContent = text;
    el.classList.toggle('error', !!error);
  }
  toast(text, error);
}

let toastTimer;
function toast(text, error) {
  const el = $('#toast');
  el.textContent = text;
  el.className = 'toast' + (error ? ' error' : '');
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => el.classList.add('hidden'), 5000);
}

function setAdmin(token) {
  ui.adminToken = token;
  if (token) sessionStorage.setItem('heft-admin-token', token); else sessionStorage.removeItem('heft-admin-token');
  document.body.classList.toggle('admin', !!token);
  $('#token-form').classList.toggle('hidden', !!token);
  $('#admin-on').classList.toggle('hidden', !token);
  if (token) loadPending();
}

// checkAdmin asks the coordinator whether token is the admin token, with an
// admin request that changes nothing: clearing the pin of a worker that
// does not exist (404 with the right token, 401 with a wrong one).
// It answers the HTTP status, or 0 when the coordinator cannot be asked.
async function checkAdmin(token) {
  try {
    const resp = await fetch('api/v1/workers/heft-dashboard-token-check/pin',
      { method: 'DELETE', headers: { Authorization: 'Bearer ' + token } });
    return resp.status;
  } catch (e) {
    return 0;
  }
}

function showViewerPrompt() {
  $('#viewer-prompt').classList.remove('hidden');
  setLive(false);
}

// ---------- wiring ----------

function init() {
  const theme = localStorage.getItem('heft-theme');
  if (theme) document.documentElement.dataset.theme = theme;
  $('#theme').addEventListener('click', () => {
    const dark = getComputedStyle(document.documentElement).colorScheme === 'dark';
    document.documentElement.dataset.theme = dark ? 'light' : 'dark';
    localStorage.setItem('heft-theme', document.documentElement.dataset.theme);
  });
  $('#token-form').addEventListener('submit', async ev => {
    ev.preventDefault();
    const v = $('#admin-token').value.trim();
    if (!v) return;
    $('#admin-token').value = '';
    const status = await checkAdmin(v);
    if (status === 401) return toast('admin token rejected by the coordinator', true);
    if (status === 429) return toast('too many wrong tokens from this address; wait a minute', true);
    setAdmin(v);
    toast('admin actions unlocked for this browser tab');
  });
  $('#lock').addEventListener('click', () => setAdmin(''));
  $('#viewer-form').addEventListener('submit', ev => {
    ev.preventDefault();
    ui.viewerToken = $('#viewer-token').value.trim();
    sessionStorage.setItem('heft-viewer-token', ui.viewerToken);
    $('#viewer-prompt').classList.add('hidden');
    start();
  });
  for (const [id, key] of [['#f-model', 'model'], ['#f-state', 'state'], ['#f-warning', 'warning']]) {
    $(id).addEventListener('change', ev => { ui.filters[key] = ev.target.value; render(); });
  }
  $('#f-q').addEventListener('input', ev => { ui.filters.q = ev.target.value; render(); });
  clickable($('#warnings > h2'), () => setCollapsed($('#warnings'), !$('#warnings').classList.contains('collapsed')));
  $('#bulk-approve').addEventListener('submit', ev => {
    ev.preventDefault();
    const sel = {};
    const name = $('#bulk-name').value.trim(), address = $('#bulk-address').value.trim();
    if (name) sel.name = name;
    if (address) sel.address = address;
    if (!name && !address) return toast('give a name pattern, an address range, or both', true);
    bulkApprove(sel);
  });
  $('#bulk-all').addEventListener('click', () => bulkApprove({ all: true }));
  document.addEventListener('click', ev => {
    const b = ev.target.closest('button[data-action]');
    if (b) act(b.dataset.action, b.dataset.id);
    const n = ev.target.closest('button[data-node-action]');
    if (n) nodeAct(n.dataset.nodeAction, n.dataset.node);
  });
  setAdmin(ui.adminToken);
  setInterval(render, 30000); // keeps "measured 3 min ago" honest
  setInterval(loadPending, 10000);
  start();
}

async function start() {
  setLive(false);
  try {
    if (await loadOnce()) {
      connect();
      loadPending();
    }
  } catch (e) {
    toast('cannot load the fleet: ' + e.message, true);
    setTimeout(start, 3000);
  }
}

document.addEventListener('DOMContentLoaded', init);
