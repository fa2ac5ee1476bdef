// `make ui-vendor`: bundle editor.js (CodeMirror 6 and its language packages, from
// node_modules) into one minified script, dist/editor.js, for build.rs to embed. The
// licence of every package that ends up in the bundle is kept at its top (all MIT).
import { build } from 'esbuild';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const opts = {
  entryPoints: ['editor.js'],
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['es2020'],
  logLevel: 'warning',
  metafile: true,
  write: false,
};
const out = await build(opts);
// node_modules/@scope/name/... or node_modules/name/... → the package's directory.
const pkgs = new Set();
for (const input of Object.keys(out.metafile.inputs)) {
  const m = /^node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(input);
  if (m) pkgs.add(m[1]);
}
const byText = new Map();
for (const p of [...pkgs].sort()) {
  const dir = join('node_modules', p);
  const file = readdirSync(dir).find(f => /^licen[cs]e/i.test(f));
  if (!file) throw new Error(`${p}: no licence file`);
  const { version } = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  const text = readFileSync(join(dir, file), 'utf8').trim();
  if (!byText.has(text)) byText.set(text, []);
  byText.get(text).push(`${p}@${version}`);
}
let banner = '/*! isobox web UI code editor: CodeMirror 6 bundled from npm. Licences:\n';
for (const [text, names] of byText) banner += `\n${names.join(', ')}:\n\n${text.replaceAll('*/', '* /')}\n`;
banner += '*/\n';
mkdirSync('dist', { recursive: true });
writeFileSync('dist/editor.js', banner + out.outputFiles[0].text);
