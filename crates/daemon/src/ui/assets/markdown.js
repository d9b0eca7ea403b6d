// A small Markdown renderer that builds DOM nodes directly: every piece of text becomes a text
// node, so an agent's output can never inject markup, and links are kept only for http(s).
// `MarkdownStream` renders text that grows (a streamed reply) a settled block at a time.
import { h } from './dom.js';

const FENCE = /^\s*(```+|~~~+)\s*([\w+.-]*)/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s*>/;
/** What a quote's line starts with, which its text is without. */
const UNQUOTE = /^\s*>\s?/;
const ITEM = /^\s*([-*+]|\d+[.)])\s+(.*)$/;

/**
 * What one line starts or continues; the renderer and `MarkdownStream` read lines by the same
 * rules.
 * @param {string} line
 * @returns {'fence' | 'heading' | 'rule' | 'quote' | 'item' | 'blank' | 'para'}
 */
export function lineKind(line) {
  if (FENCE.test(line)) return 'fence';
  if (HEADING.test(line)) return 'heading';
  if (RULE.test(line)) return 'rule';
  if (QUOTE.test(line)) return 'quote';
  if (ITEM.test(line)) return 'item';
  return line.trim() === '' ? 'blank' : 'para';
}

/**
 * Renders `text` into a fragment: headings, paragraphs, lists, quotes, fenced code, rules.
 * @param {string} text
 */
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  /** @type {string[]} */
  let para = [];
  const flush = () => {
    if (para.length) out.appendChild(h('p', null, inline(para.join('\n'))));
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const kind = lineKind(line);
    if (kind === 'para') {
      para.push(line);
      i += 1;
      continue;
    }
    flush();
    if (kind === 'fence') {
      const fence = /** @type {RegExpExecArray} */ (FENCE.exec(line));
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1;
      const code = h('code', fence[2] ? { class: `lang-${fence[2]}` } : null, body.join('\n'));
      out.appendChild(h('pre', { class: 'code' }, code));
    } else if (kind === 'heading') {
      const heading = /** @type {RegExpExecArray} */ (HEADING.exec(line));
      out.appendChild(h(/** @type {'h3' | 'h4' | 'h5' | 'h6'} */ (`h${Math.min(6, heading[1].length + 2)}`), { class: 'md-h' }, inline(heading[2])));
      i += 1;
    } else if (kind === 'rule') {
      out.appendChild(h('hr'));
      i += 1;
    } else if (kind === 'quote') {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(lines[i++].replace(UNQUOTE, ''));
      out.appendChild(h('blockquote', null, renderMarkdown(body.join('\n'))));
    } else if (kind === 'item') {
      i = list(lines, i, out);
    } else {
      i += 1;
    }
  }
  flush();
  return out;
}

/**
 * The list that starts at `lines[i]`, up to the first line that is not one of its items;
 * returns the index of that line.
 * @param {string[]} lines
 * @param {number} i
 * @param {DocumentFragment} out
 */
function list(lines, i, out) {
  const ordered = /\d/.test(/** @type {RegExpExecArray} */ (ITEM.exec(lines[i]))[1]);
  const el = h(ordered ? 'ol' : 'ul');
  i = items(lines, i, el, ordered);
  out.appendChild(el);
  return i;
}

/**
 * Appends to the list `el` the items that start at `lines[i]` (of its kind, ordered or not);
 * returns the index of the first line that is not one.
 * @param {string[]} lines
 * @param {number} i
 * @param {HTMLElement} el
 * @param {boolean} ordered
 */
function items(lines, i, el, ordered) {
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || /\d/.test(m[1]) !== ordered) break;
    const task = /^\[([ xX])\]\s+(.*)$/.exec(m[2]);
    if (task) {
      el.appendChild(h('li', { class: 'task' },
        h('input', { type: 'checkbox', disabled: true, checked: task[1] !== ' ', 'aria-label': task[1] !== ' ' ? 'done' : 'not done' }),
        ' ', inline(task[2])));
    } else {
      el.appendChild(h('li', null, inline(m[2])));
    }
    i += 1;
  }
  return i;
}

/**
 * Where settled text ended in the middle of a block, which the next lines go on: a paragraph
 * of plain lines (`el` its `<p>`), a code fence (`el` its `<code>`, `marker` the run of
 * backticks or tildes that closes it), a list (`el` its `<ul>` or `<ol>`), a quote (`el` its
 * `<blockquote>`, `inner` the stream its lines, Markdown of their own, go on in).
 * @typedef {{kind: 'para', el: HTMLElement} | {kind: 'fence', el: HTMLElement, marker: string} | {kind: 'list', el: HTMLElement, ordered: boolean} | {kind: 'quote', el: HTMLElement, inner: MarkdownStream}} Open
 */

/**
 * Text that keeps growing (a streamed reply), rendered into `el` as `renderMarkdown` renders the
 * whole, but each frame renders only what is not settled yet. Settled is what no later text can
 * change: everything up to a blank line or a closed fence; in a long paragraph of plain lines
 * (none of the characters that open an inline span, so no span can cross a line), all but its
 * last lines; in an open code fence, its complete lines; in a long list, its complete items;
 * in a quote, its complete lines, which go on in a stream of their own inside the quote (its
 * lines are Markdown too). The lines settled inside a block go on the same element (the `<p>`,
 * `<code>`, `<ul>`, `<blockquote>`) as the block's first lines did. Settled text is rendered
 * once and let go, so a reply that streams for hours (or prints a file of thousands of lines
 * in one fence) costs a frame only its last lines, and keeps its text only in the page.
 */
export class MarkdownStream {
  /** @param {HTMLElement} el */
  constructor(el) {
    this.el = el;
    /** The text not settled yet. */
    this.pending = '';
    /** The block the settled text ended in the middle of, which the next lines go on. @type {Open | null} */
    this.open = null;
    /** What the last `render` added for the pending text, taken away by the next. @type {ChildNode[]} */
    this.shown = [];
  }

  /** @param {string} text */
  push(text) {
    this.pending += text;
  }

  /**
   * Shows everything pushed so far, and after it `extra`, which is not kept (a quote's last
   * lines, shown by its own stream until they are settled).
   * @param {string} [extra]
   */
  render(extra = '') {
    for (const n of this.shown) n.remove();
    // A lone `\r` may be half of a `\r\n` still on its way.
    const text = this.pending.endsWith('\r') ? this.pending : this.pending.replace(/\r\n?/g, '\n');
    const { end, cut } = this.pending.endsWith('\r') ? { end: 0, cut: null } : settled(text, this.open);
    if (end > 0) {
      // Inside a fence the settled text ends with a line of the code, not after it: the code
      // takes the newline only with the next line.
      this.open = this.place(text.slice(0, cut?.kind === 'fence' ? end - 1 : end), cut).open;
    }
    this.pending = text.slice(end);
    this.shown = this.place(this.pending + extra).added;
  }

  /**
   * Renders `text` at the end of the element: its first lines go on the open block as far as
   * they continue it, the rest as `renderMarkdown` renders it. `cut`, given when `text` is
   * settled: the block it ends in the middle of (see `settled`); without it, `text` is only
   * shown, until the next render takes it away.
   * @param {string} text
   * @param {Cut | null} [cut]
   * @returns {{added: ChildNode[], open: Open | null}} `open`: the block settled text ends in
   *   the middle of, which the next lines go on.
   */
  place(text, cut) {
    const keep = cut !== undefined;
    /** @type {ChildNode[]} */
    const added = [];
    let rest = text.replace(/\r\n?/g, '\n');
    const open = this.open;
    /** The last block placed. @type {HTMLElement | null} */
    let last = null;
    /** The stream of the last quote placed. @type {MarkdownStream | null} */
    let quote = null;
    if (open?.kind === 'fence') {
      const lines = rest.split('\n');
      let i = 0;
      while (i < lines.length && !lines[i].trim().startsWith(open.marker)) i += 1;
      if (i > 0) {
        const code = document.createTextNode(`\n${lines.slice(0, i).join('\n')}`);
        open.el.append(code);
        added.push(code);
      }
      last = open.el.parentElement;
      rest = i === lines.length ? '' : lines.slice(i + 1).join('\n');
    } else if (open?.kind === 'list') {
      const lines = rest.split('\n');
      const before = open.el.childNodes.length;
      const i = items(lines, 0, open.el, open.ordered);
      added.push(...[...open.el.childNodes].slice(before));
      last = open.el;
      rest = lines.slice(i).join('\n');
    } else if (open?.kind === 'quote') {
      // The quote's stream has a line already: each next one goes on after a newline.
      const lines = rest.split('\n');
      let i = 0;
      while (i < lines.length && QUOTE.test(lines[i])) i += 1;
      const more = lines.slice(0, i).map((l) => `\n${l.replace(UNQUOTE, '')}`).join('');
      if (keep) {
        open.inner.push(more);
        open.inner.render();
      } else {
        open.inner.render(more);
      }
      last = open.el;
      quote = open.inner;
      rest = lines.slice(i).join('\n');
    }
    // Settled text that ends in a quote: the quote's lines go in a stream of its own.
    /** @type {string[]} */
    let run = [];
    if (cut?.kind === 'quote') {
      const lines = rest.split('\n');
      let k = lines.length - 1;
      while (k > 0 && QUOTE.test(lines[k - 1])) k -= 1;
      run = lines.slice(k, -1);
      if (run.length) rest = lines.slice(0, k).join('\n');
    }
    const frag = renderMarkdown(rest);
    const first = frag.firstChild;
    if (open?.kind === 'para' && first instanceof HTMLParagraphElement && lineKind(rest.split('\n', 1)[0]) === 'para') {
      const joined = [h('br'), ...first.childNodes];
      open.el.append(...joined);
      added.push(...joined);
      first.remove();
      last = open.el;
    }
    const top = [...frag.childNodes];
    this.el.append(frag);
    added.push(...top);
    if (top.length) last = /** @type {HTMLElement} */ (top[top.length - 1]);
    if (run.length) {
      last = this.el.appendChild(h('blockquote'));
      added.push(last);
      quote = new MarkdownStream(last);
      quote.push(run.map((l) => l.replace(UNQUOTE, '')).join('\n'));
      quote.render();
    }
    if (!cut || !last) return { added, open: null };
    if (cut.kind === 'fence') return { added, open: { ...cut, el: /** @type {HTMLElement} */ (last.firstElementChild) } };
    if (cut.kind === 'quote') return { added, open: quote && { ...cut, el: last, inner: quote } };
    return { added, open: { ...cut, el: last } };
  }
}

/** Lines a paragraph of plain lines, a fence or a list runs before they are settled (a quote's
 * are settled at once, into its own stream). */
const PIECE = 64;
/** The characters that open an inline span (code, emphasis, a link's label). */
const SPAN_OPENER = /[`*_[]/;

/**
 * What the text settled inside a block leaves open: the block's kind and how it ends.
 * @typedef {{kind: 'para'} | {kind: 'fence', marker: string} | {kind: 'list', ordered: boolean} | {kind: 'quote'}} Cut
 */

/**
 * Where the settled part of `text` ends (a line's start), and which block it ends inside, if
 * any. `open`: the block `text` goes on.
 * @param {string} text
 * @param {Open | null} open
 * @returns {{end: number, cut: Cut | null}}
 */
function settled(text, open) {
  let end = 0;
  /** @type {Cut | null} */
  let cut = null;
  /** In a fence: what closes it. @type {string | null} */
  let fence = open?.kind === 'fence' ? open.marker : null;
  /** In a paragraph: 'plain' while none of its lines could open a span. @type {'plain' | 'mixed' | null} */
  let para = open?.kind === 'para' ? 'plain' : null;
  /** In a list: whether it is ordered. @type {boolean | null} */
  let list = open?.kind === 'list' ? open.ordered : null;
  /** Lines of the current block since it began or was last cut. */
  let run = 0;
  for (let start = 0, next = text.indexOf('\n'); next >= 0; start = next + 1, next = text.indexOf('\n', start)) {
    const line = text.slice(start, next);
    if (fence !== null) {
      if (line.trim().startsWith(fence)) {
        fence = null;
        end = next + 1;
        cut = null;
      } else if (++run >= PIECE) {
        end = next + 1;
        cut = { kind: 'fence', marker: fence };
        run = 0;
      }
      continue;
    }
    // A list goes on over every line that reads as one of its items (`- - -` too).
    const item = list === null ? null : ITEM.exec(line);
    const kind = item && /\d/.test(item[1]) === list ? 'item' : lineKind(line);
    if (kind !== 'para') para = null;
    if (kind === 'fence') {
      fence = /** @type {RegExpExecArray} */ (FENCE.exec(line))[1];
      list = null;
      run = 0;
    } else if (kind === 'blank') {
      list = null;
      end = next + 1;
      cut = null;
    } else if (kind === 'para') {
      list = null;
      const opens = SPAN_OPENER.test(line);
      if (para === null || (para === 'plain' && opens)) { para = opens ? 'mixed' : 'plain'; run = 0; }
      if (para === 'plain' && ++run >= PIECE) {
        end = next + 1;
        cut = { kind: 'para' };
        run = 0;
      }
    } else if (kind === 'quote') {
      // Its line is settled at once: the quote's own stream settles what it makes of it.
      list = null;
      end = next + 1;
      cut = { kind: 'quote' };
    } else if (kind === 'item') {
      const ordered = /\d/.test(/** @type {RegExpExecArray} */ (ITEM.exec(line))[1]);
      if (list !== ordered) { list = ordered; run = 0; }
      if (++run >= PIECE) {
        end = next + 1;
        cut = { kind: 'list', ordered };
        run = 0;
      }
    } else {
      list = null;
    }
  }
  return { end, cut };
}

const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([\s\S]+?)\*\*|__([\s\S]+?)__|\*([^*\s][^*]*?)\*|\b_([^_\s][^_]*?)_\b|\[([^\]]+)\]\(([^)\s]+)\)|(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])|\n/g;

