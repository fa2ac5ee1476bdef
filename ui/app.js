'use strict';
// ---------- small helpers ----------
const $ = (s, r = document) => r.querySelector(s);
function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of kids) if (c != null) e.append(c);
  return e;
}
const store = {
  get(k) { try { return localStorage.getItem('isobox.' + k) || ''; } catch { return ''; } },
  set(k, v) { try { v ? localStorage.setItem('isobox.' + k, v) : localStorage.removeItem('isobox.' + k); } catch {} },
};
const fmtMs = ms => ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(2)} s`;
const fmtSize = n => n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;

// ---------- HTTP ----------
const REASONS = { 400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed',
  408: 'Request Timeout', 409: 'Conflict', 410: 'Gone', 413: 'Payload Too Large', 429: 'Too Many Requests',
  500: 'Internal Server Error', 501: 'Not Implemented', 502: 'Bad Gateway', 503: 'Service Unavailable',
  504: 'Gateway Timeout', 507: 'Insufficient Storage' };
class HttpError extends Error {
  constructor(what, status, code, detail, retryAfter) {
    let m = `${what} failed: HTTP ${status} ${REASONS[status] || ''}`.trim();
    if (code) m += ` — ${code}`;
    if (detail) m += `: ${detail}`;
    if (retryAfter) m += ` (Retry-After: ${retryAfter} s — try again then)`;
    if (status === 401 && code === 'unauthorized') m += '. This server needs an API key: enter it in the "API key" field at the top.';
    super(m);
    Object.assign(this, { status, code, detail, retryAfter });
  }
}
async function httpError(res, what) {
  let text = '', body = null, code = '', detail = '';
  try { text = await res.text(); body = JSON.parse(text); } catch {}
  if (body && typeof body === 'object') {
    const e = body.error;
    if (typeof e === 'string') { code = e; detail = body.detail || body.message || ''; }
    else if (e && typeof e === 'object') { code = e.code || e.type || ''; detail = e.message || ''; }
    else detail = body.detail || body.message || '';
  } else detail = text.trim().slice(0, 300);
  return new HttpError(what, res.status, String(code), String(detail), res.headers.get('Retry-After'));
}
function apiKey() { return store.get('apiKey'); }
function authHeaders(h = {}, key = apiKey()) { if (key) h['X-API-Key'] = key; return h; }
const label = (method, url) => `${method} ${url.split('?')[0].replace(/[0-9a-f]{32}/g, '{id}')}`;
// fetch() wrapper: JSON bodies, the API key, readable errors for non-2xx and network failures.
async function request(url, { method = 'GET', json, body, headers = {}, sse, signal, what, key } = {}) {
  headers = authHeaders({ ...headers }, key === undefined ? apiKey() : key);
  if (json !== undefined) { headers['Content-Type'] = 'application/json'; body = JSON.stringify(json); }
  if (sse) headers.Accept = 'text/event-stream';
  what = what || label(method, url);
  let res;
  try { res = await fetch(url, { method, headers, body, signal, cache: 'no-store' }); }
  catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new Error(`${what} failed: could not reach the server (${e.message})`);
  }
  if (!res.ok) throw await httpError(res, what);
  return res;
}
// Server-sent events over a fetch() response (EventSource cannot POST): calls on(event, data).
async function readSSE(res, on) {
  const reader = res.body.getReader(), td = new TextDecoder();
  let buf = '', ev = '', data = [];
  const line = l => {
    if (l === '') { if (data.length) on(ev || 'message', data.join('\n')); ev = ''; data = []; return; }
    if (l[0] === ':') return;
    const i = l.indexOf(':');
    const f = i < 0 ? l : l.slice(0, i);
    let v = i < 0 ? '' : l.slice(i + 1);
    if (v[0] === ' ') v = v.slice(1);
    if (f === 'event') ev = v; else if (f === 'data') data.push(v);
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buf += done ? td.decode() : td.decode(value, { stream: true });
      let m;
      while ((m = /\r\n|\r|\n/.exec(buf))) {
        if (m[0] === '\r' && m.index === buf.length - 1 && !done) break; // maybe half of \r\n
        line(buf.slice(0, m.index));
        buf = buf.slice(m.index + m[0].length);
      }
      if (done) { if (buf) line(buf); line(''); return; }
    }
  } finally { reader.cancel().catch(() => {}); } // when on() threw: close the stream
}
// A response body as a Blob, or null when it passes cap bytes (reading stops there).
async function readCapped(res, cap) {
  const reader = res.body.getReader(), parts = [];
  let n = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return new Blob(parts);
    n += value.length;
    if (n > cap) { reader.cancel().catch(() => {}); return null; }
    parts.push(value);
  }
}

// ---------- notices ----------
function notice(msg) { $('#noticeText').textContent = msg; $('#notice').hidden = false; }
function clearNotice() { $('#notice').hidden = true; }
$('#noticeClose').onclick = clearNotice;

// ---------- kernel session ----------
const S = { sess: null, creating: null, runtimes: [], kernelRuntime: 'python', lock: Promise.resolve() };
function sessState() {
  const st = $('#sessState'), s = S.sess;
  st.classList.toggle('dead', !!(s && s.dead));
  st.textContent = S.creating ? 'Kernel: starting…' : !s ? 'Kernel: not started (starts on the first Python run)'
    : s.dead ? `Kernel: ended — ${s.reason}. The next Python run starts a fresh one (files are kept).`
    : `Kernel: ready (${s.runtime}, session ${s.id.slice(0, 8)})`;
  $('#sessEnd').disabled = !s;
}
// Runs fn with the kernel to itself: one step at a time per session (else 409 session_busy).
function withKernel(fn) { const p = S.lock.then(() => fn()); S.lock = p.catch(() => {}); return p; }
const sessUrl = (s, p = '') => `/v1/sessions/${s.id}${p}`;
const tokenHeader = s => ({ 'X-Session-Token': s.token });
async function dropSession(s, key) {
  for (let i = 0; i < 5; i++) {
    try { await request(sessUrl(s), { method: 'DELETE', headers: tokenHeader(s), key }); return; }
    catch (e) {
      if (e.status === 404) return;
      if (e.status !== 409) throw e;
      await new Promise(r => setTimeout(r, 1000)); // a step is still finishing
    }
  }
}
// Starts a kernel session if there is none (or it ended). When it replaces an ended one,
// the old workspace's files are carried over (zip → upload → unzip in the new kernel)
// and note() is told what happened.
function ensureSession(note) {
  if (S.sess && !S.sess.dead) return Promise.resolve(S.sess);
  if (S.creating) return S.creating;
  S.creating = (async () => {
    const old = S.sess;
    try {
      let zip = null;
      if (old) {
        S.sess = null;
        zip = await request(sessUrl(old, '/fs?path=&format=zip'), { headers: tokenHeader(old), key: old.key })
          .then(r => readCapped(r, 16e6)).then(b => b || 'big', () => null);
        await dropSession(old, old.key).catch(() => {});
      }
      const res = await request('/v1/sessions', { method: 'POST', json: { runtime: S.kernelRuntime, type: 'kernel', network: $('#net').checked } });
      const v = await res.json();
      const s = S.sess = { id: v.id, token: v.token, runtime: v.runtime, key: apiKey() };
      F.cwd = [];
      if (old) {
        let carried = '';
        if (zip === 'big') carried = ' The old files were too large to carry over (over 16 MB zipped).';
        else if (zip && zip.size > 22) { // 22 bytes: an empty archive; 16 MB: under the upload cap
          try {
            await request(sessUrl(s, '/fs?path=.isobox-carry.zip'), { method: 'PUT', body: zip, headers: tokenHeader(s) });
            const r = await (await request(sessUrl(s, '/exec'), { method: 'POST', headers: tokenHeader(s), json: { code:
              'import zipfile as _z, os as _o\nwith _z.ZipFile(".isobox-carry.zip") as _f: _f.extractall()\n_o.remove(".isobox-carry.zip")\ndel _z, _o, _f' } })).json();
            if (r.run.exitCode !== 0) throw new Error(r.run.stderr.trim().split('\n').pop());
            carried = ' Files in /workspace were carried over.';
          } catch (e) { carried = ` The old files could not be carried over (${e.message}).`; }
        }
        if (note) note(`Started a fresh kernel (the previous one ended: ${old.reason}); earlier variables are gone.${carried}`);
      }
      return s;
    } finally { S.creating = null; sessState(); refreshFiles(); }
  })();
  sessState();
  return S.creating;
}
function markDead(s, reason) { if (s) { s.dead = true; s.reason = reason || 'the kernel has ended'; } sessState(); }
async function endSession() {
  const s = S.sess;
  if (!s) return;
  await withKernel(async () => {
    try { await dropSession(s, s.key); S.sess = null; } catch (e) { notice(e.message); }
    sessState(); refreshFiles();
  });
}
$('#sessEnd').onclick = endSession;
$('#sessNew').onclick = () => withKernel(async () => {
  if (S.sess) markDead(S.sess, 'restarted by you');
  try { await ensureSession(t => { $('#fsMsg').textContent = t; }); } catch (e) { notice(e.message); }
});
addEventListener('pageshow', e => { // back from the page cache: pagehide ended the session
  if (e.persisted && S.sess) { S.sess = null; sessState(); refreshFiles(); }
});
addEventListener('pagehide', () => {
  const s = S.sess;
  if (s) fetch(sessUrl(s), { method: 'DELETE', keepalive: true, headers: authHeaders(tokenHeader(s), s.key) }).catch(() => {});
});

// Runs one step (kernel: sess given) or a one-shot /execute, streaming into sink; returns the done object.
async function streamRun(url, body, sink, signal, sess) {
  const res = await request(url, { method: 'POST', json: body, sse: true, signal, headers: sess ? tokenHeader(sess) : {} });
  let result = null, failure = null;
  await readSSE(res, (ev, data) => {
    let d; try { d = JSON.parse(data); } catch { return; }
    if (ev === 'stdout' || ev === 'stderr') sink.chunk(ev, d.chunk || '');
    else if (ev === 'done') result = d;
    else if (ev === 'error') failure = d.error || data;
  });
  if (failure) throw new Error(`The run failed on the server: ${failure}`);
  if (!result) throw new Error('The stream ended without a result (connection lost?)');
  return result;
}
// Kernel step with session bookkeeping: starts/restarts the kernel as needed, marks it dead on 410.
async function kernelStep(body, sink, signal, noteTo) {
  return withKernel(async () => {
    const s = await ensureSession(noteTo);
    try {
      const r = await streamRun(sessUrl(s, '/exec'), body, sink, signal, s);
      if (r.run && (r.run.timedOut || r.run.oomKilled)) markDead(s, r.run.timedOut ? 'a step ran past its wall time' : 'it ran out of memory');
      return r;
    } catch (e) {
      if (e.status === 410) markDead(s, e.detail || 'kernel_dead');
      if (e.status === 404 && e.code === 'session_not_found') { S.sess = null; sessState(); }
      throw e;
    }
  });
}

// ---------- output rendering ----------
function makeSink(pre) {
  let node = null, kind = '';
  const n = { stdout: 0, stderr: 0 };
  return {
    n,
    chunk(k, text) {
      if (!text) return;
      n[k] += text.length;
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      if (k !== kind) { node = document.createTextNode(''); pre.append(el('span', { class: k }, node)); kind = k; }
      node.appendData(text);
      if (stick) pre.scrollTop = pre.scrollHeight;
    },
  };
}
function badge(box, text, cls = '', title) { box.append(el('span', { class: 'badge ' + cls, text, title })); }
function renderArtifacts(box, arts) {
  (arts || []).forEach((a, i) => {
    if (a.type === 'image/png' && a.dataB64) box.append(el('img', { src: 'data:image/png;base64,' + a.dataB64, alt: `Figure ${i + 1} (PNG output)` }));
    else if (a.type === 'text/html' && typeof a.data === 'string') {
      // Untrusted HTML: a sandboxed frame with no scripts and an opaque origin.
      // Its height cannot be measured (opaque origin): guess from the rows; the user can resize it.
      const rows = (a.data.match(/<tr/gi) || []).length;
      const f = el('iframe', { sandbox: '', title: `HTML output ${i + 1}`, referrerpolicy: 'no-referrer',
        style: `height:${Math.max(90, Math.min(420, rows ? 24 * rows + 40 : 200))}px` });
      f.srcdoc = '<!doctype html><meta charset="utf-8"><style>body{font:13px sans-serif;margin:6px}table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:2px 6px;text-align:right}</style>' + a.data;
      box.append(f);
    } else box.append(el('p', { class: 'note', text: `(an artifact of type ${a.type} is not shown)` }));
  });
}
// Badges + any output that did not stream (e.g. a compile error) + artifacts.
function renderResult(r, { badges, sink, arts }) {
  const run = r.run || r;
  const code = run.exitCode;
  if (r.compile && r.compile.exitCode !== 0) badge(badges, `build failed (exit ${r.compile.exitCode})`, 'bad');
  badge(badges, `exit code ${code}`, 'exit ' + (code === 0 ? 'ok' : 'bad'));
  if (run.durationMs != null) badge(badges, fmtMs(run.durationMs), 'dur', 'run time');
  if (run.timedOut) badge(badges, 'timed out', 'timeout', 'killed by the wall-time limit');
  if (run.oomKilled) badge(badges, 'out of memory', 'oom', 'killed by the memory limit');
  if (run.truncated) badge(badges, 'output truncated', 'warn');
  if (r.warning) badge(badges, 'offline', 'warn', r.warning);
  if (sink) for (const k of ['stdout', 'stderr']) if (!sink.n[k] && run[k]) sink.chunk(k, run[k]);
  renderArtifacts(arts, r.artifacts);
}

// ---------- notebook ----------
const cells = [];
let execCount = 0;
function runtimeOptions(select, value) {
  const names = S.runtimes.length ? S.runtimes.map(r => r.language) : [S.kernelRuntime];
  select.replaceChildren(...names.map(n => {
    const r = S.runtimes.find(x => x.language === n);
    return el('option', { value: n, text: r ? `${n} ${r.version}` : n });
  }));
  select.value = names.includes(value) ? value : names.includes(S.kernelRuntime) ? S.kernelRuntime : names[0];
}
function updateMode(c) {
  const k = c.rt.value === S.kernelRuntime;
  c.mode.textContent = k ? 'kernel' : 'one-shot';
  c.mode.title = k ? 'Runs in the live kernel session: variables persist between cells'
    : 'Runs one-shot in a fresh sandbox via POST /execute: nothing persists';
  c.code.setLanguage(c.rt.value);
}
function renumber() {
  cells.forEach((c, i) => {
    c.root.setAttribute('aria-label', `Cell ${i + 1}`);
    c.run.setAttribute('aria-label', `Run cell ${i + 1}`);
    c.del.setAttribute('aria-label', `Delete cell ${i + 1}`);
    c.code.setLabel(`Code of cell ${i + 1}`);
  });
}
// A cell's code: CodeMirror 6 (vendored at build time, /ui/editor.js: highlighting,
// bracket matching, indentation per language; Tab indents, Escape then Tab leaves),
// or, in a build made without `make ui-vendor`, a plain text area with the same
// interface (Tab then moves focus as anywhere else).
function codeEditor(c, code) {
  const onRun = shift => cellRun(c, shift);
  if (globalThis.IsoboxEditor) {
    const ed = IsoboxEditor.create(null, { doc: code, language: c.rt.value, onRun });
    ed.dom.classList.add('code');
    return ed;
  }
  const t = el('textarea', { class: 'code plain', spellcheck: 'false', wrap: 'off', autocapitalize: 'off', rows: '3' });
  t.value = code;
  const grow = () => { t.style.height = 'auto'; t.style.height = Math.min(t.scrollHeight + 4, 600) + 'px'; };
  t.addEventListener('input', grow);
  t.addEventListener('keydown', e => {
    if (e.key === 'Enter' && (e.shiftKey || e.ctrlKey || e.metaKey)) { e.preventDefault(); onRun(e.shiftKey); }
  });
  requestAnimationFrame(grow);
  return {
    dom: t,
    get value() { return t.value; },
    setValue(v) { t.value = v; grow(); },
    setLanguage() {},
    setLabel(v) { t.setAttribute('aria-label', v); },
    focus() { t.focus(); },
  };
}
function addCell(after, code = '') {
  const prev = after || cells[cells.length - 1];
  const c = {};
  c.rt = el('select', { class: 'rt', 'aria-label': 'Runtime', onchange: () => updateMode(c) });
  c.mode = el('span', { class: 'mode' });
  c.wall = el('input', { class: 'wall', type: 'number', min: '0.1', max: '20', step: '0.1', placeholder: 'default', inputmode: 'decimal', 'aria-label': 'Time limit in seconds' });
  c.run = el('button', { class: 'run primary', type: 'button', text: 'Run', onclick: () => c.running ? c.ctl.abort() : runCell(c) });
  c.del = el('button', { class: 'del', type: 'button', text: '✕', onclick: () => deleteCell(c) });
  runtimeOptions(c.rt, prev ? prev.rt.value : S.kernelRuntime);
  c.code = codeEditor(c, code);
  c.n = el('span', { class: 'cn', text: '[ ]', 'aria-hidden': 'true' });
  c.badges = el('div', { class: 'badges', 'aria-live': 'polite' });
  c.notes = el('div', { 'aria-live': 'polite' });
  c.stream = el('pre', { class: 'stream', 'aria-label': 'Output' });
  c.arts = el('div', { class: 'arts' });
  c.out = el('div', { class: 'out', hidden: true }, c.badges, c.notes, c.stream, c.arts);
  c.root = el('div', { class: 'cell', role: 'group' },
    el('div', { class: 'cbar' }, c.n, el('label', {}, 'Runtime ', c.rt), c.mode,
      el('label', { title: 'Wall-time limit for this run (max 20 s). In the kernel a step that passes it ends the kernel.' }, 'Limit ', c.wall, ' s'),
      el('span', { class: 'spacer' }), c.run, c.del),
    c.code.dom, c.out);
  updateMode(c);
  // Shift+Enter / Ctrl+Enter from the cell's other controls (the editor handles its own).
  c.root.addEventListener('keydown', e => {
    if (e.defaultPrevented || e.key !== 'Enter' || !(e.shiftKey || e.ctrlKey || e.metaKey)) return;
    e.preventDefault(); cellRun(c, e.shiftKey);
  });
  const idx = after ? cells.indexOf(after) + 1 : cells.length;
  cells.splice(idx, 0, c);
  const next = cells[idx + 1];
  $('#cells').insertBefore(c.root, next ? next.root : null);
  renumber();
  return c;
}
function deleteCell(c) {
  if (c.running) c.ctl.abort();
  const i = cells.indexOf(c);
  cells.splice(i, 1); c.root.remove();
  if (!cells.length) addCell();
  renumber();
  (cells[Math.min(i, cells.length - 1)]).code.focus();
}
// Run a cell (unless it is running); with Shift, go on to the next cell, adding one
// at the end.
function cellRun(c, next) {
  if (!c.running) runCell(c);
  if (next) { const i = cells.indexOf(c); (cells[i + 1] || addCell(c)).code.focus(); }
}
async function runCell(c) {
  const rt = c.rt.value, code = c.code.value, kernel = rt === S.kernelRuntime;
  c.running = true; c.ctl = new AbortController();
  c.root.classList.add('running'); c.run.textContent = 'Stop';
  c.badges.replaceChildren(); c.notes.replaceChildren(); c.stream.replaceChildren(); c.arts.replaceChildren();
  c.out.hidden = false; c.n.textContent = '[*]';
  badge(c.badges, kernel ? 'running…' : 'running one-shot…', 'pending');
  const sink = makeSink(c.stream);
  const body = { code };
  const w = parseFloat(c.wall.value);
  if (w > 0) body.limits = { wallTimeMs: Math.round(w * 1000) };
  const note = (t, cls = 'note') => c.notes.append(el('p', { class: cls, text: t }));
  try {
    let r;
    if (kernel) r = await kernelStep(body, sink, c.ctl.signal, note);
    else r = await streamRun('/execute', { language: rt, network: $('#net').checked, ...body }, sink, c.ctl.signal);
    c.badges.replaceChildren();
    renderResult(r, { badges: c.badges, sink, arts: c.arts });
    if (kernel && S.sess && S.sess.dead) note('This step ended the kernel. The next Python run starts a fresh one (variables are lost; files are carried over).');
  } catch (e) {
    c.badges.replaceChildren();
    if (e.name === 'AbortError') badge(c.badges, 'stopped', 'warn', kernel ? 'The step keeps running in the kernel until it ends or hits its time limit' : '');
    else {
      badge(c.badges, 'error', 'bad');
      note(e.message, 'err');
      if (e.status === 410) c.notes.append(el('button', { type: 'button', text: 'Start a fresh kernel', onclick: () => $('#sessNew').click() }));
      if (e.code === 'session_not_found') note('The session is gone (expired or deleted); the next run starts a new one.');
      if (e.code === 'session_busy') note('The kernel is still busy with an earlier (stopped) step; try again when it ends.');
    }
  } finally {
    c.running = false; c.root.classList.remove('running'); c.run.textContent = 'Run';
    c.n.textContent = `[${++execCount}]`;
    if (kernel) refreshFiles();
  }
}
$('#addCell').onclick = () => addCell().code.focus();

// ---------- network: the server's egress state ----------
// /readyz needs no key. With egress off or not verified a run asking for network runs
// offline anyway: the box is unchecked and disabled, and the reason is shown.
async function loadEgress() {
  const box = $('#net'), why = $('#netWhy');
  let eg;
  try { eg = (await (await fetch('/readyz')).json()).egress || {}; } catch { return; }
  const off = eg.state !== 'verified';
  if (off && !box.disabled) S.netWanted = box.checked;
  if (!off && box.disabled) box.checked = S.netWanted !== false;
  if (off) box.checked = false;
  box.disabled = off;
  why.hidden = !off;
  why.textContent = eg.state === 'off' ? 'network is off on this server (ISOBOX_EGRESS=off)'
    : off ? `network unavailable: egress not verified (${eg.reason || 'unknown reason'})` : '';
}
loadEgress();
setInterval(loadEgress, 30000);

// ---------- runtimes, key ----------
async function loadRuntimes() {
  try {
    // One entry per language, its default version (a newer one is its own entry).
    S.runtimes = (await (await request('/runtimes')).json()).filter(r => r.default !== false);
    const names = S.runtimes.map(r => r.language);
    S.kernelRuntime = names.includes('python') ? 'python' : names.includes('python-slim') ? 'python-slim' : 'python';
    for (const c of cells) { runtimeOptions(c.rt, c.rt.value); updateMode(c); }
    clearNotice();
  } catch (e) { notice(e.message); }
}
$('#keySave').onclick = async () => {
  const old = apiKey(), key = $('#apiKey').value.trim();
  store.set('apiKey', key);
  if (S.sess && key !== old) { // a session belongs to the key that created it
    const s = S.sess; S.sess = null; sessState();
    dropSession(s, s.key).catch(() => {});
  }
  $('#keySave').textContent = 'Saved';
  setTimeout(() => { $('#keySave').textContent = 'Save key'; }, 1500);
  await loadRuntimes(); probeAgent(); refreshFiles();
};
$('#apiKey').addEventListener('keydown', e => { if (e.key === 'Enter') { e.preventDefault(); $('#keySave').click(); } });

// ---------- files ----------
const F = { cwd: [] }; // percent-encoded path segments below /workspace
const dec = s => { try { return decodeURIComponent(s); } catch { return s; } };
const fsUrl = (segs, extra = '') => sessUrl(S.sess, `/fs?path=${segs.join('/')}${extra}`);
const fsMsg = t => { $('#fsMsg').textContent = t; };
async function refreshFiles() {
  $('#cwd').textContent = '/' + F.cwd.map(dec).join('/');
  const list = $('#fsList'), s = S.sess;
  if (!s) { list.replaceChildren(el('li', { class: 'note', text: 'No session yet: files live in the kernel session\'s /workspace. Run a Python cell or upload a file to start one.' })); return; }
  try {
    const v = await (await request(fsUrl(F.cwd), { headers: tokenHeader(s) })).json();
    if (s !== S.sess) return;
    list.replaceChildren(...v.entries.map(entry));
    if (!v.entries.length) list.append(el('li', { class: 'note', text: '(empty folder)' }));
    if (v.truncated) list.append(el('li', { class: 'note', text: '(listing truncated)' }));
  } catch (e) { fsMsg(e.message); }
}
function entry(e) {
  const seg = e.nameEncoded || encodeURIComponent(e.name), path = [...F.cwd, seg];
  const name = e.dir ? el('button', { type: 'button', class: 'fname', text: e.name + '/', 'aria-label': `Open folder ${e.name}`, onclick: () => { F.cwd = path; refreshFiles(); } })
    : el('span', { class: 'fname', text: e.name + (e.symlink ? ' →' : '') });
  return el('li', {}, name,
    e.dir ? null : el('span', { class: 'size', text: fmtSize(e.size) }),
    e.dir || e.symlink ? null : el('button', { type: 'button', text: 'Download', 'aria-label': `Download ${e.name}`, onclick: () => download(path, e.name) }),
    el('button', { type: 'button', text: 'Delete', 'aria-label': `Delete ${e.name}`, onclick: () => remove(path, e.name) }));
}
function dispositionName(h) {
  if (!h) return '';
  const star = /filename\*=UTF-8''([^;]+)/i.exec(h);
  if (star) return dec(star[1]);
  const plain = /filename="([^"]*)"/i.exec(h);
  return plain ? plain[1] : '';
}
// Downloads need the API key header: fetch → Blob → object URL → a temporary <a download>.
async function download(segs, fallback, extra = '') {
  const s = S.sess;
  if (!s) return;
  fsMsg(`Downloading ${fallback}…`);
  try {
    const res = await request(fsUrl(segs, extra), { headers: tokenHeader(s) });
    const blob = await res.blob();
    const url = URL.createObjectURL(blob);
    const a = el('a', { href: url, download: dispositionName(res.headers.get('Content-Disposition')) || fallback, hidden: true });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    fsMsg(`Downloaded ${a.download} (${fmtSize(blob.size)}).`);
  } catch (e) { fsMsg(e.message); }
}
async function remove(segs, name) {
  if (!confirm(`Delete ${name} from the workspace?`)) return;
  try { await request(fsUrl(segs), { method: 'DELETE', headers: tokenHeader(S.sess) }); fsMsg(`Deleted ${name}.`); }
  catch (e) { fsMsg(e.message); }
  refreshFiles();
}
async function upload(files) {
  let s;
  try { s = await withKernel(() => ensureSession(fsMsg)); } catch (e) { fsMsg(e.message); notice(e.message); return; }
  for (const f of files) {
    fsMsg(`Uploading ${f.name} (${fmtSize(f.size)})…`);
    try {
      const v = await (await request(fsUrl([...F.cwd, encodeURIComponent(f.name)]), { method: 'PUT', body: f, headers: tokenHeader(s) })).json();
      fsMsg(`Uploaded ${v.path} (${fmtSize(v.bytes)}).`);
    } catch (e) { fsMsg(e.message); break; }
  }
  refreshFiles();
}
$('#fsUploadBtn').onclick = () => $('#fsUpload').click();
$('#fsUpload').onchange = e => { const fs = [...e.target.files]; e.target.value = ''; if (fs.length) upload(fs); };
$('#fsRefresh').onclick = refreshFiles;
$('#fsUp').onclick = () => { F.cwd.pop(); refreshFiles(); };
$('#fsZip').onclick = () => S.sess ? download(F.cwd, (F.cwd.length ? dec(F.cwd[F.cwd.length - 1]) : 'workspace') + '.zip', '&format=zip') : fsMsg('No session yet.');

// ---------- chat ----------
const C = { mode: 'direct', model: '', hist: [], msgs: [], ctl: null, busy: false };
const TOOLS = [
  { type: 'function', function: { name: 'run_python', description: 'Run Python code in a persistent kernel (variables, imports and definitions survive between calls; working directory /workspace). Print what you need to see; matplotlib figures and a trailing DataFrame are shown to the user.', parameters: { type: 'object', properties: { code: { type: 'string', description: 'Python source to run' } }, required: ['code'] } } },
  { type: 'function', function: { name: 'run_shell', description: 'Run a bash command in the same sandbox and working directory (curl, wget, jq, git, ripgrep, unzip, file are available). Returns its output and real exit status; killed after 15 s.', parameters: { type: 'object', properties: { command: { type: 'string', description: 'bash command line' } }, required: ['command'] } } },
];
const SYSTEM = 'You are a helpful assistant with a sandboxed code-execution environment (isobox: gVisor, capped, Linux). Use run_python for computation and data work, run_shell for shell commands. Files are in /workspace, which the user sees in a file panel. Keep steps short (each is limited to 20 s). Answer concisely after using tools.';
const SHELL_TIMEOUT_S = 15, STEP_WALL_MS = 20000, RESULT_CAP = 16384;
async function probeAgent() {
  C.mode = 'direct';
  try {
    const r = await fetch('/v1/agent', { headers: authHeaders(), cache: 'no-store' });
    if (r.ok) { const v = await r.json(); if (v && v.enabled) { C.mode = 'server'; C.model = v.model || ''; } }
  } catch {}
  $('#chatMode').textContent = C.mode === 'server' ? `server agent${C.model ? ' · ' + C.model : ''}` : 'browser-direct';
  const cfg = $('#chatCfg');
  cfg.hidden = C.mode === 'server';
  if (C.mode === 'direct' && !store.get('chat.base')) cfg.open = true;
}
$('#aiBase').value = store.get('chat.base');
$('#aiModel').value = store.get('chat.model');
$('#aiKey').value = store.get('chat.key');
for (const [id, k] of [['aiBase', 'chat.base'], ['aiModel', 'chat.model'], ['aiKey', 'chat.key']])
  $('#' + id).addEventListener('input', e => store.set(k, e.target.value.trim()));
const log = $('#chatLog');
const stick = () => { log.scrollTop = log.scrollHeight; };
function chatMsg(cls, text) { const m = el('div', { class: 'msg ' + cls, text }); log.append(m); stick(); return m; }
function botText() {
  const node = document.createTextNode(''), m = el('div', { class: 'msg bot' }, node);
  log.append(m);
  return { m, add(t) { node.appendData(t); stick(); }, get text() { return node.data; } };
}
function toolBlock(name, args) {
  const b = { pre: el('pre', { class: 'args' }), badges: el('div', { class: 'badges' }), out: el('pre', { class: 'stream' }), arts: el('div', { class: 'arts' }) };
  b.head = el('div', { class: 'th', text: `Tool call: ${name || '…'}` });
  b.root = el('div', { class: 'tool', role: 'group', 'aria-label': `Tool call ${name}` }, b.head, b.pre, b.badges, b.out, b.arts);
  b.setArgs = (n, a) => {
    b.head.textContent = `Tool call: ${n}`;
    let shown = a;
    try { const j = JSON.parse(a); shown = typeof j.code === 'string' ? j.code : typeof j.command === 'string' ? '$ ' + j.command : typeof j.query === 'string' ? j.query : a; } catch {}
    b.pre.textContent = shown;
  };
  b.setArgs(name, args || '');
  log.append(b.root); stick();
  return b;
}
function toolResultText(run, stdout, stderr) {
  let t = `exit code: ${run.exitCode}` + (run.timedOut ? ' (timed out)' : '') + (run.oomKilled ? ' (out of memory)' : '');
  if (stdout) t += `\nstdout:\n${stdout}`;
  if (stderr) t += `\nstderr:\n${stderr}`;
  return t.length > RESULT_CAP ? t.slice(0, RESULT_CAP) + '\n[output truncated]' : t;
}
async function runTool(t, b) {
  let a;
  try { a = JSON.parse(t.args || '{}'); } catch (e) { return `error: the arguments are not valid JSON (${e.message})`; }
  let code;
  if (t.name === 'run_python' && typeof a.code === 'string') code = a.code;
  else if (t.name === 'run_shell' && typeof a.command === 'string') code = `__import__('_isobox').shell(${JSON.stringify(a.command)}, ${SHELL_TIMEOUT_S})`;
  else return `error: unknown tool or missing argument: ${t.name}`;
  badge(b.badges, 'running…', 'pending');
  const sink = makeSink(b.out);
  try {
    const r = await kernelStep({ code, limits: { wallTimeMs: STEP_WALL_MS } }, sink, C.ctl.signal, n => b.root.append(el('p', { class: 'note', text: n })));
    b.badges.replaceChildren();
    renderResult(r, { badges: b.badges, sink, arts: b.arts });
    return toolResultText(r.run, r.run.stdout, r.run.stderr);
  } catch (e) {
    b.badges.replaceChildren();
    if (e.name === 'AbortError') throw e;
    b.root.append(el('p', { class: 'err', text: e.message }));
    if (e.status === 410) throw new Error('The kernel ended during the chat; the next message starts a fresh one.');
    return `error: ${e.message}`;
  }
}
// One streamed chat completion; returns {content, calls}.
async function completion(cfg) {
  const headers = { 'Content-Type': 'application/json' };
  if (cfg.key) headers.Authorization = 'Bearer ' + cfg.key;
  const url = cfg.base.replace(/\/+$/, '') + '/chat/completions';
  const res = await request(url, { method: 'POST', key: '', headers, sse: true, signal: C.ctl.signal, what: 'Model request',
    body: JSON.stringify({ model: cfg.model, stream: true, tools: TOOLS, messages: [{ role: 'system', content: SYSTEM }, ...C.msgs] }) });
  let bot = null, content = '';
  const calls = [];
  const take = (delta) => {
    if (delta.content) { (bot = bot || botText()).add(delta.content); content += delta.content; }
    for (const tc of delta.tool_calls || []) {
      const i = tc.index ?? calls.length;
      const c = calls[i] = calls[i] || { id: '', name: '', args: '' };
      if (tc.id) c.id = tc.id;
      if (tc.function && tc.function.name) c.name += tc.function.name;
      if (tc.function && tc.function.arguments) c.args += tc.function.arguments;
      c.block ? c.block.setArgs(c.name, c.args) : (c.block = toolBlock(c.name, c.args));
      bot = null;
    }
  };
  if (!(res.headers.get('Content-Type') || '').includes('event-stream')) { // a server that ignores stream:true
    const j = await res.json(), m = (j.choices && j.choices[0] && j.choices[0].message) || {};
    take({ content: m.content, tool_calls: (m.tool_calls || []).map((t, index) => ({ index, ...t })) });
    return { content, calls };
  }
  await readSSE(res, (ev, data) => {
    if (data === '[DONE]') return;
    let j; try { j = JSON.parse(data); } catch { return; }
    if (j.error) throw new Error(`Model error: ${j.error.message || JSON.stringify(j.error)}`);
    const ch = j.choices && j.choices[0];
    if (ch && ch.delta) take(ch.delta);
  });
  return { content, calls };
}
async function chatDirect(text) {
  const cfg = { base: $('#aiBase').value.trim(), model: $('#aiModel').value.trim(), key: $('#aiKey').value.trim() };
  if (!cfg.base || !cfg.model) { $('#chatCfg').open = true; throw new Error('Set the model endpoint and model in "Model settings" first (no server-side agent is enabled here).'); }
  C.msgs.push({ role: 'user', content: text });
  let msg = null;
  try {
    for (let i = 0; i < 8; i++) {
      const { content, calls } = await completion(cfg);
      msg = { role: 'assistant', content: content || null };
      if (calls.length) msg.tool_calls = calls.map((c, k) => ({ id: c.id || `call_${i}_${k}`, type: 'function', function: { name: c.name, arguments: c.args } }));
      C.msgs.push(msg);
      if (!calls.length) return;
      for (const [k, c] of calls.entries()) {
        const out = await runTool(c, c.block);
        C.msgs.push({ role: 'tool', tool_call_id: msg.tool_calls[k].id, content: out });
      }
    }
    chatMsg('bot note', 'Stopped after 8 rounds of tool calls.');
  } finally { // the model expects an answer to every tool call, even when the turn broke off
    for (const tc of (msg && msg.tool_calls) || [])
      if (!C.msgs.some(m => m.role === 'tool' && m.tool_call_id === tc.id)) C.msgs.push({ role: 'tool', tool_call_id: tc.id, content: 'error: not run (stopped)' });
  }
}
async function chatServer(text) {
  C.hist.push({ role: 'user', content: text });
  let answer = '';
  await withKernel(async () => {
    const s = await ensureSession(t => chatMsg('bot note', t));
    const res = await request('/v1/agent', { method: 'POST', sse: true, signal: C.ctl.signal, json: { messages: C.hist, session: { id: s.id, token: s.token } } })
      .catch(e => { if (e.status === 410) markDead(s, e.detail); throw e; });
    let bot = null;
    const blocks = {};
    await readSSE(res, (ev, data) => {
      let d; try { d = JSON.parse(data); } catch { return; }
      if (ev === 'token') { (bot = bot || botText()).add(d.text || ''); answer += d.text || ''; }
      else if (ev === 'tool_call') {
        if (answer && !/\s$/.test(answer)) answer += '\n\n'; // text before and after a tool: two paragraphs
        blocks[d.id] = toolBlock(d.name, d.arguments); badge(blocks[d.id].badges, 'running…', 'pending'); bot = null; }
      else if (ev === 'tool_result') {
        const b = blocks[d.id] || (blocks[d.id] = toolBlock('?', ''));
        b.badges.replaceChildren();
        renderResult(d, { badges: b.badges, sink: makeSink(b.out), arts: b.arts });
      } else if (ev === 'done') {
        if (d.finishReason === 'max_iterations') chatMsg('bot note', `Stopped after ${d.iterations} iterations (the server's limit).`);
      } else if (ev === 'error') {
        if (d.code === 'kernel_dead') markDead(s, d.message);
        chatMsg('err', `Agent error — ${d.code}: ${d.message}` + (d.code === 'kernel_dead' ? ' The next message starts a fresh kernel.' : ''));
      }
    });
  });
  answer = answer.trim();
  if (answer) C.hist.push({ role: 'assistant', content: answer });
}
async function send() {
  const input = $('#chatInput'), text = input.value.trim();
  if (!text || C.busy) return;
  input.value = '';
  chatMsg('user', text);
  C.busy = true; C.ctl = new AbortController();
  $('#chatSend').disabled = true; $('#chatStop').hidden = false;
  try { await (C.mode === 'server' ? chatServer(text) : chatDirect(text)); }
  catch (e) { chatMsg('err', e.name === 'AbortError' ? 'Stopped.' : e.message); }
  finally {
    C.busy = false; $('#chatSend').disabled = false; $('#chatStop').hidden = true;
    refreshFiles();
  }
}
$('#chatSend').onclick = send;
$('#chatStop').onclick = () => C.ctl && C.ctl.abort();
$('#chatClear').onclick = () => { if (C.busy) C.ctl.abort(); C.hist = []; C.msgs = []; log.replaceChildren(); };
$('#chatInput').addEventListener('keydown', e => { if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); } });

// ---------- start ----------
$('#apiKey').value = apiKey();
addCell();
sessState();
refreshFiles();
loadRuntimes();
probeAgent();
