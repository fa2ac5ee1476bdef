// Browser test of the web UI's Sandboxes view (GET /#sandboxes): Debian's headless
// Chromium driven by playwright-core against the real daemon. Creates a sandbox, types
// `echo hi` in its terminal (xterm.js on the process WebSocket) and sees `hi`, resizes
// the window and sees `stty size` follow, uploads and downloads a file and watches the
// folder change, pauses and resumes it, deletes it; then watches the metrics charts
// move while runs happen; submits a job whose tests fail and sees them in its digest
// table, checks its receipt's signature, retries it, cancels a running one; runs Python
// in WebAssembly and sees its compute units, a session and a unit limit; sees a batch's
// graph with the failed job and its cancelled dependant.
// Usage: node tests/ui/console.test.mjs <daemon base URL>; the daemon must run with the
// API key ISOBOX_UI_KEY (default "ui-test-key"). Environment: CHROMIUM,
// ISOBOX_UI_ARTIFACTS (where console.png goes). Exits 0 when every check passed.
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const base = (process.argv[2] || process.env.ISOBOX_UI_URL || '').replace(/\/+$/, '');
if (!base) { console.error('usage: node console.test.mjs <daemon base URL>'); process.exit(2); }
const KEY = process.env.ISOBOX_UI_KEY || 'ui-test-key';
const here = path.dirname(fileURLToPath(import.meta.url));
const artifacts = process.env.ISOBOX_UI_ARTIFACTS || path.join(here, '..', '..', 'target', 'ui-artifacts');
const T = 20000;
const started = Date.now();
const step = name => console.log(`[${((Date.now() - started) / 1000).toFixed(1)}s] ${name}`);
setTimeout(() => { console.error('FAIL: the browser test took over 140 s'); process.exit(1); }, 140_000).unref();

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run'],
});
let page, failed = false;
const requests = [], problems = [];
// The terminal's rows as text (xterm.js draws them as DOM rows; spaces are NBSPs).
const rows = () => page.$$eval('#term .xterm-rows > div', ds => ds.map(d => d.textContent.replace(/\u00a0/g, ' ').trimEnd()));
async function waitRow(test, what) {
  const t0 = Date.now();
  for (;;) {
    const rs = await rows();
    const hit = rs.find(test);
    if (hit !== undefined) return hit;
    if (Date.now() - t0 > T) throw new Error(`the terminal never showed ${what}; it shows:\n${rs.join('\n')}`);
    await page.waitForTimeout(100);
  }
}
async function typeLine(line) {
  await page.locator('#term .xterm-helper-textarea').focus();
  await page.keyboard.type(line);
  await page.keyboard.press('Enter');
}
const termSize = () => page.evaluate(() => [T.term.rows, T.term.cols]);
async function sttySize() {
  const before = (await rows()).length;
  await page.evaluate(() => T.term.clear());
  await typeLine('stty size');
  const line = await waitRow(r => /^\d+ \d+$/.test(r), 'a `stty size` answer');
  assert.ok(before > 0);
  return line.split(' ').map(Number);
}

