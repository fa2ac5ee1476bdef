// Browser test of the chat pane in server-agent mode, against isoboxd's real agent:
// Debian's headless Chromium driven by playwright-core. Usage:
//   node tests/ui/agent.test.mjs <daemon base URL>     (or ISOBOX_UI_URL)
// tests/ui.rs (test_chat_with_the_real_server_agent) starts the daemon with the API key
// ISOBOX_UI_KEY and its agent on (ISOBOX_AI_*), the agent's upstream a scripted fake
// model that answers, in order (this script expects exactly that):
//   1. "Let me compute that in Python." + run_python: a matplotlib figure,
//      answer = 6 * 7, a file agent-note.txt, print("six times seven is", answer)
//   2. run_shell "echo from-shell; exit 3"
//   3. "The answer is 42; the shell step exited with code 3.", a word per delta
//   4. HTTP 500 whose body echoes the Authorization header it got (the model key)
// and afterwards checks what the fake model received. Environment:
//   ISOBOX_UI_KEY       the daemon's API key (default "ui-test-key")
//   ISOBOX_UI_MODEL     the model name the page should announce
//   ISOBOX_UI_SECRET    the model key: it must be in no response the browser receives
//   CHROMIUM            browser binary (default /usr/bin/chromium)
//   ISOBOX_UI_ARTIFACTS where the screenshots go (default target/ui-artifacts)
//   ISOBOX_UI_HTML      serve this file as GET / instead of the daemon's copy
// Prints "key scan: N responses, B bytes, H hits"; exits 0 when every check passed,
// prints the failing check and exits 1 otherwise.
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const base = (process.argv[2] || process.env.ISOBOX_UI_URL || '').replace(/\/+$/, '');
if (!base) { console.error('usage: node agent.test.mjs <daemon base URL>'); process.exit(2); }
const KEY = process.env.ISOBOX_UI_KEY || 'ui-test-key';
const MODEL = process.env.ISOBOX_UI_MODEL || 'fake-agent-model';
const SECRET = process.env.ISOBOX_UI_SECRET;
if (!SECRET) { console.error('ISOBOX_UI_SECRET (the model key to look for) is required'); process.exit(2); }
const here = path.dirname(fileURLToPath(import.meta.url));
const artifacts = process.env.ISOBOX_UI_ARTIFACTS || path.join(here, '..', '..', 'target', 'ui-artifacts');
const T = 20000; // per-step wait
const started = Date.now();
const step = name => console.log(`[${((Date.now() - started) / 1000).toFixed(1)}s] ${name}`);
setTimeout(() => { console.error('FAIL: the agent browser test took over 60 s'); process.exit(1); }, 60_000).unref();

// What the user types, and what the scripted model says (tests/ui.rs has the same).
const ASK1 = 'What is 6*7? Use Python, then try the shell.';
const ASK2 = 'And once more?';
const FIRST = 'Let me compute that in Python.';
const ANSWER = 'The answer is 42; the shell step exited with code 3.';
const PY_CODE = 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nanswer = 6 * 7\n' +
  'open("agent-note.txt", "w").write(str(answer))\nprint("six times seven is", answer)';

