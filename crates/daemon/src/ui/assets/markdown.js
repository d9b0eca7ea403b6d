// A small Markdown renderer that builds DOM nodes directly: every piece of text becomes a text
// node, so an agent's output can never inject markup, and links are kept only for http(s).
// `MarkdownStream` renders text that grows (a streamed reply) a settled block at a time.
import { h } from './dom.js';

const FENCE = /^\s*(```+|~~~+)\s*([\w+.-]*)/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s*>/;
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
      while (i < lines.length && QUOTE.test(lines[i])) body.push(lines[i++].replace(/^\s*>\s?/, ''));
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
  out.appendChild(el);
  return i;
}

/**
 * Text that keeps growing (a streamed reply), rendered into `el` as `renderMarkdown` renders the
 * whole, but each frame renders only what is not settled yet. Settled is what no later text can
 * change: everything up to a blank line or a closed fence, and in a long paragraph of plain
 * lines (none of the characters that open an inline span, so no span can cross a line), all
 * but its last lines. Settled blocks are rendered once and their text let go, so a reply that
 * streams for hours costs a frame only its last lines, and keeps its text only in the page.
 */
export class MarkdownStream {
  /** @param {HTMLElement} el */
  constructor(el) {
    this.el = el;
    /** The text not settled yet. */
    this.pending = '';
    /** A paragraph the settled text ended in the middle of, which the next lines go on. @type {HTMLElement | null} */
    this.open = null;
    /** What the last `render` added for the pending text, taken away by the next. @type {ChildNode[]} */
    this.shown = [];
  }

  /** @param {string} text */
  push(text) {
    this.pending += text;
  }

  /** Shows everything pushed so far. */
  render() {
    for (const n of this.shown) n.remove();
    // A lone `\r` may be half of a `\r\n` still on its way.
    const text = this.pending.endsWith('\r') ? this.pending : this.pending.replace(/\r\n?/g, '\n');
    const { end, cut } = this.pending.endsWith('\r') ? { end: 0, cut: false } : settled(text, this.open !== null);
    if (end > 0) {
      const last = this.place(text.slice(0, end)).last;
      this.open = cut ? last : null;
    }
    this.pending = text.slice(end);
    this.shown = this.place(this.pending).added;
  }

  /**
   * Renders `text` at the end of the element; a first paragraph that goes on from the open one
   * joins it, as the lines of one paragraph would.
   * @param {string} text
   * @returns {{added: ChildNode[], last: HTMLElement | null}}
   */
  place(text) {
    const frag = renderMarkdown(text);
    /** @type {ChildNode[]} */
    const added = [];
    let last = null;
    const first = frag.firstChild;
    if (this.open && first instanceof HTMLParagraphElement && lineKind(text.split('\n', 1)[0]) === 'para') {
      const joined = [h('br'), ...first.childNodes];
      this.open.append(...joined);
      added.push(...joined);
      first.remove();
      last = this.open;
    }
    const top = [...frag.childNodes];
    this.el.append(frag);
    added.push(...top);
    if (top.length) last = /** @type {HTMLElement} */ (top[top.length - 1]);
    return { added, last };
  }
}

/** Plain lines a paragraph runs before they are settled. */
const PARAGRAPH_PIECE = 64;
/** The characters that open an inline span (code, emphasis, a link's label). */
const SPAN_OPENER = /[`*_[]/;

/**
 * Where the settled part of `text` ends (a line's start), and whether it ends inside a paragraph.
 * `open`: `text` goes on a paragraph of plain lines.
 * @param {string} text
 * @param {boolean} open
 */
function settled(text, open) {
  let end = 0;
  let cut = false;
  /** @type {string | null} */
  let fence = null;
  /** In a paragraph: 'plain' while none of its lines could open a span. @type {'plain' | 'mixed' | null} */
  let para = open ? 'plain' : null;
  let plain = 0;
  for (let start = 0, next = text.indexOf('\n'); next >= 0; start = next + 1, next = text.indexOf('\n', start)) {
    const line = text.slice(start, next);
    if (fence !== null) {
      if (line.trim().startsWith(fence)) {
        fence = null;
        end = next + 1;
        cut = false;
      }
      continue;
    }
    const kind = lineKind(line);
    if (kind === 'fence') {
      fence = /** @type {RegExpExecArray} */ (FENCE.exec(line))[1];
      para = null;
    } else if (kind === 'blank') {
      para = null;
      end = next + 1;
      cut = false;
    } else if (kind === 'para') {
      const opens = SPAN_OPENER.test(line);
      if (para === null || (para === 'plain' && opens)) { para = opens ? 'mixed' : 'plain'; plain = 0; }
      if (para === 'plain' && ++plain >= PARAGRAPH_PIECE) {
        end = next + 1;
        cut = true;
        plain = 0;
      }
    } else {
      para = null;
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