try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  await context.addInitScript(k => localStorage.setItem('isobox.apiKey', k), KEY);
  page = await context.newPage();
  page.on('request', r => requests.push(r.url()));
  page.on('pageerror', e => problems.push(`page error: ${e.message}`));
  // A refused request is logged as a failed load (a list refresh racing a pause gets a
  // 409, shown on the page); anything else (a CSP violation, an exception) is a problem.
  page.on('console', m => {
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) problems.push(`console: ${m.text()}`);
  });

  step('open the Sandboxes view');
  const resp = await page.goto(base + '/#sandboxes');
  assert.match(resp.headers()['content-security-policy'] || '', /script-src 'self';/);
  await page.locator('#sbView').waitFor({ state: 'visible', timeout: T });
  assert.equal(await page.locator('#nbView').isHidden(), true);
  assert.equal(await page.getAttribute('#tabSb', 'aria-selected'), 'true');
  await page.waitForFunction(() => document.querySelector('#sbTemplate').options.length > 0, null, { timeout: T });
  assert.equal(await page.inputValue('#sbTemplate'), 'base');
  await page.locator('#sbRows td.note', { hasText: 'No sandboxes yet' }).waitFor({ timeout: T });

  step('create a sandbox without network');
  await page.selectOption('#sbNet', 'none');
  await page.fill('#sbTimeout', '15');
  await page.click('#sbCreate');
  const row = page.locator('#sbRows tr[data-id]');
  await row.waitFor({ timeout: T });
  const id = await row.getAttribute('data-id');
  assert.match(id, /^sb_/);
  assert.equal((await row.locator('td').nth(2).textContent()).trim(), 'running');
  assert.match(await page.locator('#sbMsg').textContent(), new RegExp(`Created ${id}`));
  // Its expiry is the 15 minutes asked for.
  assert.match((await row.locator('td').nth(4).textContent()).trim(), /^1[45] min$/);
  // Memory shows once the metrics are in.
  await page.waitForFunction(() => /MiB/.test(document.querySelector('#sbRows tr[data-id] td:nth-child(7)').textContent), null, { timeout: T });

  step('open its terminal and type `echo hi`');
  await row.getByRole('button', { name: `Open a terminal in ${id}` }).click();
  await page.locator('#termPanel').waitFor({ state: 'visible', timeout: T });
  await page.waitForFunction(() => /Connected/.test(document.querySelector('#termState').textContent), null, { timeout: T });
  await waitRow(r => /[$#] ?$/.test(r), 'a shell prompt');
  await typeLine('echo hi');
  await waitRow(r => r === 'hi', 'the line `hi`');

  step('the terminal has the size of its box; resizing the window resizes it');
  const [r1, c1] = await termSize();
  assert.deepEqual(await sttySize(), [r1, c1]);
  await page.setViewportSize({ width: 820, height: 640 });
  await page.waitForFunction(c => T.term.cols !== c, c1, { timeout: T });
  await page.waitForTimeout(300);
  const [r2, c2] = await termSize();
  assert.ok(c2 < c1, `narrower: ${c1} -> ${c2}`);
  assert.deepEqual(await sttySize(), [r2, c2]);
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.waitForFunction(c => T.term.cols !== c, c2, { timeout: T });
  await page.waitForTimeout(300);
  await typeLine('echo console-ok');
  await waitRow(r => r === 'console-ok', 'the line `console-ok`');
  fs.mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: path.join(artifacts, 'console.png') });

  step('files: upload, listed and seen live, downloaded byte-identical, a file the terminal makes, delete');
  await row.getByRole('button', { name: `Browse the files of ${id}` }).click();
  await page.locator('#filesPanel').waitFor({ state: 'visible', timeout: T });
  await page.waitForFunction(() => document.querySelector('#fCwd').textContent === '/home/user', null, { timeout: T });
  const bytes = Buffer.from(Array.from({ length: 70000 }, (_, i) => (i * 7919 + 13) % 256));
  await page.setInputFiles('#fUpload', { name: 'data.bin', mimeType: 'application/octet-stream', buffer: bytes });
  const item = page.locator('#fList li', { hasText: 'data.bin' });
  await item.waitFor({ timeout: T });
  assert.match(await item.textContent(), /68\.4 KiB/);
  await page.locator('#fWatch li', { hasText: '/home/user/data.bin' }).first().waitFor({ timeout: T });
  const [dl] = await Promise.all([
    page.waitForEvent('download', { timeout: T }),
    item.getByRole('button', { name: 'Download data.bin' }).click(),
  ]);
  assert.equal(dl.suggestedFilename(), 'data.bin');
  assert.ok(fs.readFileSync(await dl.path()).equals(bytes), 'the download is the upload, byte for byte');
  await typeLine('echo from-terminal > made-here.txt');
  await page.locator('#fList li', { hasText: 'made-here.txt' }).waitFor({ timeout: T });
  await page.locator('#fWatch li', { hasText: 'create /home/user/made-here.txt' }).first().waitFor({ timeout: T });
  await item.getByRole('button', { name: 'Delete data.bin' }).click();
  await item.waitFor({ state: 'detached', timeout: T });
  await page.locator('#fWatch li', { hasText: 'remove /home/user/data.bin' }).first().waitFor({ timeout: T });
  await page.screenshot({ path: path.join(artifacts, 'console-files.png'), fullPage: true });

  step('public URL: a sandbox without network says why it has none');
  await row.getByRole('button', { name: `Public URLs of ${id}` }).click();
  await page.locator('#urlPanel').waitFor({ state: 'visible', timeout: T });
  await page.click('#urlGet');
  await page.waitForFunction(() => /HTTP 409/.test(document.querySelector('#urlMsg').textContent), null, { timeout: T });
  assert.match(await page.locator('#urlMsg').textContent(), /network/);
  assert.equal(await page.locator('#urlList li').count(), 0);
  await page.click('#urlClose');

  step('pause and resume it from the list');
  await row.getByRole('button', { name: `Pause ${id}` }).click();
  await page.waitForFunction(() => document.querySelector('#sbRows tr[data-id] td:nth-child(3)').textContent === 'paused', null, { timeout: T });
  await row.getByRole('button', { name: `Resume ${id}` }).click();
  await page.waitForFunction(() => document.querySelector('#sbRows tr[data-id] td:nth-child(3)').textContent === 'running', null, { timeout: T });
  await typeLine('echo after-resume');
  await waitRow(r => r === 'after-resume', 'the line `after-resume`');

  step('add 10 minutes');
  await row.getByRole('button', { name: `Add 10 minutes to ${id}` }).click();
  await page.waitForFunction(() => /^2[45] min$/.test(document.querySelector('#sbRows tr[data-id] td:nth-child(5)').textContent), null, { timeout: T });

  step('a narrow screen scrolls the table, not the page');
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(300);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than a 390px screen`);
  await page.setViewportSize({ width: 1280, height: 900 });

  step('delete it: the terminal closes, the list empties');
  await row.getByRole('button', { name: `Delete ${id}` }).click();
  await page.locator('#sbRows td.note', { hasText: 'No sandboxes yet' }).waitFor({ timeout: T });
  assert.equal(await page.locator('#termPanel').isHidden(), true);
  assert.equal(await page.locator('#filesPanel').isHidden(), true);

  step('jobs: a job whose tests fail shows them in the digest table; its receipt checks out; its file downloads');
  await page.click('#tabJb');
  await page.locator('#jbView').waitFor({ state: 'visible', timeout: T });
  await page.waitForFunction(() => document.querySelector('#jbTemplate').options.length > 0, null, { timeout: T });
  const pytestOut = fs.readFileSync(path.join(here, '..', 'fixtures', 'logs', 'pytest-fail.txt'));
  await page.fill('#jbCmd', `mkdir -p output && echo 42 > output/answer.txt && echo ${pytestOut.toString('base64')} | base64 -d; exit 1`);
  await page.fill('#jbArtifacts', 'output/');
  await page.click('#jbSubmit');
  await page.locator('#jobPanel').waitFor({ state: 'visible', timeout: T });
  const jobId = (await page.locator('#jobWhat').textContent()).trim();
  assert.match(jobId, /^job_/);
  await page.waitForFunction(() => /^failed/.test(document.querySelector('#jobState').textContent), null, { timeout: 60000 });
  assert.match(await page.locator('#jobState').textContent(), /exit code 1/);
  const table = page.locator('#jobTestTable');
  await table.waitFor({ timeout: T });
  assert.deepEqual((await table.locator('tbody tr').first().locator('td').allTextContents()).slice(0, 5), ['pytest', '4', '1', '0', '5']);
  const failure = table.locator('tr.failure', { hasText: 'tests/test_api.py::test_refund' });
  await failure.waitFor({ timeout: T });
  assert.match(await failure.textContent(), /assert 400 == 200/);
  assert.match(await page.locator('#jobLog').textContent(), /1 failed, 4 passed/);
  await page.locator('#jobReceipt.ok').waitFor({ timeout: T });
  assert.match(await page.locator('#jobReceipt').textContent(), /^Signature valid \(Ed25519/);
  const [dl2] = await Promise.all([
    page.waitForEvent('download', { timeout: T }),
    page.locator('#jobFiles').getByRole('button', { name: 'Download output/answer.txt' }).click(),
  ]);
  assert.equal(fs.readFileSync(await dl2.path(), 'utf8'), '42\n');
  const jrow = page.locator(`#jbRows tr[data-id="${jobId}"]`);
  await jrow.waitFor({ timeout: T });
  assert.match(await jrow.locator('td').nth(1).textContent(), /^failed \(nonzero_exit\)/);
  await page.screenshot({ path: path.join(artifacts, 'console-jobs.png'), fullPage: true });

  step('jobs: retry makes a new job; a running one is cancelled');
  await page.click('#jobRetry');
  await page.waitForFunction(id => { const w = document.querySelector('#jobWhat').textContent; return /^job_/.test(w) && w !== id; }, jobId, { timeout: T });
  await page.waitForFunction(() => /^failed/.test(document.querySelector('#jobState').textContent), null, { timeout: 60000 });
  await page.fill('#jbCmd', 'sleep 120');
  await page.fill('#jbArtifacts', '');
  const before = (await page.locator('#jobWhat').textContent()).trim();
  await page.click('#jbSubmit');
  await page.waitForFunction(id => { const w = document.querySelector('#jobWhat').textContent; return /^job_/.test(w) && w !== id; }, before, { timeout: T });
  await page.waitForFunction(() => /^(queued|starting|running)/.test(document.querySelector('#jobState').textContent), null, { timeout: T });
  await page.click('#jobCancel');
  await page.waitForFunction(() => /^cancelled/.test(document.querySelector('#jobState').textContent), null, { timeout: 30000 });

  step('batches: the graph shows the failed job and the dependant cancelled with it');
  const api = (method, p, body) => fetch(base + p, {
    method, headers: { 'Content-Type': 'application/json', 'X-API-Key': KEY }, body: body && JSON.stringify(body),
  }).then(async r => ({ status: r.status, json: await r.json() }));
  const made = await api('POST', '/wbx/v1/batches', {
    name: 'ui-graph', max_concurrency: 2,
    jobs: [{ command: 'echo failing; exit 3' }, { command: 'echo never', depends_on: [0] }, { command: 'echo fine' }],
  });
  assert.equal(made.status, 202, JSON.stringify(made.json));
  const batchId = made.json.id;
  const bt0 = Date.now();
  while ((await api('GET', `/wbx/v1/batches/${batchId}`)).json.status === 'running') {
    assert.ok(Date.now() - bt0 < 60000, 'the batch never ended');
    await page.waitForTimeout(300);
  }
  await page.click('#jbRefresh');
  const brow = page.locator(`#btRows tr[data-id="${batchId}"]`);
  await brow.waitFor({ timeout: T });
  // (A refresh already under way when the batch ended may show it running once more.)
  await page.waitForFunction(id => {
    const tr = document.querySelector(`#btRows tr[data-id="${id}"]`);
    return tr && tr.children[2].textContent === 'partial';
  }, batchId, { timeout: T });
  await brow.getByRole('button', { name: `Open batch ${batchId}` }).click();
  await page.locator('#batchGraph svg').waitFor({ timeout: T });
  const nodes = await page.$$eval('#batchGraph g.node', gs => gs.map(g => [g.dataset.index, g.dataset.status]));
  assert.deepEqual(nodes, [['0', 'failed'], ['1', 'cancelled'], ['2', 'completed']]);
  assert.deepEqual(await page.$$eval('#batchGraph path.edge', ps => ps.map(p => [p.dataset.from, p.dataset.to])), [['0', '1']]);
  assert.match(await page.locator('#batchGraph g.node[data-index="1"]').getAttribute('aria-label'), /cancelled \(dependency_failed\)/);
  // The failed one is drawn left of its dependant.
  const x = async i => Number(await page.locator(`#batchGraph g.node[data-index="${i}"] rect`).getAttribute('x'));
  assert.ok(await x(0) < await x(1));
  assert.match(await page.locator('#batchState').textContent(), /^partial · 3 jobs/);
  await page.locator('#batchPanel').screenshot({ path: path.join(artifacts, 'console-batch.png') });
  // A box opens its job.
  await page.locator('#batchGraph g.node[data-index="0"]').click();
  await page.waitForFunction(() => /^failed · exit code 3/.test(document.querySelector('#jobState').textContent), null, { timeout: T });

  step('WebAssembly: a run shows its compute units, the same for the same code; a session keeps state; a unit limit stops a run');
  await page.click('#tabWa');
  await page.locator('#waView').waitFor({ state: 'visible', timeout: T });
  await page.locator('#waEnvRows td.note', { hasText: 'No environments yet' }).waitFor({ timeout: T });
  await page.fill('#waCode', 'print(sum(range(10)))');
  await page.press('#waCode', 'Control+Enter');
  await page.locator('#waStdout').waitFor({ timeout: T });
  assert.equal(await page.locator('#waStdout').textContent(), '45\n');
  const units1 = await page.locator('#waUnits').textContent();
  assert.match(units1, /^[\d,]+ compute units$/);
  assert.ok(Number(units1.replace(/\D/g, '')) > 1000, units1);
  await page.click('#waRun');
  await page.waitForFunction(() => document.querySelectorAll('#waRunRows tr').length === 2, null, { timeout: T });
  const unitCells = await page.$$eval('#waRunRows td.units', tds => tds.map(td => td.textContent));
  assert.deepEqual(unitCells, [units1.replace(' compute units', ''), units1.replace(' compute units', '')], 'the same code costs the same units');
  await page.check('#waSession');
  await page.fill('#waCode', 'x = 41');
  await page.click('#waRun');
  await page.waitForFunction(() => document.querySelectorAll('#waRunRows tr').length === 3, null, { timeout: T });
  await page.fill('#waCode', 'print(x + 1)');
  await page.click('#waRun');
  await page.waitForFunction(() => document.querySelectorAll('#waRunRows tr').length === 4, null, { timeout: T });
  assert.equal(await page.locator('#waStdout').textContent(), '42\n');
  assert.match(await page.locator('#waSessState').textContent(), /^session /);
  await page.click('#waEndSession');
  assert.equal(await page.isChecked('#waSession'), false);
  await page.fill('#waCode', 'while True: pass');
  await page.fill('#waFuel', '100000');
  await page.click('#waRun');
  await page.waitForFunction(() => document.querySelectorAll('#waRunRows tr').length === 5, null, { timeout: T });
  assert.equal((await page.locator('#waRunRows tr').first().locator('td').nth(1).textContent()), 'resource_limit');
  await page.fill('#waFuel', '');
  await page.screenshot({ path: path.join(artifacts, 'console-wasm.png'), fullPage: true });

  step('metrics: the charts move while runs happen');
  await page.click('#tabMx');
  await page.locator('#mxView').waitFor({ state: 'visible', timeout: T });
  assert.equal(await page.locator('#sbView').isHidden(), true);
  await page.waitForFunction(() => document.querySelector('#chart-runs') && document.querySelector('#chart-runs').dataset.last, null, { timeout: T });
  // Runs through the API (four at a time, as clients would) until the page has seen them.
  const runOnce = () => fetch(base + '/execute', {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'X-API-Key': KEY },
    body: JSON.stringify({ language: 'python', code: 'print(1)' }),
  }).then(r => r.json());
  let seen = false, runs = 0;
  const t0 = Date.now();
  while (!seen) {
    assert.ok(Date.now() - t0 < 40000, 'the runs chart never moved');
    const rs = await Promise.all([runOnce(), runOnce(), runOnce(), runOnce()]);
    for (const r of rs) assert.equal(r.run && r.run.stdout, '1\n', JSON.stringify(r));
    runs += rs.length;
    seen = await page.evaluate(() => {
      const peak = id => JSON.parse(document.querySelector('#chart-' + id).dataset.peak || '[]');
      return peak('runs')[0] > 0 && peak('latency')[0] > 0 && peak('slots')[1] > 0;
    });
  }
  const pts = await page.getAttribute('#chart-runs polyline', 'points');
  assert.ok(pts.split(' ').some(p => Number(p.split(',')[1]) < 89), `a point above the baseline: ${pts}`);
  assert.match(await page.locator('#chart-runs .now').textContent(), /^\d+\.\d\d$/);
  await page.screenshot({ path: path.join(artifacts, 'console-metrics.png') });
  console.log(`  the page saw the runs after ${runs} of them`);

  step('the tabs go back to the notebook');
  await page.click('#tabNb');
  await page.locator('#nbView').waitFor({ state: 'visible', timeout: T });
  assert.equal(await page.locator('#sbView').isHidden(), true);

  const foreign = requests.filter(u => !/^(http:\/\/127\.0\.0\.1[:/]|ws:\/\/127\.0\.0\.1[:/]|data:|blob:|about:)/.test(u));
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
      await page.screenshot({ path: path.join(artifacts, 'console-failure.png'), fullPage: true });
      console.error(`screenshot of the failure: ${path.join(artifacts, 'console-failure.png')}`);
    } catch {}
  }
} finally {
  await browser.close().catch(() => {});
}
process.exit(failed ? 1 : 0);
