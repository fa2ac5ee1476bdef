'use strict';
// The console's views beside the notebook: long-lived sandboxes (the WBX face at /wbx)
// with a live terminal and their files, background jobs, and metrics charts. Loaded
// after app.js, whose helpers ($, el, request, notice, apiKey, store, fmtSize, fmtMs,
// httpError, authHeaders) it uses. The terminal is xterm.js (vendored from npm, served
// by isoboxd under /ui/) on the process WebSocket
// GET /wbx/v1/sandboxes/{id}/process/{pid}/ws.

// ---------- views ----------
const VIEWS = { notebook: ['#tabNb', '#nbView'], sandboxes: ['#tabSb', '#sbView'], jobs: ['#tabJb', '#jbView'], wasm: ['#tabWa', '#waView'], metrics: ['#tabMx', '#mxView'] };
const ORDER = Object.keys(VIEWS);
let view = 'notebook';
function showView(name, focus) {
  view = name;
  for (const [n, [tab, panel]] of Object.entries(VIEWS)) {
    $(tab).setAttribute('aria-selected', String(n === name));
    $(tab).tabIndex = n === name ? 0 : -1;
    $(panel).hidden = n !== name;
  }
  // The kernel's controls belong to the notebook.
  $('#nbControls').hidden = name !== 'notebook';
  if (focus) $(VIEWS[name][0]).focus();
  history.replaceState(null, '', name === 'notebook' ? location.pathname : '#' + name);
  if (name === 'sandboxes') sbStart(); else sbStop();
  if (name === 'metrics') mxStart(); else mxStop();
  if (name === 'jobs') jbStart(); else jbStop();
  if (name === 'wasm') waEnvsLoad();
}
for (const [name, [tab]] of Object.entries(VIEWS)) {
  $(tab).addEventListener('click', () => showView(name));
  // Arrow keys move between tabs (the ARIA tabs pattern).
  $(tab).addEventListener('keydown', e => {
    if (e.key !== 'ArrowLeft' && e.key !== 'ArrowRight') return;
    e.preventDefault();
    const i = ORDER.indexOf(view) + (e.key === 'ArrowRight' ? 1 : ORDER.length - 1);
    showView(ORDER[i % ORDER.length], true);
  });
}

// ---------- sandboxes ----------
const wbx = p => '/wbx/v1' + p;
const SB = { timer: null, prev: new Map(), templates: false };
const fmtDur = s => {
  if (s < 0) s = 0;
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
};
function sbMsg(t) { $('#sbMsg').textContent = t; }

async function sbTemplates() {
  if (SB.templates) return;
  const r = await (await request(wbx('/templates'), { what: 'Listing templates' })).json();
  const sel = $('#sbTemplate');
  sel.replaceChildren(...r.templates.map(t => el('option', { value: t.name, text: t.name, title: t.description || '' })));
  if (r.templates.some(t => t.name === 'base')) sel.value = 'base';
  SB.templates = true;
}

// CPU now: the share of its vCPUs a sandbox used since the last refresh.
function cpuNow(id, m) {
  const now = performance.now(), p = SB.prev.get(id);
  SB.prev.set(id, { t: now, cpu: m.cpu_used_ms });
  if (!p || now - p.t < 200) return '…';
  const pct = (m.cpu_used_ms - p.cpu) / (now - p.t) / (m.vcpu || 1) * 100;
  return `${Math.max(0, pct).toFixed(1)} %`;
}

// One run of `fn` at a time. A call while it runs makes one more run after it, which
// later calls share (a click on Refresh during a timed refresh, or the refresh after an
// action, then shows what is there by then); each call's promise settles with its run.
function serialized(fn) {
  let running = null, again = null;
  const go = () => {
    const p = (async () => { try { await fn(); } finally { if (running === p) running = null; } })();
    running = p;
    return p;
  };
  return () => {
    if (again) return again;
    if (!running) return go();
    again = running.catch(() => {}).then(() => { again = null; return running || go(); });
    return again;
  };
}

