// The notebook's code editor: CodeMirror 6, bundled by `make ui-vendor` (build.mjs,
// esbuild) into dist/editor.js, which isoboxd serves at /ui/editor.js. It defines one
// global, `IsoboxEditor`: create, langFor and find.
import { EditorState, Compartment, Prec } from '@codemirror/state';
import {
  EditorView, keymap, highlightSpecialChars, drawSelection, highlightActiveLine,
  dropCursor, rectangularSelection, crosshairCursor, lineNumbers,
} from '@codemirror/view';
import {
  indentOnInput, indentUnit, bracketMatching, foldKeymap, syntaxHighlighting,
  HighlightStyle, StreamLanguage,
} from '@codemirror/language';
import { tags as t } from '@lezer/highlight';
import { defaultKeymap, history, historyKeymap, indentWithTab } from '@codemirror/commands';
import { closeBrackets, closeBracketsKeymap } from '@codemirror/autocomplete';
import { python } from '@codemirror/lang-python';
import { javascript } from '@codemirror/lang-javascript';
import { rust } from '@codemirror/lang-rust';
import { go } from '@codemirror/lang-go';
import { ruby } from '@codemirror/legacy-modes/mode/ruby';

// Colours are the page's CSS variables (--hl-*, light and dark in index.html), so the
// highlighting follows the page's colour scheme.
const highlight = HighlightStyle.define([
  { tag: [t.keyword, t.controlKeyword, t.moduleKeyword, t.operatorKeyword, t.definitionKeyword, t.modifier, t.self], color: 'var(--hl-kw)' },
  { tag: [t.string, t.special(t.string), t.character, t.regexp, t.docString], color: 'var(--hl-str)' },
  { tag: [t.number, t.bool, t.null, t.atom, t.escape], color: 'var(--hl-num)' },
  { tag: [t.comment, t.lineComment, t.blockComment, t.docComment], color: 'var(--hl-com)', fontStyle: 'italic' },
  { tag: [t.function(t.variableName), t.function(t.propertyName), t.macroName], color: 'var(--hl-fn)' },
  { tag: [t.typeName, t.className, t.namespace, t.standard(t.variableName)], color: 'var(--hl-type)' },
  { tag: [t.meta, t.annotation, t.processingInstruction], color: 'var(--hl-meta)' },
  { tag: t.invalid, color: 'var(--bad)' },
]);

// Per language: its parser and the indentation its community writes (PEP 8's four
// spaces, gofmt's tab, rustfmt's four, two for JavaScript, TypeScript and Ruby).
const LANGS = {
  python: () => [python(), indentUnit.of('    ')],
  javascript: () => [javascript(), indentUnit.of('  ')],
  typescript: () => [javascript({ typescript: true }), indentUnit.of('  ')],
  go: () => [go(), indentUnit.of('\t')],
  rust: () => [rust(), indentUnit.of('    ')],
  ruby: () => [StreamLanguage.define(ruby), indentUnit.of('  ')],
};

// A runtime's language name (`python-slim`, `python3.14`, `node`…) to one of LANGS, or
// null: plain text, still with brackets and indentation kept.
function langFor(name) {
  const n = String(name || '').toLowerCase();
  if (n.startsWith('py')) return 'python';
  if (n === 'js' || n.startsWith('javascript') || n.startsWith('node')) return 'javascript';
  if (n === 'ts' || n.startsWith('typescript')) return 'typescript';
  if (n.startsWith('go')) return 'go';
  if (n === 'rs' || n.startsWith('rust')) return 'rust';
  if (n === 'rb' || n.startsWith('ruby')) return 'ruby';
  return null;
}

// create(parent, { doc, language, label, onRun(shift), onChange(), onFocus() }) → an
// editor with .value, .setValue(s), .setLanguage(name), .focus(), .hasFocus, .dom.
// Shift+Enter and Ctrl/Cmd+Enter call onRun; Tab indents, Shift+Tab dedents, and
// Escape then Tab leaves the editor (CodeMirror's tab focus mode), so the keyboard is
// never trapped.
function create(parent, opts = {}) {
  const lang = new Compartment();
  const run = shift => () => { if (opts.onRun) opts.onRun(shift); return true; };
  const view = new EditorView({
    parent,
    state: EditorState.create({
      doc: opts.doc || '',
      extensions: [
        Prec.highest(keymap.of([
          { key: 'Shift-Enter', run: run(true) },
          { key: 'Mod-Enter', run: run(false) },
        ])),
        lineNumbers(),
        highlightSpecialChars(),
        history(),
        drawSelection(),
        dropCursor(),
        EditorState.allowMultipleSelections.of(true),
        indentOnInput(),
        syntaxHighlighting(highlight),
        bracketMatching(),
        closeBrackets(),
        rectangularSelection(),
        crosshairCursor(),
        highlightActiveLine(),
        keymap.of([...closeBracketsKeymap, ...defaultKeymap, ...historyKeymap, ...foldKeymap, indentWithTab]),
        lang.of(LANGS[langFor(opts.language)] ? LANGS[langFor(opts.language)]() : []),
        EditorView.contentAttributes.of({
          'aria-label': opts.label || 'Code',
          autocapitalize: 'off',
          autocorrect: 'off',
          spellcheck: 'false',
        }),
        EditorView.updateListener.of(u => {
          if (u.docChanged && opts.onChange) opts.onChange();
          if (u.focusChanged && u.view.hasFocus && opts.onFocus) opts.onFocus();
        }),
      ],
    }),
  });
  return {
    dom: view.dom,
    view,
    get value() { return view.state.doc.toString(); },
    setValue(s) { view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: s } }); },
    setLanguage(name) {
      const k = langFor(name);
      view.dispatch({ effects: lang.reconfigure(LANGS[k] ? LANGS[k]() : []) });
    },
    setLabel(s) { view.contentDOM.setAttribute('aria-label', s); },
    focus() { view.focus(); },
    get hasFocus() { return view.hasFocus; },
    languageOf: langFor,
  };
}

// find(element): the EditorView of the editor holding element (for scripts and
// tests that read or set its state).
const find = element => EditorView.findFromDOM(element.closest('.cm-editor') || element);

globalThis.IsoboxEditor = { create, langFor, find };