/**
 * Inline spans: code, bold, italic, links, autolinks, line breaks.
 * @param {string} text
 * @returns {DocumentFragment}
 */
export function inline(text) {
  const out = document.createDocumentFragment();
  let last = 0;
  // A regex of its own per call: spans nest (bold inside a link), and a shared `lastIndex`
  // would be reset by the inner call.
  const re = new RegExp(INLINE.source, 'g');
  for (let m = re.exec(text); m; m = re.exec(text)) {
    if (m.index > last) out.appendChild(document.createTextNode(text.slice(last, m.index)));
    last = re.lastIndex;
    if (m[1]) out.appendChild(h('code', null, m[2]));
    else if (m[3] !== undefined || m[4] !== undefined) out.appendChild(h('strong', null, inline(m[3] ?? m[4])));
    else if (m[5] !== undefined || m[6] !== undefined) out.appendChild(h('em', null, inline(m[5] ?? m[6])));
    else if (m[7] !== undefined) out.appendChild(link(m[8], inline(m[7])));
    else if (m[9] !== undefined) out.appendChild(link(m[9], m[9]));
    else out.appendChild(h('br'));
  }
  if (last < text.length) out.appendChild(document.createTextNode(text.slice(last)));
  return out;
}

/**
 * @param {string} href
 * @param {Node | string} label
 */
function link(href, label) {
  // Only web links: `javascript:` and friends become plain text.
  if (!/^https?:\/\//i.test(href)) return h('span', null, label);
  return h('a', { href, target: '_blank', rel: 'noopener noreferrer' }, label);
}
