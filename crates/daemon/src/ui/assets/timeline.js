// One agent's timeline as DOM: items keyed by `seq`, built once, then changed in place by the
// `append` and `patch` notifications (streamed text re-renders only its own item, once a frame).
import { h } from './dom.js';
import { MarkdownStream } from './markdown.js';
import { CancelCause, InterruptCause, ItemKind, TurnEnd } from './protocol.gen.js';

/**
 * A timeline item. Its `data` is its kind's own, much of it ACP's free-form content (tool
 * input and output, plan entries): the protocol leaves it open, so it is `any` here.
 * @typedef {{seq: number, kind: string, at: string, data: any, updatedAt?: string}} Item
 */
/**
 * An item shown. An agent's message is rendered as it streams (`stream`), which takes its text
 * out of `item.data.text` at each frame: the page keeps the rest only as what it shows.
 * @typedef {{item: Item, el: HTMLElement, stream?: MarkdownStream | null}} Entry
 */
/** One of a permission's options (ACP's). @typedef {{optionId: string, name?: string, kind?: string}} PermissionOption */
/**
 * An `agent_update`'s notification: a new item, text appended to one of an item's fields, or
 * fields patched.
 * @typedef {{op: 'item', item: Item}
 *   | {op: 'append', seq: number, field: string, text: string}
 *   | {op: 'patch', seq: number, fields: Record<string, unknown>, at?: string}} Notification
 */

/** @type {Record<string, string>} */
const TURN_END = {
  [TurnEnd.Completed]: 'Turn completed',
  [TurnEnd.Failed]: 'Turn failed',
  [TurnEnd.Canceled]: 'Turn canceled',
  [TurnEnd.Blocked]: 'Turn blocked',
  [TurnEnd.Interrupted]: 'Turn interrupted',
};

// Why a turn was canceled or cut off (`cause`), as a reader says it.
/** @type {Record<string, string>} */
const CAUSE = {
  [CancelCause.User]: 'by the user',
  [CancelCause.Parent]: 'by its parent',
  [CancelCause.Archive]: 'by its archive',
  [CancelCause.Shutdown]: 'the daemon shut down',
  [InterruptCause.Crash]: 'the daemon stopped',
  [CancelCause.Budget]: 'its tree spent a hard budget',
};

