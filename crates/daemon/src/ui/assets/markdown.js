// A small Markdown renderer that builds DOM nodes directly: every piece of text becomes a text
// node, so an agent's output can never inject markup, and links are kept only for http(s).
import { h } from './dom.js';

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
    const fence = /^\s*(```+|~~~+)\s*([\w+.-]*)/.exec(line);
    if (fence) {
      flush();
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1;
      const code = h('code', fence[2] ? { class: `lang-${fence[2]}` } : null, body.join('\n'));
      out.appendChild(h('pre', { class: 'code' }, code));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      flush();
      out.appendChild(h(/** @type {'h3' | 'h4' | 'h5' | 'h6'} */ (`h${Math.min(6, heading[1].length + 2)}`), { class: 'md-h' }, inline(heading[2])));
      i += 1;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      out.appendChild(h('hr'));
      i += 1;
      continue;
    }
    if (/^\s*>/.test(line)) {
      flush();
      const body = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) body.push(lines[i++].replace(/^\s*>\s?/, ''));
      out.appendChild(h('blockquote', null, renderMarkdown(body.join('\n'))));
      continue;
    }
    const item = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(line);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const list = h(ordered ? 'ol' : 'ul');
      while (i < lines.length) {
        const m = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(lines[i]);
        if (!m || /\d/.test(m[1]) !== ordered) break;
        const task = /^\[([ xX])\]\s+(.*)$/.exec(m[2]);
        if (task) {
          list.appendChild(h('li', { class: 'task' },
            h('input', { type: 'checkbox', disabled: true, checked: task[1] !== ' ', 'aria-label': task[1] !== ' ' ? 'done' : 'not done' }),
            ' ', inline(task[2])));
        } else {
          list.appendChild(h('li', null, inline(m[2])));
        }
        i += 1;
      }
      out.appendChild(list);
      continue;
    }
    if (line.trim() === '') flush();
    else para.push(line);
    i += 1;
  }
  flush();
  return out;
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