async function overridePage(p) {
  if (!process.env.ISOBOX_UI_HTML) return;
  const html = fs.readFileSync(process.env.ISOBOX_UI_HTML);
  await p.route(base + '/', async route => route.fulfill({ response: await route.fetch(), body: html }));
}
// A screenshot of the whole page (the viewport as tall as the page; see notebook.test.mjs).
async function fullShot(p, file) {
  const size = p.viewportSize();
  const h = await p.evaluate(() => document.documentElement.scrollHeight);
  await p.setViewportSize({ width: size.width, height: Math.min(h, 16000) });
  await p.waitForTimeout(300);
  await p.screenshot({ path: file });
  await p.setViewportSize(size);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run'],
});
let page, failed = false;
const requests = [], problems = [];
const agentPosts = []; // {body, key} of every POST /v1/agent
const received = []; // promises of {url, status, text} of every daemon response
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  page.on('request', r => {
    requests.push(r.url());
    if (r.method() === 'POST' && r.url() === base + '/v1/agent') agentPosts.push({ body: r.postDataJSON(), key: r.headers()['x-api-key'] });
  });
  // Every response from the daemon, headers and body (an SSE stream's once it ended).
  page.on('response', r => {
    if (!r.url().startsWith(base + '/')) return;
    const head = `${r.status()} ${JSON.stringify(r.headers())}\n`;
    received.push(r.body().then(b => ({ url: r.url(), method: r.request().method(), text: head + b.toString('utf8') }),
      e => ({ url: r.url(), method: r.request().method(), text: head, error: e.message })));
  });
  page.on('pageerror', e => problems.push(`page error: ${e.message}`));
  page.on('console', m => {
    // The 401 before the key is entered is logged as a failed load; anything else is a problem.
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  await overridePage(page);

  step('load the page, enter the API key');
  assert.equal((await page.goto(base + '/')).status(), 200);
  await page.locator('#notice').waitFor({ state: 'visible', timeout: T });
  assert.match(await page.textContent('#notice'), /401/);
  await page.fill('#apiKey', KEY);
  await page.click('#keySave');
  await page.locator('#notice').waitFor({ state: 'hidden', timeout: T });

  step('the chat announces the server agent and its model');
  await page.waitForFunction(m => document.querySelector('#chatMode').textContent === `server agent · ${m}`, MODEL, { timeout: T });
  assert.ok(await page.locator('#chatCfg').isHidden(), 'no model settings in server mode');

  step('send a message; the agent runs Python and the shell in the page\'s kernel');
  await page.fill('#chatInput', ASK1);
  await page.press('#chatInput', 'Enter');
  // The final answer grows while it streams: part of it shows before all of it.
  await page.waitForFunction(([first, answer]) => {
    const b = [...document.querySelectorAll('#chatLog .msg.bot')].pop();
    const t = b ? b.textContent : '';
    if (t === answer) throw new Error('the answer appeared all at once');
    return t !== first && t.startsWith('The answer is') && answer.startsWith(t);
  }, [FIRST, ANSWER], { timeout: 40000, polling: 25 });
  await page.waitForFunction(a => [...document.querySelectorAll('#chatLog .msg.bot')].pop().textContent === a, ANSWER, { timeout: T });
  await page.locator('#chatSend:not([disabled])').waitFor({ timeout: T });
  assert.ok(await page.locator('#chatStop').isHidden(), 'Stop is hidden again');

  step('what the user sees: text, both tool calls with their results, the answer');
  const kinds = await page.$$eval('#chatLog > *', es => es.map(e => e.className));
  assert.deepEqual(kinds, ['msg user', 'msg bot', 'tool', 'tool', 'msg bot'], 'the conversation, in order');
  assert.deepEqual(await page.$$eval('#chatLog .msg.bot', es => es.map(e => e.textContent)), [FIRST, ANSWER]);
  assert.equal(await page.textContent('#chatLog .msg.user'), ASK1);
  const py = page.locator('#chatLog .tool').nth(0), sh = page.locator('#chatLog .tool').nth(1);
  assert.equal(await py.locator('.th').textContent(), 'Tool call: run_python');
  assert.equal(await py.locator('pre.args').textContent(), PY_CODE);
  assert.equal(await py.locator('pre.stream').textContent(), 'six times seven is 42\n');
  assert.equal((await py.locator('.badge.exit').textContent()).trim(), 'exit code 0');
  assert.ok(await py.locator('.badge.exit').evaluate(b => b.classList.contains('ok')));
  assert.equal(await py.locator('.badge.dur').count(), 1, 'the step\'s duration is shown');
  const img = py.locator('.arts img');
  assert.equal(await img.count(), 1, 'the figure from tool_result is shown');
  assert.match(await img.getAttribute('src'), /^data:image\/png;base64,iVBOR/);
  await img.evaluate(im => im.complete || new Promise(r => { im.onload = im.onerror = r; }));
  const w = await img.evaluate(im => im.naturalWidth);
  assert.ok(w > 100, `figure width ${w}`);
  assert.equal(await sh.locator('.th').textContent(), 'Tool call: run_shell');
  assert.equal(await sh.locator('pre.args').textContent(), '$ echo from-shell; exit 3');
  assert.equal(await sh.locator('pre.stream').textContent(), 'from-shell\n');
  assert.equal((await sh.locator('.badge.exit').textContent()).trim(), 'exit code 3');
  assert.ok(await sh.locator('.badge.exit').evaluate(b => b.classList.contains('bad')), 'exit code 3 is marked bad');
  assert.equal(await sh.locator('.arts > *').count(), 0);
  assert.equal(await page.locator('#chatLog .badge.pending').count(), 0, 'no tool left "running…"');
  assert.equal(await page.locator('#chatLog .msg.err, #chatLog .note').count(), 0, 'no error, no note');

  step('the request the page sent, the kernel it used');
  assert.equal(agentPosts.length, 1);
  const a1 = agentPosts[0];
  assert.equal(a1.key, KEY, 'POST /v1/agent carries the API key');
  assert.deepEqual(Object.keys(a1.body).sort(), ['messages', 'session']);
  assert.deepEqual(a1.body.messages, [{ role: 'user', content: ASK1 }]);
  assert.match(a1.body.session.id, /^[0-9a-f]{32}$/);
  assert.ok(a1.body.session.token.length >= 40, 'the session token');
  assert.match(await page.textContent('#sessState'), new RegExp(`ready .*session ${a1.body.session.id.slice(0, 8)}`));
  // The file the tool wrote is in the file panel (refreshed when the answer ended).
  await page.locator('#fsList li', { hasText: 'agent-note.txt' }).waitFor({ timeout: T });

  step('a second message: the upstream fails; the error is readable and the key redacted');
  await page.fill('#chatInput', ASK2);
  await page.press('#chatInput', 'Enter');
  const err = page.locator('#chatLog .msg.err');
  await err.waitFor({ timeout: T });
  await page.locator('#chatSend:not([disabled])').waitFor({ timeout: T });
  const etext = await err.textContent();
  assert.match(etext, /^Agent error — upstream_error: /, etext);
  assert.match(etext, /500/, etext);
  assert.match(etext, /upstream overloaded/, etext);
  assert.match(etext, /\[redacted\]/, etext);
  assert.ok(!etext.includes(SECRET), 'the model key is not shown');
  assert.equal(await page.locator('#chatLog .msg.err').count(), 1, 'one error message');
  assert.equal(agentPosts.length, 2);
  const hist = agentPosts[1].body.messages;
  assert.deepEqual(hist.map(m => m.role), ['user', 'assistant', 'user']);
  assert.equal(hist[0].content, ASK1);
  assert.ok(hist[1].content.startsWith(FIRST) && hist[1].content.endsWith(ANSWER), `the answer kept: ${hist[1].content}`);
  assert.equal(hist[2].content, ASK2);
  assert.equal(agentPosts[1].body.session.id, a1.body.session.id, 'the same kernel session');
  assert.match(await page.textContent('#sessState'), /ready/, 'an upstream error leaves the kernel alone');

  step('the agent\'s variables are in the notebook\'s kernel');
  const cell = page.locator('.cell').nth(0);
  await cell.locator('.cm-content').fill('print("answer is", answer)');
  await cell.locator('.cm-content').press('Control+Enter');
  await cell.locator('.badge.exit').waitFor({ timeout: T });
  assert.equal((await cell.locator('.badge.exit').textContent()).trim(), 'exit code 0');
  assert.equal(await cell.locator('pre.stream').textContent(), 'answer is 42\n');

  step('screenshot (the whole conversation: the chat log unscrolled for it)');
  fs.mkdirSync(artifacts, { recursive: true });
  await page.$eval('#chatLog', l => { l.style.maxHeight = 'none'; });
  await fullShot(page, path.join(artifacts, 'agent.png'));
  await page.$eval('#chatLog', l => { l.style.maxHeight = ''; });

  step('the model key is nowhere the browser can see');
  const seen = await Promise.all(received);
  let bytes = 0, hits = 0;
  for (const r of seen) {
    bytes += r.text.length;
    if (r.text.includes(SECRET)) { hits++; console.error(`the model key is in ${r.method} ${r.url}`); }
  }
  const dom = await page.evaluate(() => document.documentElement.outerHTML + JSON.stringify({ ...localStorage }));
  if (dom.includes(SECRET)) { hits++; console.error('the model key is in the page or its localStorage'); }
  console.log(`key scan: ${seen.length} responses, ${bytes} bytes, ${hits} hits`);
  // The scan did read the agent's streams (so it would have seen a leak there).
  const streams = seen.filter(r => r.method === 'POST' && r.url === base + '/v1/agent');
  assert.equal(streams.length, 2, 'both agent streams were captured');
  for (const s of streams) assert.ok(!s.error, `the agent stream was read: ${s.error}`);
  assert.match(streams[0].text, /event: tool_result/);
  assert.match(streams[1].text, /\[redacted\]/);
  assert.equal(hits, 0, 'the model key reached the browser');

  step('end the session');
  await page.click('#sessEnd');
  await page.waitForFunction(() => /not started/.test(document.querySelector('#sessState').textContent), null, { timeout: T });

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
      await page.screenshot({ path: path.join(artifacts, 'agent-failure.png'), fullPage: true });
      console.error(`screenshot of the failure: ${path.join(artifacts, 'agent-failure.png')}`);
    } catch {}
  }
} finally {
  await browser.close().catch(() => {});
}
process.exit(failed ? 1 : 0);