export class TimelineView {
  /**
   * `actions.answer(seq, optionId)` answers a permission; `actions.older()` pages back.
   * @param {string} agentId
   * @param {{answer: (seq: number, optionId: string) => Promise<unknown>, older: () => unknown}} actions
   */
  constructor(agentId, actions) {
    this.agentId = agentId;
    this.actions = actions;
    /** @type {Map<number, Entry>} */
    this.items = new Map();
    /** @type {Set<Entry>} */
    this.dirty = new Set();
    /** @type {number | null} */
    this.frame = null;
    /** The height the last frame left; undefined before the first. @type {number | undefined} */
    this.lastHeight = undefined;
    this.hasOlder = false;
    this.loadingOlder = false;
    this.older = h('button', { class: 'older', type: 'button', hidden: true, onclick: () => this.actions.older() }, 'Load older messages');
    this.list = h('div', { class: 'items' });
    this.el = h('div', { class: 'timeline', role: 'log', 'aria-label': 'Timeline', 'aria-live': 'polite', tabindex: '0' }, this.older, this.list);
    this.observer = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting) && this.hasOlder && !this.loadingOlder) this.actions.older();
    }, { root: this.el });
    this.observer.observe(this.older);
  }

  firstSeq() {
    /** @type {number | null} */
    let min = null;
    for (const seq of this.items.keys()) if (min === null || seq < min) min = seq;
    return min;
  }

  /**
   * Replaces everything with `items` (oldest first).
   * @param {Item[]} items
   * @param {boolean} hasOlder
   */
  reset(items, hasOlder) {
    this.items.clear();
    this.list.replaceChildren();
    for (const item of items) this.add(item);
    this.setOlder(hasOlder);
    this.stick();
  }

  /** @param {boolean} hasOlder */
  setOlder(hasOlder) {
    this.hasOlder = hasOlder;
    this.older.hidden = !hasOlder;
  }

  /**
   * Older items (a `timeline_page`) go in before the first, keeping the scroll position.
   * @param {Item[]} items
   * @param {boolean} hasOlder
   */
  prepend(items, hasOlder) {
    const before = this.el.scrollHeight - this.el.scrollTop;
    const first = this.list.firstChild;
    for (const item of items) {
      if (this.items.has(item.seq)) continue;
      const entry = this.build(item);
      this.list.insertBefore(entry.el, first);
    }
    this.setOlder(hasOlder);
    this.el.scrollTop = this.el.scrollHeight - before;
    this.lastHeight = this.el.scrollHeight;
  }

  /** @param {Item} item */
  add(item) {
    if (this.items.has(item.seq)) return;
    const entry = this.build(item);
    this.list.appendChild(entry.el);
  }

  /**
   * @param {Item} item
   * @returns {Entry}
   */
  build(item) {
    const entry = { item, el: h('div', { class: `item kind-${item.kind}`, dataset: { seq: item.seq } }) };
    this.items.set(item.seq, entry);
    this.render(entry);
    return entry;
  }

  /**
   * Applies one notification; returns the item it touched. It reads no layout (a streaming
   * agent sends dozens a second): the frame that follows re-renders and scrolls.
   * @param {Notification} n
   * @returns {Item | null}
   */
  apply(n) {
    let entry = null;
    if (n.op === 'item') {
      this.add(n.item);
      entry = this.items.get(n.item.seq);
      this.schedule();
    } else if (n.op === 'append') {
      entry = this.items.get(n.seq);
      if (entry) {
        entry.item.data[n.field] = (entry.item.data[n.field] || '') + n.text;
        this.later(entry);
      }
    } else if (n.op === 'patch') {
      entry = this.items.get(n.seq);
      if (entry) {
        // New text for a message replaces it whole: render it again from the start.
        if ('text' in n.fields) entry.stream = null;
        Object.assign(entry.item.data, n.fields);
        if (n.at) entry.item.updatedAt = n.at;
        this.later(entry);
      }
    }
    return entry?.item ?? null;
  }

  /**
   * Re-renders an item at the next frame, however many chunks arrive before it.
   * @param {Entry} entry
   */
  later(entry) {
    this.dirty.add(entry);
    this.schedule();
  }

  /**
   * One frame for everything that changed since the last: re-render the dirty items, and
   * keep following the bottom if the view was there (measured against the height the last
   * frame left, so nothing forces a layout between frames).
   */
  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = null;
      const follow = this.lastHeight === undefined
        || this.el.scrollTop + this.el.clientHeight >= this.lastHeight - 80;
      for (const e of this.dirty) this.render(e);
      this.dirty.clear();
      if (follow) this.el.scrollTop = this.el.scrollHeight;
      this.lastHeight = this.el.scrollHeight;
    });
  }

  stick() {
    this.el.scrollTop = this.el.scrollHeight;
    this.lastHeight = this.el.scrollHeight;
  }

  /** @param {Entry} entry */
  render(entry) {
    const { item, el } = entry;
    const d = item.data || {};
    if (item.kind === ItemKind.AgentMessage) {
      if (!entry.stream) {
        const box = h('div', { class: 'text md' });
        entry.stream = new MarkdownStream(box);
        el.replaceChildren(box);
      }
      entry.stream.push(d.text ?? '');
      d.text = '';
      entry.stream.render();
      return;
    }
    const open = /** @type {HTMLDetailsElement | null} */ (el.querySelector(':scope > details'))?.open;
    /** @type {Array<Node | Node[]>} */
    let body;
    switch (item.kind) {
      case ItemKind.UserMessage:
        body = [
          h('div', { class: 'who' }, 'You', d.delivery && d.delivery !== 'followup' ? h('span', { class: 'badge' }, d.delivery) : null,
            d.source && d.source !== 'user' ? h('span', { class: 'badge' }, `from ${d.source}`) : null),
          (d.context || []).map((/** @type {string | {text?: string}} */ c) => h('div', { class: 'context' }, typeof c === 'string' ? c : c.text ?? JSON.stringify(c))),
          h('div', { class: 'text plain' }, d.text ?? ''),
        ];
        break;
      case ItemKind.AgentThought:
        body = [h('details', { open }, h('summary', null, 'Thought'), h('div', { class: 'text plain muted' }, d.text ?? ''))];
        break;
      case ItemKind.ToolCall:
        body = [toolCall(d, open)];
        break;
      case ItemKind.Permission:
        body = [this.permission(item)];
        break;
      case ItemKind.Plan:
        body = [h('div', { class: 'plan', role: 'group', 'aria-label': 'Plan' }, h('div', { class: 'who' }, 'Plan'),
          h('ul', { class: 'checklist' }, (d.entries || []).map((/** @type {{status?: string, content?: string}} */ e) => h('li', { class: `plan-${e.status}` },
            h('input', { type: 'checkbox', disabled: true, checked: e.status === 'completed', 'aria-label': e.status }),
            ' ', e.content ?? ''))))];
        break;
      case ItemKind.Notice:
        body = [h('div', { class: 'notice' }, d.text ?? d.message ?? JSON.stringify(d))];
        break;
      case ItemKind.TurnEnded: {
        const label = TURN_END[d.event] || d.event;
        const why = d.error || d.reason || CAUSE[d.cause] || d.cause || (d.stopReason && !['end_turn', 'cancelled'].includes(d.stopReason) ? d.stopReason : '');
        body = [h('div', { class: `turn-end ${d.event}` }, label, why ? `: ${why}` : '')];
        break;
      }
      case ItemKind.Mode:
        body = [h('div', { class: 'notice' }, `Mode: ${d.modeId}`)];
        break;
      default:
        // turn_started, usage, config, commands, session info, raw: kept, not shown.
        el.hidden = true;
        body = [];
    }
    el.replaceChildren(...body.flat());
  }

  /** @param {Item} item */
  permission(item) {
    const d = item.data;
    const pending = d.status === 'pending';
    const card = h('div', { class: `permission ${pending ? 'pending' : 'answered'}`, role: 'group', 'aria-label': `Permission: ${d.title ?? ''}` },
      h('div', { class: 'who' }, pending ? 'Permission needed' : 'Permission'),
      h('div', { class: 'perm-title' }, d.title ?? 'The agent asks for permission'));
    if (pending) {
      card.appendChild(h('div', { class: 'perm-options' }, (d.options || []).map((/** @type {PermissionOption} */ o) => h('button', {
        type: 'button',
        class: o.kind?.startsWith('allow') ? 'primary' : '',
        dataset: { optionId: o.optionId },
        onclick: (e) => {
          for (const b of card.querySelectorAll('button')) b.disabled = true;
          this.actions.answer(item.seq, o.optionId).catch(() => { for (const b of card.querySelectorAll('button')) b.disabled = false; });
          /** @type {HTMLElement} */ (e.currentTarget).classList.add('chosen');
        },
      }, o.name ?? o.optionId))));
    } else {
      const chosen = (d.options || []).find((/** @type {PermissionOption} */ o) => o.optionId === d.optionId || o.optionId === d.outcome?.optionId);
      const what = chosen?.name ?? d.kind ?? (typeof d.outcome === 'string' ? d.outcome : d.outcome?.outcome) ?? 'answered';
      card.appendChild(h('div', { class: 'perm-answer' }, `Answered: ${what}`));
    }
    return card;
  }
}

