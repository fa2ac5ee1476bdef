// Browser test of isoboxd's web UI (GET /): Debian's headless Chromium driven by
// playwright-core. Usage: node tests/ui/notebook.test.mjs <daemon base URL>
// (or ISOBOX_UI_URL). The daemon must run with the API key ISOBOX_UI_KEY (default
// "ui-test-key") configured. Environment:
//   CHROMIUM            browser binary (default /usr/bin/chromium)
//   ISOBOX_UI_ARTIFACTS where the screenshots go (default target/ui-artifacts)
//   ISOBOX_UI_HTML      serve this file as GET / instead of the daemon's copy (for
//                       working on the page without rebuilding isoboxd)
// Exits 0 when every check passed; prints the failing check and exits 1 otherwise.
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const base = (process.argv[2] || process.env.ISOBOX_UI_URL || '').replace(/\/+$/, '');
if (!base) { console.error('usage: node notebook.test.mjs <daemon base URL>'); process.exit(2); }
const KEY = process.env.ISOBOX_UI_KEY || 'ui-test-key';
const here = path.dirname(fileURLToPath(import.meta.url));
const artifacts = process.env.ISOBOX_UI_ARTIFACTS || path.join(here, '..', '..', 'target', 'ui-artifacts');
const T = 20000; // per-step wait
const started = Date.now();
const step = name => console.log(`[${((Date.now() - started) / 1000).toFixed(1)}s] ${name}`);
// A hard ceiling, so a hang never outlives the Rust test that runs us.
setTimeout(() => { console.error('FAIL: the browser test took over 100 s'); process.exit(1); }, 100_000).unref();

// ---------- a fake OpenAI-compatible endpoint (browser-direct chat mode) ----------
const seen = []; // request bodies of POST /v1/chat/completions
const sseChunk = obj => `data: ${JSON.stringify(obj)}\n\n`;
const sleep = ms => new Promise(r => setTimeout(r, ms));
const cors = {
  'Access-Control-Allow-Origin': '*',
  'Access-Control-Allow-Headers': 'authorization, content-type',
  'Access-Control-Allow-Methods': 'POST, OPTIONS',
  'Access-Control-Expose-Headers': 'Retry-After',
};
const fake = http.createServer(async (req, res) => {
  if (req.method === 'OPTIONS') { res.writeHead(204, cors); res.end(); return; }
  if (req.method !== 'POST' || req.url !== '/v1/chat/completions') { res.writeHead(404, cors); res.end(); return; }
  let body = '';
  for await (const c of req) body += c;
  const n = seen.push({ auth: req.headers.authorization, body: JSON.parse(body) });
  if (n === 3) { // the third request: rate limited, to check how the page shows it
    res.writeHead(429, { ...cors, 'Content-Type': 'application/json', 'Retry-After': '7' });
    res.end(JSON.stringify({ error: { message: 'Rate limit reached for fake-model', type: 'rate_limit_exceeded' } }));
    return;
  }
  res.writeHead(200, { ...cors, 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  if (n === 1) { // a tool call, its arguments split over two chunks
    res.write(sseChunk({ choices: [{ index: 0, delta: { role: 'assistant', tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'run_python', arguments: '{"code":"print(' } }] } }] }));
    await sleep(50);
    res.write(sseChunk({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '6*7)"}' } }] } }] }));
    res.write(sseChunk({ choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] }));
  } else { // the answer, streamed slowly enough to see it grow
    for (const piece of ['The answer ', 'is ', '42.']) {
      res.write(sseChunk({ choices: [{ index: 0, delta: { content: piece } }] }));
      await sleep(piece === 'is ' ? 700 : 100);
    }
    res.write(sseChunk({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }));
  }
  res.end('data: [DONE]\n\n');
});
await new Promise(r => fake.listen(0, '127.0.0.1', r));
const fakeBase = `http://127.0.0.1:${fake.address().port}/v1`;