const sbRefresh = serialized(async () => {
  try {
    await sbTemplates();
    const list = (await (await request(wbx('/sandboxes'), { what: 'Listing sandboxes' })).json()).sandboxes;
    const metrics = await Promise.all(list.map(s => s.state === 'running'
      ? request(wbx(`/sandboxes/${s.id}/metrics`), { what: 'Sandbox metrics' }).then(r => r.json()).catch(() => null)
      : null));
    const now = Date.now(), body = $('#sbRows');
    // Rows are updated in place (keyed by id), so a refresh never takes the keyboard
    // focus away from a button; a row's buttons are remade only when its state changes.
    const keep = new Set(list.map(s => s.id));
    for (const tr of [...body.children]) if (!keep.has(tr.dataset.id)) tr.remove();
    list.forEach((s, i) => {
      const cells = sbCells(s, metrics[i], now);
      let tr = body.querySelector(`tr[data-id="${CSS.escape(s.id)}"]`);
      if (!tr) {
        tr = el('tr', { 'data-id': s.id }, ...cells.map(c => el('td', c)), sbActs(s));
        tr.dataset.state = s.state;
      } else {
        cells.forEach((c, j) => { const td = tr.children[j]; td.textContent = c.text; td.className = c.class || ''; });
        if (tr.dataset.state !== s.state) { tr.lastElementChild.replaceWith(sbActs(s)); tr.dataset.state = s.state; }
      }
      // In the list's order; a row already in place is not moved (a move drops focus).
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
    $('#sbCount').textContent = `${list.length} running or paused`;
    if (!list.length) body.append(el('tr', {}, el('td', { colspan: 8, class: 'note', text: 'No sandboxes yet: create one above.' })));
    for (const id of SB.prev.keys()) if (!list.some(s => s.id === id)) SB.prev.delete(id);
  } catch (e) {
    sbMsg(e.message);
  }
});

// A row's cells but the actions: what el() takes for each <td>.
function sbCells(s, m, now) {
  const age = (now - Date.parse(s.created_at)) / 1000;
  const left = (Date.parse(s.expires_at) - now) / 1000;
  return [
    { class: 'id', text: s.id },
    { text: s.template },
    { class: `state-${s.state}`, text: s.state },
    { text: fmtDur(age) },
    { text: fmtDur(left) },
    { text: m ? cpuNow(s.id, m) : '—' },
    { text: m ? `${m.mem_used_mb} / ${m.mem_mb} MiB` : '—' },
  ];
}

function sbActs(s) {
  const act = (label, fn, attrs = {}) => el('button', { type: 'button', onclick: fn, ...attrs, text: label });
  return el('td', { class: 'acts' },
    act('Terminal', () => termOpen(s), { disabled: s.state !== 'running', 'aria-label': `Open a terminal in ${s.id}` }),
    act('Files', () => filesOpen(s), { disabled: s.state !== 'running', 'aria-label': `Browse the files of ${s.id}` }),
    act('URL', () => urlOpen(s), { 'aria-label': `Public URLs of ${s.id}` }),
    s.state === 'paused'
      ? act('Resume', () => sbVerb(s, 'resume'), { 'aria-label': `Resume ${s.id}` })
      : act('Pause', () => sbVerb(s, 'pause'), { disabled: s.state !== 'running', 'aria-label': `Pause ${s.id}` }),
    act('+10 min', () => sbExtend(s), { 'aria-label': `Add 10 minutes to ${s.id}` }),
    act('Delete', () => sbDelete(s), { 'aria-label': `Delete ${s.id}` }));
}

async function sbCreate() {
  const btn = $('#sbCreate');
  const mode = $('#sbNet').value;
  const network = { mode };
  if (mode === 'allowlist') network.allow = $('#sbAllow').value.split(',').map(h => h.trim()).filter(Boolean);
  const mins = Number($('#sbTimeout').value);
  const body = { template: $('#sbTemplate').value, network, metadata: { created_by: 'isobox console' } };
  if (mins > 0) body.timeout_s = Math.round(mins * 60);
  btn.disabled = true;
  sbMsg('Creating…');
  try {
    const s = await (await request(wbx('/sandboxes'), { method: 'POST', json: body, what: 'Creating a sandbox' })).json();
    sbMsg(`Created ${s.id} in ${s.info && s.info.start_ms != null ? s.info.start_ms + ' ms' : '?'}${s.info && s.info.warm ? ' (warm)' : ''}.`);
    await sbRefresh();
  } catch (e) {
    sbMsg(e.message);
    notice(e.message);
  } finally {
    btn.disabled = false;
  }
}

async function sbVerb(s, verb) {
  try {
    await request(wbx(`/sandboxes/${s.id}/${verb}`), { method: 'POST', what: `${verb[0].toUpperCase()}${verb.slice(1)} ${s.id}` });
    sbMsg(`${s.id}: ${verb === 'pause' ? 'paused' : 'running again'}.`);
  } catch (e) { sbMsg(e.message); }
  await sbRefresh();
}

async function sbExtend(s) {
  try {
    // The time left now (the row's may be a refresh old), plus ten minutes.
    const cur = await (await request(wbx(`/sandboxes/${s.id}`), { what: `Reading ${s.id}` })).json();
    const timeout_s = Math.max(0, Math.round((Date.parse(cur.expires_at) - Date.now()) / 1000)) + 600;
    await request(wbx(`/sandboxes/${s.id}/timeout`), { method: 'POST', json: { timeout_s }, what: `Extending ${s.id}` });
    sbMsg(`${s.id}: ends in ${fmtDur(timeout_s)}.`);
  } catch (e) { sbMsg(e.message); }
  await sbRefresh();
}

async function sbDelete(s) {
  if (T.sandbox === s.id) termClose();
  if (FB.sandbox === s.id) filesClose();
  if (UR.sandbox === s.id) urlClose();
  try {
    await request(wbx(`/sandboxes/${s.id}`), { method: 'DELETE', what: `Deleting ${s.id}` });
    sbMsg(`${s.id}: deleted.`);
  } catch (e) { sbMsg(e.message); }
  await sbRefresh();
}

function sbStart() {
  sbRefresh();
  if (!SB.timer) SB.timer = setInterval(() => { if (!document.hidden) sbRefresh(); }, 3000);
}
function sbStop() { clearInterval(SB.timer); SB.timer = null; }

$('#sbCreate').addEventListener('click', sbCreate);
$('#sbRefresh').addEventListener('click', sbRefresh);
$('#sbNet').addEventListener('change', () => { $('#sbAllow').hidden = $('#sbNet').value !== 'allowlist'; });

// ---------- terminal ----------
const T = { term: null, fit: null, ws: null, sandbox: null, pid: null, observer: null, gen: 0 };
const b64url = s => btoa(String.fromCharCode(...new TextEncoder().encode(s))).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
function termState(t) { $('#termState').textContent = t; }

function termMake() {
  if (typeof Terminal === 'undefined' || typeof FitAddon === 'undefined') {
    throw new Error('This build of isoboxd has no terminal: its xterm.js was not fetched when it was built (run `make ui-vendor`, then build again).');
  }
  if (T.term) return;
  T.term = new Terminal({ cursorBlink: true, convertEol: false, scrollback: 5000,
    fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace', fontSize: 14 });
  T.fit = new FitAddon.FitAddon();
  T.term.loadAddon(T.fit);
  T.term.open($('#term'));
  const enc = new TextEncoder();
  T.term.onData(d => { if (T.ws && T.ws.readyState === WebSocket.OPEN) T.ws.send(enc.encode(d)); });
  T.term.onBinary(d => {
    if (T.ws && T.ws.readyState === WebSocket.OPEN) T.ws.send(Uint8Array.from(d, c => c.charCodeAt(0) & 255));
  });
  T.term.onResize(({ cols, rows }) => {
    if (T.ws && T.ws.readyState === WebSocket.OPEN) T.ws.send(JSON.stringify({ type: 'resize', cols, rows }));
  });
  // The terminal follows its box, which follows the window.
  T.observer = new ResizeObserver(() => { if (!$('#termPanel').hidden) T.fit.fit(); });
  T.observer.observe($('#term'));
}

// Ends a console shell (a shell nobody sees is no use); keepalive so that it also
// goes out while the page is being left.
function shellEnd(sandbox, pid) {
  fetch(wbx(`/sandboxes/${sandbox}/process/${pid}`), { method: 'DELETE', keepalive: true, headers: authHeaders() }).catch(() => {});
}

async function termOpen(s) {
  termClose();
  const gen = ++T.gen;
  $('#termPanel').hidden = false;
  $('#termWhat').textContent = s.id;
  try { termMake(); } catch (e) { termState(e.message); return; }
  T.term.reset();
  T.fit.fit();
  T.sandbox = s.id;
  termState('Starting a shell…');
  let pid;
  try {
    const r = await request(wbx(`/sandboxes/${s.id}/process`), {
      method: 'POST', what: 'Starting a shell',
      // Job control off (set +m): gVisor tells a terminal's foreground group only inside
      // its session, so Ctrl-C reaches the shell's own group; without job control the
      // command it runs is in that group and gets it.
      json: { cmd: "if command -v bash >/dev/null; then PROMPT_COMMAND='set +m; unset PROMPT_COMMAND' exec bash -l; else exec sh -l +m; fi", tag: 'console', pty: { cols: T.term.cols, rows: T.term.rows } },
    });
    pid = (await r.json()).pid;
  } catch (e) { if (gen === T.gen) termState(e.message); return; }
  // Closed, or opened again, while the shell started: this one is not wanted.
  if (gen !== T.gen) { shellEnd(s.id, pid); return; }
  T.pid = pid;
  const key = apiKey();
  const protocols = ['isobox.terminal'];
  if (key) protocols.push('isobox.bearer.' + b64url(key));
  const ws = new WebSocket(`${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}${wbx(`/sandboxes/${s.id}/process/${pid}/ws`)}`, protocols);
  ws.binaryType = 'arraybuffer';
  T.ws = ws;
  ws.onopen = () => {
    termState(`Connected: process ${pid}.`);
    // The size may have changed while the shell started.
    ws.send(JSON.stringify({ type: 'resize', cols: T.term.cols, rows: T.term.rows }));
    T.term.focus();
  };
  ws.onmessage = e => {
    if (T.ws !== ws) return;
    if (typeof e.data !== 'string') { T.term.write(new Uint8Array(e.data, 1)); return; }
    let m;
    try { m = JSON.parse(e.data); } catch { return; }
    if (m.type === 'exit') {
      const how = m.signal ? `was ended by ${m.signal}` : `exited with code ${m.exit_code}`;
      T.term.write(`\r\n\x1b[2m[the shell ${how}]\x1b[0m\r\n`);
      termState(`The shell ${how}.`);
    } else if (m.type === 'error') {
      termState(m.error);
    }
  };
  ws.onclose = e => {
    if (T.ws !== ws) return;
    T.ws = null;
    if (e.code !== 1000) termState(`Disconnected (${e.code}${e.reason ? ': ' + e.reason : ''}).`);
  };
  ws.onerror = () => { if (T.ws === ws) termState('The terminal connection failed (is the key right? is the sandbox running?).'); };
}

function termClose() {
  const { ws, sandbox, pid } = T;
  T.gen++;
  T.ws = null; T.sandbox = null; T.pid = null;
  if (ws) ws.close(1000);
  // The shell is ended with its terminal.
  if (sandbox && pid) shellEnd(sandbox, pid);
  $('#termPanel').hidden = true;
  termState('');
}
$('#termClose').addEventListener('click', termClose);
// Leaving the page ends its shell too.
addEventListener('pagehide', () => { if (T.sandbox && T.pid) shellEnd(T.sandbox, T.pid); });

// ---------- public URLs ----------
const UR = { sandbox: null };
function urlOpen(s) {
  UR.sandbox = s.id;
  $('#urlPanel').hidden = false;
  $('#urlWhat').textContent = s.id;
  $('#urlList').replaceChildren();
  $('#urlMsg').textContent = '';
  $('#urlPort').focus();
}
function urlClose() { UR.sandbox = null; $('#urlPanel').hidden = true; }
async function urlGet() {
  const id = UR.sandbox, port = Number($('#urlPort').value);
  if (!id) return;
  try {
    const r = await (await request(wbx(`/sandboxes/${id}/url?port=${port}`), { what: `The URL of port ${port}` })).json();
    if (UR.sandbox !== id) return;
    const li = el('li', { 'data-port': String(port) },
      el('span', { text: `port ${port}:` }),
      el('a', { href: r.url_with_token, target: '_blank', rel: 'noopener noreferrer', text: r.url }),
      el('span', { class: 'note', text: '(the link carries the token)' }));
    $('#urlList').querySelector(`li[data-port="${port}"]`)?.remove();
    $('#urlList').prepend(li);
    $('#urlMsg').textContent = '';
  } catch (e) { $('#urlMsg').textContent = e.message; }
}
$('#urlGet').addEventListener('click', urlGet);
$('#urlPort').addEventListener('keydown', e => { if (e.key === 'Enter') { e.preventDefault(); urlGet(); } });
$('#urlClose').addEventListener('click', urlClose);

// ---------- files ----------
// A sandbox's files (fs/list, files?path= for upload, download and delete) and the live
// feed of changes in the folder shown (fs/watch, NDJSON).
const FB = { sandbox: null, cwd: '/home/user', watch: null, refreshSoon: null };
const HOME = '/home/user';
function fMsg(t) { $('#fMsg').textContent = t; }
const joinPath = (dir, name) => (dir === '/' ? '' : dir) + '/' + name;
const q = p => encodeURIComponent(p);

async function filesOpen(s) {
  filesClose();
  FB.sandbox = s.id;
  $('#filesPanel').hidden = false;
  $('#filesWhat').textContent = s.id;
  await filesGo(HOME);
}

async function filesGo(dir) {
  FB.cwd = dir;
  $('#fCwd').textContent = dir;
  $('#fUp').disabled = dir === '/';
  $('#fWatch').replaceChildren();
  await filesList();
  filesWatch();
}

async function filesList() {
  const id = FB.sandbox;
  if (!id) return;
  try {
    const r = await (await request(wbx(`/sandboxes/${id}/fs/list?path=${q(FB.cwd)}&depth=1`), { what: `Listing ${FB.cwd}` })).json();
    if (FB.sandbox !== id) return;
    const entries = r.entries.slice().sort((a, b) => (b.type === 'dir') - (a.type === 'dir') || a.name.localeCompare(b.name));
    $('#fList').replaceChildren(...entries.map(e => el('li', {},
      e.type === 'dir'
        ? el('button', { type: 'button', class: 'fname', text: e.name + '/', 'aria-label': `Open folder ${e.name}`, onclick: () => filesGo(e.path) })
        : el('span', { class: 'fname', text: e.type === 'symlink' ? `${e.name} → ${e.target}` : e.name }),
      el('span', { class: 'size', text: e.type === 'file' ? fmtSize(e.size) : e.type }),
      e.type === 'file' ? el('button', { type: 'button', text: 'Download', 'aria-label': `Download ${e.name}`, onclick: () => filesDownload(e) }) : null,
      el('button', { type: 'button', text: 'Delete', 'aria-label': `Delete ${e.name}`, onclick: () => filesDelete(e) }))));
    if (!entries.length) $('#fList').append(el('li', { class: 'note', text: 'This folder is empty.' }));
    if (r.truncated) fMsg('Only the first entries are shown.');
  } catch (e) { fMsg(e.message); }
}

async function filesDownload(e) {
  try {
    const res = await request(wbx(`/sandboxes/${FB.sandbox}/files?path=${q(e.path)}`), { what: `Downloading ${e.name}` });
    const blob = await res.blob();
    const url = URL.createObjectURL(blob);
    const a = el('a', { href: url, download: e.name, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    fMsg(`Downloaded ${e.name} (${fmtSize(blob.size)}).`);
  } catch (err) { fMsg(err.message); }
}

async function filesDelete(e) {
  try {
    await request(wbx(`/sandboxes/${FB.sandbox}/files?path=${q(e.path)}`), { method: 'DELETE', what: `Deleting ${e.name}` });
    fMsg(`Deleted ${e.name}.`);
  } catch (err) { fMsg(err.message); }
  await filesList();
}

async function filesUpload(files) {
  for (const f of files) {
    try {
      await request(wbx(`/sandboxes/${FB.sandbox}/files?path=${q(joinPath(FB.cwd, f.name))}`), { method: 'PUT', body: f, what: `Uploading ${f.name}` });
      fMsg(`Uploaded ${f.name} (${fmtSize(f.size)}).`);
    } catch (err) { fMsg(err.message); }
  }
  await filesList();
}

// The live feed: fs/watch of the folder shown; each change is listed (newest first, the
// last 50) and the listing refreshed shortly after.
async function filesWatch() {
  if (FB.watch) FB.watch.abort();
  const ctl = new AbortController(), id = FB.sandbox, dir = FB.cwd;
  FB.watch = ctl;
  try {
    const res = await request(wbx(`/sandboxes/${id}/fs/watch?path=${q(dir)}&recursive=false`), { signal: ctl.signal, what: 'Watching the folder' });
    const reader = res.body.getReader(), td = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += td.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.trim()) filesEvent(JSON.parse(line));
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError' && FB.watch === ctl) fMsg(e.message);
  }
}

function filesEvent(ev) {
  const what = ev.type === 'rename' ? `rename ${ev.from} → ${ev.path}`
    : ev.type === 'error' ? `error: ${ev.error}`
    : ev.type === 'end' ? 'the folder was removed'
    : ev.type === 'overflow' ? 'too many changes at once (some not shown)'
    : `${ev.type} ${ev.path}${ev.is_dir ? '/' : ''}`;
  const list = $('#fWatch');
  list.prepend(el('li', { text: `${new Date().toLocaleTimeString()} ${what}` }));
  while (list.children.length > 50) list.lastElementChild.remove();
  clearTimeout(FB.refreshSoon);
  FB.refreshSoon = setTimeout(filesList, 300);
}

function filesClose() {
  if (FB.watch) FB.watch.abort();
  FB.watch = null;
  FB.sandbox = null;
  clearTimeout(FB.refreshSoon);
  $('#filesPanel').hidden = true;
  $('#fList').replaceChildren();
  $('#fWatch').replaceChildren();
  fMsg('');
}

$('#fUp').addEventListener('click', () => filesGo(FB.cwd.replace(/\/[^/]*$/, '') || '/'));
$('#fRefresh').addEventListener('click', filesList);
$('#fUploadBtn').addEventListener('click', () => $('#fUpload').click());
$('#fUpload').addEventListener('change', async () => { const fs = [...$('#fUpload').files]; $('#fUpload').value = ''; await filesUpload(fs); });
$('#fClose').addEventListener('click', filesClose);

// ---------- metrics ----------
// /metrics (Prometheus text) read every 2 s; each chart keeps the last 150 samples
// (5 minutes) and is drawn as SVG lines (no chart library).
const MX = { timer: null, prev: null, series: {} };
const MX_KEEP = 150;
const CHARTS = [
  { id: 'runs', title: 'Runs finished per second', lines: ['runs/s'], fmt: v => v.toFixed(2) },
  // A histogram gives a bucket's upper bound, not the value: "≤".
  { id: 'latency', title: 'Run duration (p50, p95 of the last 2 s)', lines: ['p50', 'p95'], fmt: v => v == null ? '—' : '≤ ' + fmtMs(Math.round(v * 1000)) },
  { id: 'slots', title: 'Run slots in use', lines: ['in use', 'slots'], fmt: v => String(v) },
  { id: 'sandboxes', title: 'Sandboxes alive (tenants\u2019 and pooled)', lines: ['tenant', 'pooled'], fmt: v => String(v) },
];

// Prometheus text → [{name, labels, value}].
function promParse(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] || '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}
const sum = (ms, name, f = () => true) => ms.filter(m => m.name === name && f(m.labels)).reduce((a, m) => a + m.value, 0);

// A quantile from the change of a histogram's buckets between two samples.
function quantile(prev, cur, name, q) {
  const buckets = ms => {
    const by = new Map();
    for (const m of ms) if (m.name === name + '_bucket') by.set(m.labels.le, (by.get(m.labels.le) || 0) + m.value);
    return by;
  };
  const a = buckets(prev), b = buckets(cur);
  const les = [...b.keys()].sort((x, y) => (x === '+Inf') - (y === '+Inf') || Number(x) - Number(y));
  const total = (b.get('+Inf') || 0) - (a.get('+Inf') || 0);
  if (total <= 0) return null;
  for (const le of les) {
    if ((b.get(le) || 0) - (a.get(le) || 0) >= q * total) return le === '+Inf' ? null : Number(le);
  }
  return null;
}

function mxCharts() {
  if ($('#mxCharts').children.length) return;
  const svgNS = 'http://www.w3.org/2000/svg';
  for (const c of CHARTS) {
    const svg = document.createElementNS(svgNS, 'svg');
    svg.setAttribute('viewBox', '0 0 300 90');
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', c.title);
    const grid = document.createElementNS(svgNS, 'line');
    for (const [k, v] of Object.entries({ x1: 0, y1: 89, x2: 300, y2: 89, class: 'grid' })) grid.setAttribute(k, v);
    svg.append(grid);
    c.lines.forEach((_, i) => {
      const pl = document.createElementNS(svgNS, 'polyline');
      pl.setAttribute('class', 'l' + i);
      pl.setAttribute('fill', 'none');
      pl.setAttribute('stroke-width', '2');
      pl.setAttribute('vector-effect', 'non-scaling-stroke');
      svg.append(pl);
    });
    $('#mxCharts').append(el('div', { class: 'chart', id: 'chart-' + c.id },
      el('h3', { text: c.title }),
      el('div', { class: 'now', 'aria-live': 'off' }),
      svg,
      el('div', { class: 'legend', text: c.lines.length > 1 ? `${c.lines[0]} (blue), ${c.lines[1]} (orange)` : '' })));
    MX.series[c.id] = c.lines.map(() => []);
  }
}

function mxDraw() {
  for (const c of CHARTS) {
    const box = $('#chart-' + c.id), series = MX.series[c.id];
    const all = series.flat().filter(v => v != null);
    const max = Math.max(1e-9, ...all) * 1.1;
    box.querySelectorAll('polyline').forEach((pl, i) => {
      // The newest sample at the right edge; the chart fills leftwards over 5 minutes.
      const off = MX_KEEP - series[i].length;
      const pts = series[i].map((v, j) => v == null ? null : `${((off + j) / (MX_KEEP - 1) * 300).toFixed(1)},${(89 - v / max * 86).toFixed(1)}`).filter(Boolean);
      pl.setAttribute('points', pts.join(' '));
    });
    const last = series.map(s => s[s.length - 1]);
    box.querySelector('.now').textContent = c.lines.map((n, i) => `${c.lines.length > 1 ? n + ' ' : ''}${c.fmt(last[i])}`).join(' · ');
    box.dataset.last = JSON.stringify(last);
    box.dataset.peak = JSON.stringify(series.map(s => Math.max(0, ...s.filter(v => v != null))));
  }
}

const mxTick = serialized(async () => {
  try {
    const key = store.get('metricsKey');
    const res = await fetch('/metrics', { cache: 'no-store', headers: key ? { Authorization: 'Bearer ' + key } : {} });
    if (res.status === 401) {
      $('#mxKeyRow').hidden = false;
      $('#mxMsg').textContent = 'This server\u2019s /metrics needs its metrics key (ISOBOX_METRICS_KEY): enter it above.';
      return;
    }
    if (!res.ok) throw await httpError(res, 'Reading /metrics');
    const cur = { t: performance.now(), ms: promParse(await res.text()) };
    $('#mxMsg').textContent = '';
    const p = MX.prev;
    MX.prev = cur;
    if (!p) return;
    const dt = (cur.t - p.t) / 1000;
    const push = (id, vals) => MX.series[id].forEach((s, i) => { s.push(vals[i]); if (s.length > MX_KEEP) s.shift(); });
    push('runs', [(sum(cur.ms, 'isobox_runs_total') - sum(p.ms, 'isobox_runs_total')) / dt]);
    push('latency', [0.5, 0.95].map(q => quantile(p.ms, cur.ms, 'isobox_run_duration_seconds', q)));
    push('slots', [sum(cur.ms, 'isobox_slots_in_use'), sum(cur.ms, 'isobox_slots')]);
    push('sandboxes', ['tenant', 'pooled'].map(k => sum(cur.ms, 'isobox_sandboxes_live', l => l.kind === k)));
    mxDraw();
  } catch (e) {
    $('#mxMsg').textContent = e.message;
  }
});

function mxStart() {
  mxCharts();
  mxTick();
  if (!MX.timer) MX.timer = setInterval(() => { if (!document.hidden) mxTick(); }, 2000);
}
function mxStop() { clearInterval(MX.timer); MX.timer = null; MX.prev = null; }
$('#mxKeySave').addEventListener('click', () => { store.set('metricsKey', $('#mxKey').value.trim()); $('#mxKey').value = ''; $('#mxKeyRow').hidden = true; mxTick(); });

// ---------- jobs ----------
// Background jobs (the WBX face's /v1/jobs): the list, a submit form, and one job's
// summary, test results (the log digest), the end of its log (live while it runs),
// result files, and its receipt with the signature checked here (WebCrypto Ed25519).
const JB = { timer: null, job: null, templates: false, logTimer: null };
const FINISHED = ['completed', 'failed', 'cancelled', 'expired'];
const fmtTime = ts => ts ? new Date(ts).toLocaleTimeString() : '—';
function jbMsg(t) { $('#jbMsg').textContent = t; }

const jbRefresh = serialized(async () => {
  try {
    if (!JB.templates) {
      const r = await (await request(wbx('/templates'), { what: 'Listing templates' })).json();
      $('#jbTemplate').replaceChildren(...r.templates.map(t => el('option', { value: t.name, text: t.name })));
      if (r.templates.some(t => t.name === 'base')) $('#jbTemplate').value = 'base';
      JB.templates = true;
    }
    const jobs = (await (await request(wbx('/jobs?limit=50'), { what: 'Listing jobs' })).json()).jobs;
    btRefresh();
    $('#jbCount').textContent = `${jobs.length} shown, newest first`;
    $('#jbRows').replaceChildren(...jobs.map(jbRow));
    if (!jobs.length) $('#jbRows').append(el('tr', {}, el('td', { colspan: 7, class: 'note', text: 'No jobs yet: submit one above.' })));
  } catch (e) { jbMsg(e.message); }
});

function jbRow(j) {
  const act = (label, fn, attrs = {}) => el('button', { type: 'button', onclick: fn, ...attrs, text: label });
  const done = FINISHED.includes(j.status);
  const what = j.runtime === 'wasi' ? `(wasm) ${j.wasm && j.wasm.module || ''}` : j.command;
  const tr = el('tr', { 'data-id': j.id, class: JB.job === j.id ? 'selected' : null },
    el('td', { class: 'id', text: j.id }),
    el('td', { class: `state-${j.status}`, text: j.status + (j.error && j.error.code ? ` (${j.error.code})` : '') }),
    el('td', { class: 'cmd', text: what, title: what }),
    el('td', { text: fmtTime(j.created_at) }),
    el('td', { text: j.duration_s == null ? '—' : `${j.duration_s.toFixed(1)} s` }),
    el('td', { text: j.cost || '—' }),
    el('td', { class: 'acts' },
      act('Open', () => jobOpen(j.id), { 'aria-label': `Open job ${j.id}` }),
      done ? act('Retry', () => jobRetry(j.id), { 'aria-label': `Retry job ${j.id}` })
        : act('Cancel', () => jobCancel(j.id), { 'aria-label': `Cancel job ${j.id}` })));
  return tr;
}

async function jbSubmit() {
  const command = $('#jbCmd').value;
  if (!command.trim()) { jbMsg('A job needs a command.'); $('#jbCmd').focus(); return; }
  const body = { command, template: $('#jbTemplate').value, timeout_s: Number($('#jbTimeout').value) || 600 };
  const arts = $('#jbArtifacts').value.split(',').map(a => a.trim()).filter(Boolean);
  if (arts.length) body.artifacts = arts;
  $('#jbSubmit').disabled = true;
  try {
    const j = await (await request(wbx('/jobs'), { method: 'POST', json: body, what: 'Submitting a job' })).json();
    jbMsg(`Submitted ${j.id}.`);
    await jbRefresh();
    jobOpen(j.id);
  } catch (e) { jbMsg(e.message); notice(e.message); } finally { $('#jbSubmit').disabled = false; }
}

async function jobCancel(id) {
  try {
    await request(wbx(`/jobs/${id}/cancel`), { method: 'POST', what: `Cancelling ${id}` });
    jbMsg(`${id}: cancelled.`);
  } catch (e) { jbMsg(e.message); }
  await jbRefresh();
  if (JB.job === id) jobLoad();
}

async function jobRetry(id) {
  try {
    const j = await (await request(wbx(`/jobs/${id}/retry`), { method: 'POST', json: {}, what: `Retrying ${id}` })).json();
    jbMsg(`${id}: retried as ${j.id}.`);
    await jbRefresh();
    jobOpen(j.id);
  } catch (e) { jbMsg(e.message); }
}

function jobOpen(id) {
  JB.job = id;
  $('#jobPanel').hidden = false;
  $('#jobWhat').textContent = id;
  for (const tr of $('#jbRows').children) tr.classList.toggle('selected', tr.dataset.id === id);
  for (const s of ['#jobTests', '#jobFiles', '#jobLog']) $(s).replaceChildren();
  $('#jobReceipt').textContent = '';
  $('#jobReceipt').className = 'note';
  jobLoad();
}

function jobClose() {
  JB.job = null;
  clearTimeout(JB.logTimer);
  $('#jobPanel').hidden = true;
}

// Loads the open job's summary, digest, log end, files and receipt; again every 2 s
// while it has not finished.
async function jobLoad() {
  const id = JB.job;
  clearTimeout(JB.logTimer);
  if (!id) return;
  try {
    const sm = await (await request(wbx(`/jobs/${id}/summary`), { what: `Reading ${id}` })).json();
    if (JB.job !== id) return;
    const done = FINISHED.includes(sm.status);
    $('#jobState').textContent = `${sm.status}` + (sm.exit_code != null ? ` · exit code ${sm.exit_code}` : '')
      + (sm.duration_s != null ? ` · ${sm.duration_s.toFixed(1)} s` : '') + (sm.cost ? ` · ${sm.cost}` : '')
      + (sm.error ? ` · ${sm.error.code}: ${sm.error.message}` : '');
    $('#jobState').className = `state-${sm.status}`;
    $('#jobNext').textContent = sm.next_step || '';
    $('#jobCancel').hidden = done;
    $('#jobRetry').hidden = !done;
    // A job that has not started has no log yet: nothing to show, not an error.
    const text = await request(wbx(`/jobs/${id}/logs?offset=-16384`), { what: 'Reading the log' })
      .then(r => r.text()).catch(() => '');
    if (JB.job !== id) return;
    const pre = $('#jobLog');
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = text;
    if (atEnd) pre.scrollTop = pre.scrollHeight;
    if (done) {
      const dg = await (await request(wbx(`/jobs/${id}/logs?mode=summary&max_chars=2000`), { what: 'Reading the log digest' })).json();
      if (JB.job !== id) return;
      jobTests(dg.test_results || []);
      const arts = await (await request(wbx(`/jobs/${id}/artifacts`), { what: 'Listing result files' })).json();
      if (JB.job !== id) return;
      jobFiles(id, arts);
      await jobReceipt(id);
    } else {
      $('#jobTests').replaceChildren(el('p', { class: 'note', text: 'When the job ends.' }));
      JB.logTimer = setTimeout(() => { jobLoad(); jbRefresh(); }, 2000);
    }
  } catch (e) { $('#jobState').textContent = e.message; }
}

function jobTests(results) {
  if (!results.length) { $('#jobTests').replaceChildren(el('p', { class: 'note', text: 'No test output recognised in the log.' })); return; }
  const rows = [];
  for (const r of results) {
    rows.push(el('tr', {}, el('td', { text: r.framework }), el('td', { text: r.passed ?? '—' }), el('td', { class: r.failed ? 'fail' : null, text: r.failed ?? '—' }),
      el('td', { text: r.skipped ?? '—' }), el('td', { text: r.total ?? '—' }), el('td', {})));
    for (const f of r.failures || []) {
      rows.push(el('tr', { class: 'failure' }, el('td', {}), el('td', { colspan: 4, class: 'fail', text: `FAILED ${f.name}` }), el('td', { class: 'fail', text: f.message || '' })));
    }
  }
  $('#jobTests').replaceChildren(el('table', { class: 'list', id: 'jobTestTable' },
    el('caption', { class: 'vh', text: 'Test results from the log' }),
    el('thead', {}, el('tr', {}, ...['Framework', 'Passed', 'Failed', 'Skipped', 'Total', 'Message'].map(h => el('th', { scope: 'col', text: h })))),
    el('tbody', {}, ...rows)));
}

function jobFiles(id, arts) {
  const items = arts.files.map(f => el('li', {},
    el('span', { class: 'fname', text: f.name }), el('span', { class: 'size', text: fmtSize(f.size) }),
    el('button', { type: 'button', text: 'Download', 'aria-label': `Download ${f.name}`, onclick: () => jobDownload(id, f.name) })));
  for (const sk of arts.skipped || []) items.push(el('li', { class: 'note', text: `${sk.name}: skipped (${sk.reason})` }));
  if (!items.length) items.push(el('li', { class: 'note', text: 'No result files.' }));
  $('#jobFiles').replaceChildren(...items);
}

async function jobDownload(id, name) {
  try {
    const res = await request(wbx(`/jobs/${id}/artifacts/${name.split('/').map(encodeURIComponent).join('/')}`), { what: `Downloading ${name}` });
    const url = URL.createObjectURL(await res.blob());
    const a = el('a', { href: url, download: name.split('/').pop(), hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (e) { jbMsg(e.message); }
}

const unb64 = s => Uint8Array.from(atob(s), c => c.charCodeAt(0));
// JSON with object keys sorted: equal for equal values whatever the keys' order.
const canon = v => Array.isArray(v) ? `[${v.map(canon).join(',')}]`
  : v && typeof v === 'object' ? `{${Object.keys(v).sort().map(k => JSON.stringify(k) + ':' + canon(v[k])).join(',')}}`
  : JSON.stringify(v);
// The receipt's Ed25519 signature, checked in the browser against the server's
// receipt key (GET /wbx/v1/receipts/key).
async function jobReceipt(id) {
  const out = $('#jobReceipt');
  try {
    const rc = await (await request(wbx(`/jobs/${id}/receipt`), { what: 'Reading the receipt' })).json();
    const key = await (await request(wbx('/receipts/key'), { what: 'Reading the receipt key' })).json();
    const sig = rc.signature;
    if (!sig || sig.algorithm !== 'Ed25519') throw new Error('the receipt has no Ed25519 signature');
    if (sig.public_key !== key.public_key) throw new Error('the receipt names another key than the server\u2019s');
    const k = await crypto.subtle.importKey('raw', unb64(key.public_key), { name: 'Ed25519' }, false, ['verify']);
    const ok = await crypto.subtle.verify({ name: 'Ed25519' }, k, unb64(sig.value), new TextEncoder().encode(sig.signed));
    // What was signed must be this receipt (without its signature).
    const { signature, ...rest } = rc;
    const same = canon(JSON.parse(sig.signed)) === canon(rest);
    if (JB.job !== id) return;
    out.className = ok && same ? 'ok' : 'bad';
    out.textContent = ok && same
      ? `Signature valid (Ed25519, key ${key.public_key.slice(0, 12)}…): command sha256 ${rc.inputs.command_sha256.slice(0, 16)}…, log sha256 ${(rc.log && rc.log.sha256 || '').slice(0, 16)}…, ${rc.result_files ? rc.result_files.length : 0} result files.`
      : `Signature INVALID${ok ? ' (signs another receipt)' : ''}.`;
  } catch (e) {
    if (JB.job === id) { out.className = 'bad'; out.textContent = `Receipt: ${e.message}`; }
  }
}

// ---------- batches ----------
const BT = { batch: null, timer: null };
const btRefresh = serialized(async () => {
  try {
    const list = (await (await request(wbx('/batches?limit=20'), { what: 'Listing batches' })).json()).batches;
    $('#btCount').textContent = list.length ? `${list.length} shown, newest first` : '';
    $('#btRows').replaceChildren(...list.map(b => el('tr', { 'data-id': b.id, class: BT.batch === b.id ? 'selected' : null },
      el('td', { class: 'id', text: b.id }),
      el('td', { text: b.name || '' }),
      el('td', { class: `state-${b.status === 'partial' ? 'failed' : b.status}`, text: b.status }),
      el('td', { text: String(b.total) }),
      el('td', { text: fmtTime(b.created_at) }),
      el('td', { class: 'acts' }, el('button', { type: 'button', text: 'Open', 'aria-label': `Open batch ${b.id}`, onclick: () => batchOpen(b.id) })))));
    if (!list.length) $('#btRows').append(el('tr', {}, el('td', { colspan: 6, class: 'note', text: 'No batches yet (POST /wbx/v1/batches).' })));
  } catch (e) { jbMsg(e.message); }
});

function batchOpen(id) {
  BT.batch = id;
  $('#batchPanel').hidden = false;
  $('#batchWhat').textContent = id;
  for (const tr of $('#btRows').children) tr.classList.toggle('selected', tr.dataset.id === id);
  batchLoad();
}

function batchClose() {
  BT.batch = null;
  clearTimeout(BT.timer);
  $('#batchPanel').hidden = true;
}

async function batchLoad() {
  const id = BT.batch;
  clearTimeout(BT.timer);
  if (!id) return;
  try {
    const r = await (await request(wbx(`/batches/${id}/report`), { what: `Reading batch ${id}` })).json();
    if (BT.batch !== id) return;
    const counts = Object.entries(r.counts || {}).filter(([, n]) => n).map(([k, n]) => `${n} ${k}`).join(', ');
    $('#batchState').textContent = `${r.status} · ${r.total} jobs${counts ? ' · ' + counts : ''}${r.cost ? ' · ' + r.cost : ''}`;
    $('#batchState').className = `state-${r.status === 'partial' ? 'failed' : r.status}`;
    $('#batchCancel').hidden = r.status !== 'running';
    batchGraph(r.jobs);
    if (r.status === 'running') BT.timer = setTimeout(batchLoad, 2000);
  } catch (e) { $('#batchState').textContent = e.message; }
}

// The jobs as a graph: a column per depth (a job is one column right of the deepest
// job it depends on), a box per job coloured by its state, an arrow per dependency.
const GRAPH_MAX = 300;
function batchGraph(jobs) {
  const box = $('#batchGraph');
  const shown = jobs.slice(0, GRAPH_MAX);
  const depth = new Array(shown.length).fill(0);
  // Longest path from a root, by relaxation (a dependency may come later in the list;
  // there is no cycle: the batch was accepted).
  for (let pass = 0, changed = true; changed && pass < shown.length; pass++) {
    changed = false;
    shown.forEach((j, i) => {
      for (const d of j.depends_on || []) {
        if (d < shown.length && depth[d] + 1 > depth[i]) { depth[i] = depth[d] + 1; changed = true; }
      }
    });
  }
  const cols = [];
  shown.forEach((j, i) => { (cols[depth[i]] = cols[depth[i]] || []).push(i); });
  const W = 150, H = 44, GX = 60, GY = 14, PAD = 12;
  const pos = [];
  cols.forEach((c, x) => c.forEach((i, y) => { pos[i] = { x: PAD + x * (W + GX), y: PAD + y * (H + GY) }; }));
  const width = PAD * 2 + cols.length * (W + GX) - GX;
  const height = PAD * 2 + Math.max(...cols.map(c => c.length)) * (H + GY) - GY;
  const NS = 'http://www.w3.org/2000/svg';
  const mk = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text != null) e.textContent = text;
    return e;
  };
  const svg = mk('svg', { width, height, viewBox: `0 0 ${width} ${height}`, role: 'group', 'aria-label': 'The batch\u2019s jobs and their dependencies' });
  const defs = mk('defs', {});
  const marker = mk('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' });
  marker.append(mk('path', { d: 'M 0 0 L 10 5 L 0 10 z', fill: 'currentColor' }));
  defs.append(marker);
  svg.append(defs);
  shown.forEach((j, i) => {
    for (const d of j.depends_on || []) {
      if (d >= shown.length) continue;
      const a = pos[d], b = pos[i];
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
      svg.append(mk('path', { class: 'edge', 'data-from': d, 'data-to': i, d: `M ${x1} ${y1} C ${x1 + GX / 2} ${y1}, ${x2 - GX / 2} ${y2}, ${x2} ${y2}` }));
    }
  });
  shown.forEach((j, i) => {
    const p = pos[i];
    const g = mk('g', { class: `node ${j.status}`, 'data-index': i, 'data-status': j.status, tabindex: 0, role: 'button',
      'aria-label': `Job ${i}: ${j.status}${j.error_code ? ' (' + j.error_code + ')' : ''}; open it` });
    g.append(mk('rect', { x: p.x, y: p.y, width: W, height: H, rx: 6 }));
    g.append(mk('text', { x: p.x + 8, y: p.y + 17 }, `#${i} ${j.status}`));
    g.append(mk('text', { x: p.x + 8, y: p.y + 34 }, (j.error_code || (j.command || '').slice(0, 18))));
    g.append(mk('title', {}, `${j.id}\n${j.command || ''}${j.error ? '\n' + j.error : ''}`));
    const open = () => jobOpen(j.id);
    g.addEventListener('click', open);
    g.addEventListener('keydown', e => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); open(); } });
    svg.append(g);
  });
  box.replaceChildren(svg);
  if (jobs.length > shown.length) box.append(el('p', { class: 'note', text: `The first ${GRAPH_MAX} of ${jobs.length} jobs are drawn.` }));
}

async function batchCancel() {
  const id = BT.batch;
  if (!id) return;
  try {
    await request(wbx(`/batches/${id}/cancel`), { method: 'POST', what: `Cancelling ${id}` });
  } catch (e) { jbMsg(e.message); }
  batchLoad();
  btRefresh();
}

function jbStart() {
  jbRefresh();
  if (!JB.timer) JB.timer = setInterval(() => { if (!document.hidden) jbRefresh(); }, 5000);
}
function jbStop() { clearInterval(JB.timer); JB.timer = null; }
$('#jbSubmit').addEventListener('click', jbSubmit);
$('#jbRefresh').addEventListener('click', jbRefresh);
$('#jbCmd').addEventListener('keydown', e => { if (e.key === 'Enter') { e.preventDefault(); jbSubmit(); } });
$('#jobCancel').addEventListener('click', () => JB.job && jobCancel(JB.job));
$('#jobRetry').addEventListener('click', () => JB.job && jobRetry(JB.job));
$('#jobClose').addEventListener('click', jobClose);
$('#batchClose').addEventListener('click', batchClose);
$('#batchCancel').addEventListener('click', batchCancel);

// ---------- WebAssembly (the eryx face) ----------
// Runs Python in WebAssembly (POST /eryx/v1/execute, or a session's execute) and shows
// each run's compute units; lists and creates environments.
const eryx = p => '/eryx/v1' + p;
const WA = { session: null, sessionEnv: null, running: false };
const fmtUnits = n => Number(n).toLocaleString('en-US');

async function waRun() {
  if (WA.running) return;
  const code = $('#waCode').value, environment = $('#waEnv').value;
  const fuel = Number($('#waFuel').value);
  const body = { code };
  if (fuel > 0) body.fuel_limit = fuel;
  WA.running = true;
  $('#waRun').disabled = true;
  $('#waResult').replaceChildren(el('p', { class: 'note', text: 'Running…' }));
  try {
    let url = eryx('/execute');
    if ($('#waSession').checked) {
      if (!WA.session || WA.sessionEnv !== environment) {
        await waEndSession();
        const sess = await (await request(eryx('/sessions'), { method: 'POST', json: { environment }, what: 'Starting a session' })).json();
        WA.session = sess.id;
        WA.sessionEnv = environment;
      }
      url = eryx(`/sessions/${WA.session}/execute`);
      $('#waSessState').textContent = `session ${WA.session.slice(0, 8)}…`;
      $('#waEndSession').hidden = false;
    } else {
      body.environment = environment;
    }
    const r = await (await request(url, { method: 'POST', json: body, what: 'Running the code' })).json();
    waShow(r);
    $('#waRunRows').prepend(el('tr', {},
      el('td', { text: new Date().toLocaleTimeString() }),
      el('td', { class: r.status === 'success' ? 'state-completed' : 'state-failed', text: r.status }),
      el('td', { class: 'units', text: fmtUnits(r.compute_units) }),
      el('td', { text: WA.session && $('#waSession').checked ? `${environment} (session)` : environment }),
      el('td', { class: 'cmd', text: code.split('\n')[0], title: code })));
    while ($('#waRunRows').children.length > 20) $('#waRunRows').lastElementChild.remove();
  } catch (e) {
    $('#waResult').replaceChildren(el('p', { class: 'err', text: e.message }));
  } finally {
    WA.running = false;
    $('#waRun').disabled = false;
  }
}

function waShow(r) {
  const kids = [el('div', { class: 'badges' },
    el('span', { class: `badge ${r.status === 'success' ? 'ok' : 'bad'}`, text: r.status }),
    el('span', { class: 'badge', id: 'waUnits', text: `${fmtUnits(r.compute_units)} compute units` }))];
  if (r.stdout) kids.push(el('pre', { class: 'stream', id: 'waStdout', text: r.stdout }));
  if (r.stderr) kids.push(el('pre', { class: 'stream stderr', text: r.stderr }));
  if (r.error) kids.push(el('pre', { class: 'stream stderr', id: 'waError', text: r.error }));
  if (r.unsaved_variables && r.unsaved_variables.length) kids.push(el('p', { class: 'note', text: `Not kept in the session: ${r.unsaved_variables.join(', ')}` }));
  $('#waResult').replaceChildren(...kids);
}

async function waEndSession() {
  const id = WA.session;
  WA.session = null;
  WA.sessionEnv = null;
  $('#waSessState').textContent = '';
  $('#waEndSession').hidden = true;
  if (id) await request(eryx(`/sessions/${id}`), { method: 'DELETE', what: 'Ending the session' }).catch(e => { $('#waMsg').textContent = e.message; });
}

async function waEnvsLoad() {
  try {
    const envs = (await (await request(eryx('/environments'), { what: 'Listing environments' })).json()).environments;
    const cur = $('#waEnv').value;
    $('#waEnv').replaceChildren(el('option', { value: 'python', text: 'python' }),
      ...envs.filter(e => e.status === 'ready').map(e => el('option', { value: e.name, text: e.name })));
    if ([...$('#waEnv').options].some(o => o.value === cur)) $('#waEnv').value = cur;
    $('#waEnvRows').replaceChildren(...envs.map(e => el('tr', { 'data-name': e.name },
      el('td', { class: 'id', text: e.name }),
      el('td', { class: e.status === 'ready' ? 'state-completed' : e.status === 'failed' ? 'state-failed' : null, text: e.status, title: e.error || '' }),
      el('td', { text: (e.imports || []).join(' ') }),
      el('td', { text: (e.packages || []).join(', ') }),
      el('td', { class: 'acts' }, el('button', { type: 'button', text: 'Delete', 'aria-label': `Delete environment ${e.name}`, onclick: () => waEnvDelete(e.name) })))));
    if (!envs.length) $('#waEnvRows').append(el('tr', {}, el('td', { colspan: 5, class: 'note', text: 'No environments yet: runs use "python", the standard library.' })));
    // A build in progress is looked at again.
    clearTimeout(WA.envTimer);
    if (envs.some(e => e.status === 'building') && view === 'wasm') WA.envTimer = setTimeout(waEnvsLoad, 3000);
  } catch (e) { $('#waMsg').textContent = e.message; }
}

async function waEnvCreate() {
  const fd = new FormData();
  fd.append('name', $('#waEnvName').value.trim());
  if ($('#waEnvImports').value.trim()) fd.append('imports', $('#waEnvImports').value.trim());
  for (const f of $('#waEnvPkg').files) fd.append('package', f, f.name);
  try {
    const e = await (await request(eryx('/environments'), { method: 'POST', body: fd, what: 'Creating an environment' })).json();
    $('#waMsg').textContent = `${e.name}: ${e.status}.`;
    $('#waEnvPkg').value = '';
    $('#waEnvPkgNames').textContent = '';
  } catch (err) { $('#waMsg').textContent = err.message; }
  await waEnvsLoad();
}

async function waEnvDelete(name) {
  try {
    await request(eryx(`/environments/${encodeURIComponent(name)}`), { method: 'DELETE', what: `Deleting ${name}` });
    $('#waMsg').textContent = `${name}: deleted.`;
  } catch (e) { $('#waMsg').textContent = e.message; }
  await waEnvsLoad();
}

$('#waRun').addEventListener('click', waRun);
$('#waCode').addEventListener('keydown', e => {
  // (Tab is left alone: it moves the focus on, so the editor is never a keyboard trap.)
  if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); waRun(); }
});
$('#waSession').addEventListener('change', () => { if (!$('#waSession').checked) waEndSession(); });
$('#waEndSession').addEventListener('click', () => { $('#waSession').checked = false; waEndSession(); });
$('#waEnvPkgBtn').addEventListener('click', () => $('#waEnvPkg').click());
$('#waEnvPkg').addEventListener('change', () => { $('#waEnvPkgNames').textContent = [...$('#waEnvPkg').files].map(f => f.name).join(', '); });
$('#waEnvCreate').addEventListener('click', waEnvCreate);
$('#waEnvRefresh').addEventListener('click', waEnvsLoad);
addEventListener('pagehide', () => {
  if (WA.session) fetch(eryx(`/sessions/${WA.session}`), { method: 'DELETE', keepalive: true, headers: authHeaders() }).catch(() => {});
});

for (const name of ORDER) if (location.hash === '#' + name) showView(name);