/**
 * @param {any} d a tool call's data: ACP's, open (see `Item`)
 * @param {boolean | undefined} open
 */
function toolCall(d, open) {
  const status = d.status || 'pending';
  /** @type {Node[]} */
  const parts = [];
  if (d.rawInput !== undefined) parts.push(h('div', { class: 'label' }, 'Input'), h('pre', { class: 'code' }, fmt(d.rawInput)));
  for (const c of d.content || []) {
    if (c.type === 'diff') parts.push(diff(c));
    else if (c.type === 'content' && c.content?.type === 'text') parts.push(h('pre', { class: 'code out' }, c.content.text));
    else if (c.type === 'terminal') parts.push(h('div', { class: 'muted' }, `terminal ${c.terminalId}`));
    else parts.push(h('pre', { class: 'code out' }, fmt(c)));
  }
  if (d.rawOutput !== undefined) parts.push(h('div', { class: 'label' }, 'Output'), h('pre', { class: 'code out' }, fmt(d.rawOutput)));
  return h('details', { class: `tool status-${status}`, open },
    h('summary', null, h('span', { class: 'badge' }, d.kind || 'tool'), ' ', h('span', { class: 'tool-title' }, d.title || d.toolCallId || 'tool call'),
      ' ', h('span', { class: `tool-status status-${status}` }, status.replace('_', ' '))),
    h('div', { class: 'tool-body' }, parts.length ? parts : h('div', { class: 'muted' }, 'no details')));
}

/** @param {unknown} v */
function fmt(v) {
  return typeof v === 'string' ? v : JSON.stringify(v, null, 2);
}

/**
 * A diff from ACP's `{path, oldText, newText}`: a line-level unified view (small LCS).
 * @param {{path?: string, oldText?: string | null, newText?: string | null}} c
 */
function diff(c) {
  const a = (c.oldText ?? '').split('\n');
  const b = (c.newText ?? '').split('\n');
  return h('div', { class: 'diff' }, h('div', { class: 'label' }, c.path ?? 'diff'), diffLines(a, b));
}

/**
 * @param {string[]} a
 * @param {string[]} b
 */
export function diffLines(a, b) {
  const pre = h('pre', { class: 'code diff-body' });
  // Past this size the quadratic table is too big: show old and new whole.
  if (a.length * b.length > 250000) {
    for (const l of a) pre.appendChild(h('span', { class: 'del' }, `-${l}\n`));
    for (const l of b) pre.appendChild(h('span', { class: 'add' }, `+${l}\n`));
    return pre;
  }
  const n = a.length; const m = b.length;
  const t = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) t[i][j] = a[i] === b[j] ? t[i + 1][j + 1] + 1 : Math.max(t[i + 1][j], t[i][j + 1]);
  let i = 0; let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { pre.appendChild(h('span', { class: 'ctx' }, ` ${a[i]}\n`)); i++; j++; }
    else if (j < m && (i >= n || t[i][j + 1] >= t[i + 1][j])) { pre.appendChild(h('span', { class: 'add' }, `+${b[j]}\n`)); j++; }
    else { pre.appendChild(h('span', { class: 'del' }, `-${a[i]}\n`)); i++; }
  }
  return pre;
}