// With ISOBOX_UI_HTML, GET / answers that file (with the daemon's own headers).
async function overridePage(p) {
  if (!process.env.ISOBOX_UI_HTML) return;
  const html = fs.readFileSync(process.env.ISOBOX_UI_HTML);
  await p.route(base + '/', async route => route.fulfill({ response: await route.fetch(), body: html }));
}
// A full-page screenshot that includes the sandboxed (out-of-process) frames, which
// Chromium leaves blank in fullPage captures: make the viewport as tall as the page.
async function fullShot(p, file) {
  const size = p.viewportSize();
  const h = await p.evaluate(() => document.documentElement.scrollHeight);
  await p.setViewportSize({ width: size.width, height: Math.min(h, 16000) });
  await p.waitForTimeout(300);
  await p.screenshot({ path: file });
  await p.setViewportSize(size);
}

// ---------- browser ----------
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run',
    // A page served by route.fulfill has no address space, so Local Network Access would
    // refuse its requests to the fake model endpoint; the daemon's own page is loopback.
    ...(process.env.ISOBOX_UI_HTML ? ['--disable-features=LocalNetworkAccessChecks'] : [])],
});
let page, failed = false;
const requests = [], problems = [];
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  page = await context.newPage();
  page.on('request', r => requests.push(r.url()));
  page.on('pageerror', e => problems.push(`page error: ${e.message}`));
  page.on('console', m => {
    // The 401s this test provokes are logged as failed loads; anything else (a CSP
    // violation, an exception) is a problem.
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  await overridePage(page);

  // ---------- API key: the 401 first, then the key ----------
  step('load the page without a key');
  const resp = await page.goto(base + '/');
  assert.equal(resp.status(), 200);
  assert.match(resp.headers()['content-security-policy'] || '', /default-src 'none'/);
  const notice = page.locator('#notice');
  await notice.waitFor({ state: 'visible', timeout: T });
  const msg = await notice.textContent();
  assert.match(msg, /401/, msg);
  assert.match(msg, /unauthorized/, msg);
  assert.match(msg, /API key/, msg);
  step('enter the key');
  await page.fill('#apiKey', KEY);
  await page.click('#keySave');
  await notice.waitFor({ state: 'hidden', timeout: T });
  await page.waitForFunction(() => document.querySelector('.cell .rt').options.length > 1, null, { timeout: T });
  const opts = await page.$$eval('.cell .rt option', os => os.map(o => o.value));
  for (const r of ['python', 'javascript']) assert.ok(opts.includes(r), `runtime ${r} listed: ${opts}`);
  assert.equal(await page.evaluate(() => localStorage.getItem('isobox.apiKey')), KEY);

  step('the network box follows the server: egress is off here, so unchecked, disabled, and why');
  await page.locator('#netWhy').waitFor({ state: 'visible', timeout: T });
  assert.match(await page.locator('#netWhy').textContent(), /ISOBOX_EGRESS=off/);
  assert.equal(await page.locator('#net').isChecked(), false);
  assert.equal(await page.locator('#net').isDisabled(), true);

  const cell = i => page.locator('.cell').nth(i);
  const runShiftEnter = async (i, code) => {
    await cell(i).locator('.cm-content').fill(code);
    await cell(i).locator('.cm-content').press('Shift+Enter');
  };
  const exitBadge = i => cell(i).locator('.badge.exit');
  const waitDone = async i => { await exitBadge(i).waitFor({ timeout: T }); return (await exitBadge(i).textContent()).trim(); };
  const output = async i => (await cell(i).locator('pre.stream').textContent()) || '';

  // ---------- streaming ----------
  step('a python cell streams its output before the run ends');
  assert.equal((await cell(0).locator('.mode').textContent()).trim(), 'kernel');
  await runShiftEnter(0, 'print("first line")\nimport time\ntime.sleep(1.5)\nprint("second line")');
  // One atomic look: the first line is there, the second and the exit code are not yet.
  await page.waitForFunction(() => {
    const c = document.querySelectorAll('.cell')[0];
    const out = c.querySelector('pre.stream').textContent;
    if (c.querySelector('.badge.exit') || out.includes('second line')) throw new Error('the run finished before its first line was shown');
    return out.includes('first line');
  }, null, { timeout: T, polling: 25 });
  assert.equal(await waitDone(0), 'exit code 0');
  assert.match(await output(0), /first line\n.*second line/s);
  const dur = (await cell(0).locator('.badge.dur').textContent()).trim();
  assert.match(dur, /^(1\.[5-9]\d|[2-9]\.\d\d) s$/, `duration badge: ${dur}`);
  assert.match(await page.textContent('#sessState'), /ready/);
  // Shift+Enter moved the focus to a new cell.
  assert.equal(await page.locator('.cell').count(), 2);
  assert.ok(await cell(1).locator('.cm-content').evaluate(t => t === document.activeElement), 'focus in the next cell');

  step('kernel state persists from cell to cell');
  await runShiftEnter(1, 'answer = 6 * 7\nopen("note.txt", "w").write(str(answer))');
  assert.equal(await waitDone(1), 'exit code 0');
  await runShiftEnter(2, 'print("answer is", answer)');
  assert.equal(await waitDone(2), 'exit code 0');
  assert.match(await output(2), /answer is 42/);
  // The file panel refreshed after the run: note.txt written by the kernel is listed.
  await page.locator('#fsList li', { hasText: 'note.txt' }).waitFor({ timeout: T });

  step('an exception shows exit code 1 and the traceback');
  await runShiftEnter(3, 'def f():\n    return 1 / 0\nf()');
  assert.equal(await waitDone(3), 'exit code 1');
  assert.ok(await exitBadge(3).evaluate(b => b.classList.contains('bad')));
  const tb = await output(3);
  assert.match(tb, /Traceback \(most recent call last\)/);
  assert.match(tb, /ZeroDivisionError: division by zero/);
  assert.equal(await cell(3).locator('pre.stream .stderr').count(), 1, 'the traceback is styled as stderr');

  step('a matplotlib figure renders as an image');
  await runShiftEnter(4, 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")');
  assert.equal(await waitDone(4), 'exit code 0');
  const img = cell(4).locator('.arts img');
  await img.waitFor({ timeout: T });
  assert.match(await img.getAttribute('src'), /^data:image\/png;base64,iVBOR/);
  await page.waitForFunction(i => { const im = document.querySelectorAll('.cell')[i].querySelector('.arts img'); return im.complete && im.naturalWidth > 0; }, 4, { timeout: T });
  const w = await img.evaluate(im => im.naturalWidth);
  assert.ok(w > 100, `figure width ${w}`);

  step('a DataFrame renders in a sandboxed iframe');
  await runShiftEnter(5, 'import pandas as pd\npd.DataFrame({"name": ["a", "b"], "value": [1, 2]})');
  assert.equal(await waitDone(5), 'exit code 0');
  const frame = cell(5).locator('.arts iframe');
  await frame.waitFor({ timeout: T });
  assert.equal(await frame.getAttribute('sandbox'), '', 'sandbox="" (no allow-scripts, no allow-same-origin)');
  assert.match(await frame.evaluate(f => f.srcdoc), /<table/);
  const inner = await frame.elementHandle().then(h => h.contentFrame());
  await inner.waitForSelector('table', { timeout: T });
  assert.match(await inner.textContent('table'), /value/);

  // ---------- files ----------
  step('upload a file, see it listed, download it and compare bytes');
  const bytes = Buffer.alloc(70000);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 31 + (i >> 8)) & 255; // binary, not UTF-8
  await page.setInputFiles('#fsUpload', { name: 'upload test.bin', mimeType: 'application/octet-stream', buffer: bytes });
  const row = page.locator('#fsList li', { hasText: 'upload test.bin' });
  await row.waitFor({ timeout: T });
  assert.match(await row.textContent(), /68\.4 KiB/);
  let [dl] = await Promise.all([page.waitForEvent('download', { timeout: T }), row.getByRole('button', { name: 'Download upload test.bin' }).click()]);
  assert.equal(dl.suggestedFilename(), 'upload test.bin');
  const got = fs.readFileSync(await dl.path());
  assert.ok(got.equals(bytes), `downloaded ${got.length} bytes, not the ${bytes.length} uploaded`);
  step('the workspace downloads as a zip');
  [dl] = await Promise.all([page.waitForEvent('download', { timeout: T }), page.click('#fsZip')]);
  assert.equal(dl.suggestedFilename(), 'workspace.zip');
  const zip = fs.readFileSync(await dl.path());
  assert.equal(zip.subarray(0, 4).toString('latin1'), 'PK\x03\x04', 'a zip archive');
  assert.ok(zip.includes(Buffer.from('upload test.bin')), 'the zip holds the uploaded file');
  // The kernel sees the uploaded file.
  await runShiftEnter(6, 'print(len(open("upload test.bin", "rb").read()))');
  assert.equal(await waitDone(6), 'exit code 0');
  assert.match(await output(6), /^70000\n$/);

  // ---------- one-shot ----------
  step('a javascript cell runs one-shot');
  await cell(7).locator('select.rt').selectOption('javascript');
  assert.equal((await cell(7).locator('.mode').textContent()).trim(), 'one-shot');
  await runShiftEnter(7, 'console.log(6*7)');
  assert.equal(await waitDone(7), 'exit code 0');
  assert.equal(await output(7), '42\n');
  // The next cell inherits the runtime; switch it back to python.
  await cell(8).locator('select.rt').selectOption('python');

  // ---------- the code editor ----------
  step('the cells are a code editor: highlighting, brackets, indentation per language');
  await editorChecks(page, cell, waitDone, output);

  // ---------- timeout: the step ends the kernel; the next run starts a fresh one ----------
  step('a step past its time limit shows the timeout badge');
  await cell(8).locator('input.wall').fill('1');
  await runShiftEnter(8, 'import time\nprint("sleeping")\ntime.sleep(10)');
  assert.equal(await waitDone(8), 'exit code 137');
  await cell(8).locator('.badge.timeout').waitFor({ timeout: T });
  assert.match(await page.textContent('#sessState'), /ended/);
  await runShiftEnter(9, 'import os\nprint("fresh kernel", "answer" in globals(), os.path.getsize("upload test.bin"))');
  assert.equal(await waitDone(9), 'exit code 0');
  assert.match(await output(9), /^fresh kernel False 70000\n$/, 'variables are gone, files carried over');
  assert.match(await cell(9).locator('.note').first().textContent(), /fresh kernel.*carried over/);
  await page.locator('#fsList li', { hasText: 'upload test.bin' }).waitFor({ timeout: T });
  assert.match(await page.textContent('#sessState'), /ready/);

  // ---------- keyboard ----------
  step('every control is reachable with Tab');
  await page.focus('#apiKey');
  const reached = new Set();
  for (let i = 0; i < 120; i++) {
    await page.keyboard.press('Tab');
    const id = await page.evaluate(() => { const a = document.activeElement; return a.id || a.className || a.tagName; });
    reached.add(id);
    // In a cell editor Tab indents; Esc first leaves it.
    if (String(id).includes('cm-content')) { await page.keyboard.press('Escape'); }
  }
  for (const want of ['keySave', 'sessNew', 'sessEnd', 'run primary', 'addCell', 'fsUploadBtn', 'fsZip', 'chatInput', 'chatSend'])
    assert.ok(reached.has(want), `Tab reaches ${want}: ${[...reached].join(', ')}`);
  const ring = await page.evaluate(() => { document.querySelector('#chatSend').focus(); return getComputedStyle(document.activeElement).outlineStyle; });
  assert.notEqual(ring, 'none', 'visible focus');

  // ---------- chat, browser-direct ----------
  step('browser-direct chat: tool call, kernel run, tool result, streamed answer');
  assert.match(await page.textContent('#chatMode'), /browser-direct/);
  await page.fill('#aiBase', fakeBase);
  await page.fill('#aiModel', 'fake-model');
  await page.fill('#aiKey', 'sk-fake');
  await page.fill('#chatInput', 'What is 6*7? Use Python.');
  await page.press('#chatInput', 'Enter');
  const tool = page.locator('#chatLog .tool').first();
  await tool.waitFor({ timeout: T });
  await page.waitForFunction(() => document.querySelector('#chatLog .tool .th').textContent.includes('run_python'), null, { timeout: T });
  await page.waitForFunction(() => document.querySelector('#chatLog .tool pre.args').textContent === 'print(6*7)', null, { timeout: T });
  await tool.locator('.badge.exit').waitFor({ timeout: T });
  assert.equal((await tool.locator('pre.stream').textContent()), '42\n');
  // The answer grows while it streams: "The answer is" shows before "42.".
  await page.waitForFunction(() => {
    const b = [...document.querySelectorAll('#chatLog .msg.bot')].pop();
    if (b && b.textContent.includes('42.')) throw new Error('the answer appeared all at once');
    return b && b.textContent.startsWith('The answer is');
  }, null, { timeout: T, polling: 25 });
  await page.waitForFunction(() => [...document.querySelectorAll('#chatLog .msg.bot')].pop().textContent === 'The answer is 42.', null, { timeout: T });
  await page.locator('#chatSend:not([disabled])').waitFor({ timeout: T });
  assert.equal(seen.length, 2, 'two model requests');
  assert.equal(seen[0].auth, 'Bearer sk-fake');
  assert.equal(seen[0].body.model, 'fake-model');
  assert.equal(seen[0].body.stream, true);
  assert.deepEqual(seen[0].body.tools.map(t => t.function.name), ['run_python', 'run_shell']);
  const msgs = seen[1].body.messages;
  const call = msgs.find(m => m.role === 'assistant' && m.tool_calls);
  assert.equal(call.tool_calls[0].id, 'call_1');
  assert.equal(call.tool_calls[0].function.arguments, '{"code":"print(6*7)"}');
  const result = msgs.find(m => m.role === 'tool');
  assert.ok(result, 'a tool message went back to the model');
  assert.equal(result.tool_call_id, 'call_1');
  assert.match(result.content, /42/);
  assert.match(result.content, /exit code: 0/);
  assert.equal(await page.evaluate(() => localStorage.getItem('isobox.chat.key')), 'sk-fake', 'the model key stays in the browser');

  step('a 429 from the model endpoint is a readable message');
  await page.fill('#chatInput', 'again');
  await page.click('#chatSend');
  const err = page.locator('#chatLog .msg.err').last();
  await err.waitFor({ timeout: T });
  const etext = await err.textContent();
  assert.match(etext, /429 Too Many Requests/, etext);
  assert.match(etext, /Rate limit reached/, etext);
  assert.match(etext, /Retry-After: 7/, etext);

  // ---------- screenshots, narrow screen ----------
  step('screenshots and a 390 px wide viewport');
  fs.mkdirSync(artifacts, { recursive: true });
  await fullShot(page, path.join(artifacts, 'notebook.png'));
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(100);
  const widths = await page.evaluate(() => ({ doc: document.documentElement.scrollWidth, body: document.body.scrollWidth, view: document.documentElement.clientWidth }));
  assert.ok(widths.doc <= widths.view && widths.body <= widths.view, `no horizontal scroll: ${JSON.stringify(widths)}`);
  const run = cell(0).locator('button.run');
  await run.scrollIntoViewIfNeeded();
  assert.ok(await run.isVisible(), 'Run is visible');
  const box = await run.boundingBox();
  assert.ok(box && box.x >= 0 && box.x + box.width <= 390, `Run inside the viewport: ${JSON.stringify(box)}`);
  const panes = await page.evaluate(() => [...document.querySelectorAll('main > *')].map(e => e.getBoundingClientRect()).map(r => [r.left, r.top]));
  assert.ok(panes[1][1] > panes[0][1] && Math.abs(panes[1][0] - panes[0][0]) < 2, `panes stack: ${JSON.stringify(panes)}`);
  await fullShot(page, path.join(artifacts, 'notebook-narrow.png'));
  await page.setViewportSize({ width: 1280, height: 900 });

  // ---------- end the session (frees the kernel) ----------
  step('end the session');
  await page.click('#sessEnd');
  await page.waitForFunction(() => /not started/.test(document.querySelector('#sessState').textContent), null, { timeout: T });

  // ---------- chat through the server-side agent (its events mocked) ----------
  step('server-agent chat: the mode probe, streamed tokens, tool call and result, kernel_dead');
  const agentBodies = [];
  const page2 = await context.newPage();
  page2.on('request', r => requests.push(r.url()));
  page2.on('pageerror', e => problems.push(`page error: ${e.message}`));
  await overridePage(page2);
  const ev = (name, data) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
  const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
  await page2.route(base + '/v1/agent', async route => {
    const r = route.request();
    if (r.method() === 'GET') return route.fulfill({ json: { enabled: true, model: 'mock-model' } });
    agentBodies.push({ body: r.postDataJSON(), key: r.headers()['x-api-key'] });
    const body = agentBodies.length === 1
      ? ev('token', { text: 'Let me check. ' }) +
        ev('tool_call', { id: 't1', name: 'run_shell', arguments: '{"command":"echo 42"}' }) +
        ev('tool_result', { id: 't1', stdout: '42\n', stderr: '', exitCode: 0, truncated: false, durationMs: 12, artifacts: [{ type: 'image/png', dataB64: PNG }] }) +
        ev('token', { text: 'It is 42.' }) + ev('done', { finishReason: 'stop', iterations: 2 })
      : ev('error', { code: 'kernel_dead', message: 'the kernel ended: a step ran past its wall time' });
    return route.fulfill({ status: 200, headers: { 'Content-Type': 'text/event-stream' }, body });
  });
  await page2.goto(base + '/');
  await page2.waitForFunction(() => /server agent · mock-model/.test(document.querySelector('#chatMode').textContent), null, { timeout: T });
  assert.ok(await page2.locator('#chatCfg').isHidden(), 'no model settings in server mode');
  await page2.fill('#chatInput', 'echo 42 please');
  await page2.press('#chatInput', 'Enter');
  const tool2 = page2.locator('#chatLog .tool');
  await tool2.locator('.badge.exit').waitFor({ timeout: T });
  assert.match(await tool2.locator('.th').textContent(), /run_shell/);
  assert.equal(await tool2.locator('pre.args').textContent(), '$ echo 42');
  assert.equal(await tool2.locator('pre.stream').textContent(), '42\n');
  assert.equal((await tool2.locator('.badge.exit').textContent()).trim(), 'exit code 0');
  assert.equal(await tool2.locator('.arts img').count(), 1);
  await page2.waitForFunction(() => [...document.querySelectorAll('#chatLog .msg.bot')].map(m => m.textContent).join('|') === 'Let me check. |It is 42.', null, { timeout: T });
  const a1 = agentBodies[0];
  assert.equal(a1.key, KEY, 'POST /v1/agent carries the API key');
  assert.deepEqual(a1.body.messages, [{ role: 'user', content: 'echo 42 please' }]);
  assert.match(a1.body.session.id, /^[0-9a-f]{32}$/);
  assert.ok(a1.body.session.token.length >= 40, 'the session token');
  await page2.locator('#chatSend:not([disabled])').waitFor({ timeout: T });
  await page2.fill('#chatInput', 'and again');
  await page2.click('#chatSend');
  await page2.locator('#chatLog .msg.err', { hasText: 'kernel_dead' }).waitFor({ timeout: T });
  assert.deepEqual(agentBodies[1].body.messages.map(m => m.content), ['echo 42 please', 'Let me check. It is 42.', 'and again']);
  await page2.waitForFunction(() => /ended/.test(document.querySelector('#sessState').textContent), null, { timeout: T });
  await page2.click('#sessEnd');
  await page2.waitForFunction(() => /not started/.test(document.querySelector('#sessState').textContent), null, { timeout: T });
  await page2.close();

  const foreign = requests.filter(u => !/^(http:\/\/127\.0\.0\.1[:/]|data:|blob:|about:)/.test(u));
  assert.deepEqual(foreign, [], 'every request goes to 127.0.0.1');
  assert.deepEqual(problems, [], 'no page errors or CSP violations');
  step('all checks passed');
} catch (e) {
  failed = true;
  console.error('FAIL:', e && e.stack || e);
  if (problems.length) console.error('page problems:', problems);
  if (page) {
    try {
      fs.mkdirSync(artifacts, { recursive: true });
      await page.screenshot({ path: path.join(artifacts, 'failure.png'), fullPage: true });
      console.error(`screenshot of the failure: ${path.join(artifacts, 'failure.png')}`);
    } catch {}
  }
} finally {
  await browser.close().catch(() => {});
  fake.close();
}
process.exit(failed ? 1 : 0);

// The notebook's editor (CodeMirror 6, /ui/editor.js), typed into key by key as a
// person would: a cell added at the end and deleted again, so the cells above keep
// their numbers.
async function editorChecks(page, cell, waitDone, output) {
  const n = await page.locator('.cell').count();
  await page.click('#addCell');
  const c = cell(n), ed = c.locator('.cm-content');
  await ed.waitFor({ timeout: T });
  assert.ok(await ed.evaluate(e => e === document.activeElement), 'a new cell has the focus');
  assert.equal(await ed.getAttribute('aria-label'), `Code of cell ${n + 1}`);
  assert.equal(await c.locator('select.rt').inputValue(), 'python');
  const doc = () => c.evaluate(el => IsoboxEditor.find(el.querySelector('.cm-content')).state.doc.toString());

  // Python: after a ':' Enter indents four spaces; a bracket typed is closed, and the
  // closing one typed over; Backspace at the indentation removes one level.
  await page.keyboard.type('for i in range(3):');
  await page.keyboard.press('Enter');
  await page.keyboard.type('print(i * 2)');
  assert.equal(await doc(), 'for i in range(3):\n    print(i * 2)');
  await page.keyboard.press('Enter');
  await page.keyboard.press('Backspace');
  await page.keyboard.type('print("done")');
  assert.equal(await doc(), 'for i in range(3):\n    print(i * 2)\nprint("done")');

  // Highlighting: `for` in the keyword colour, the string in the string colour, both
  // the page's own (--hl-*), different from plain text.
  const colours = await c.evaluate(el => {
    const probe = v => { const s = document.createElement('span'); s.style.color = `var(${v})`; el.append(s); const c = getComputedStyle(s).color; s.remove(); return c; };
    const of = text => { const s = [...el.querySelectorAll('.cm-line span')].find(x => x.textContent === text); return s ? getComputedStyle(s).color : null; };
    return { kw: of('for'), str: of('"done"'), wantKw: probe('--hl-kw'), wantStr: probe('--hl-str'), text: getComputedStyle(el.querySelector('.cm-line')).color };
  });
  assert.equal(colours.kw, colours.wantKw, `keyword colour: ${JSON.stringify(colours)}`);
  assert.equal(colours.str, colours.wantStr, `string colour: ${JSON.stringify(colours)}`);
  assert.notEqual(colours.kw, colours.text);

  // Bracket matching: the cursor right after `(` of `range(` marks it and its partner.
  await c.evaluate(el => { const v = IsoboxEditor.find(el.querySelector('.cm-content')); v.dispatch({ selection: { anchor: 'for i in range('.length } }); });
  await c.locator('.cm-matchingBracket').first().waitFor({ timeout: T });
  assert.equal(await c.locator('.cm-matchingBracket').count(), 2, 'the bracket and its partner');

  // Tab indents the line, Shift+Tab takes it back; Escape then Tab leaves the editor.
  await page.keyboard.press('Tab');
  assert.equal((await doc()).split('\n')[0], '    for i in range(3):');
  await page.keyboard.press('Shift+Tab');
  assert.equal((await doc()).split('\n')[0], 'for i in range(3):');
  await page.keyboard.press('Escape');
  await page.keyboard.press('Tab');
  assert.ok(!(await ed.evaluate(e => e === document.activeElement)), 'Escape then Tab leaves the editor');
  assert.equal((await doc()).split('\n')[0], 'for i in range(3):', 'and does not indent');

  // What was typed runs as typed.
  await ed.focus();
  await page.keyboard.press('Control+Enter');
  assert.equal(await waitDone(n), 'exit code 0');
  assert.equal(await output(n), '0\n2\n4\ndone\n');

  // JavaScript: two spaces, and Enter between braces opens the block.
  await c.locator('select.rt').selectOption('javascript');
  await ed.focus();
  await page.keyboard.press('Control+a');
  await page.keyboard.press('Delete');
  await page.keyboard.type('for (const x of [1, 2]) {');
  await page.keyboard.press('Enter');
  await page.keyboard.type('console.log(x);');
  assert.equal(await doc(), 'for (const x of [1, 2]) {\n  console.log(x);\n}');
  assert.ok(await c.locator('.cm-line span', { hasText: /^const$/ }).count() > 0, 'javascript is highlighted as javascript');
  await page.keyboard.press('Shift+Enter');
  assert.equal(await waitDone(n), 'exit code 0');
  assert.equal(await output(n), '1\n2\n');
  assert.ok(await cell(n + 1).locator('.cm-content').evaluate(e => e === document.activeElement), 'Shift+Enter moved on');

  // Go: a tab per level, as gofmt writes it.
  await cell(n + 1).locator('select.rt').selectOption('go');
  await cell(n + 1).locator('.cm-content').focus();
  await page.keyboard.type('func f() {');
  await page.keyboard.press('Enter');
  await page.keyboard.type('return');
  assert.equal(await cell(n + 1).evaluate(el => IsoboxEditor.find(el.querySelector('.cm-content')).state.doc.toString()), 'func f() {\n\treturn\n}');

  for (const i of [n + 1, n]) await cell(i).locator('button.del').click();
  assert.equal(await page.locator('.cell').count(), n);
}
