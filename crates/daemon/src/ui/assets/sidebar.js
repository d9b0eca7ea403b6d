// The sidebar: the fleet's workspaces and root agents, grouped by project, as a windowed list.
//
// Two halves. The *model* is one entry per row (a project, a workspace, an agent) with its
// height, built from the page's state in one pass over the agents; the filter reads an index
// of each agent's searchable text instead of the DOM. The *window* puts in the DOM only the
// rows in view and a screen's worth around them, each row built once and rebuilt only when
// what it shows changed. So with 10,000 agents a status change redraws one row, and the order
// it may change follows within `REORDER_MS` with one model build, however many changed.
import { h, plural, byText } from './dom.js';
import { WorkspaceKind } from './protocol.gen.js';
/** @typedef {import('./protocol.gen.js').AgentInfo} AgentInfo */
/** @typedef {import('./protocol.gen.js').WorkspaceInfo} WorkspaceInfo */

/** Rows kept in the DOM above and below the visible ones, so a fast scroll shows no gap. */
const OVERSCAN = 20;
/** How long a change that can only move rows (a status, an attention) waits to reorder them. */
const REORDER_MS = 250;

/**
 * What the rows show and do: the page's state (`S`, the parts the sidebar reads) and its
 * helpers, from app.js.
 * @typedef {{
 *   S: {agents: Map<string, AgentInfo>, workspaces: Map<string, WorkspaceInfo>, filter: string,
 *     quick: string | null, showArchived: boolean, synced: boolean, collapsed: Record<string, boolean>,
 *     layout: {active: string | null}},
 *   label: (a: AgentInfo) => string, dot: (status: string) => HTMLElement,
 *   hostBadge: (name: string | null | undefined) => HTMLElement | null,
 *   hostKey: (name: string | null | undefined) => string,
 *   attentionMark: (a: AgentInfo) => HTMLElement | null, quickMatch: (a: AgentInfo) => boolean,
 *   reason: (a: AgentInfo) => string, openAgent: (id: string) => void,
 *   unarchive: (id: string) => unknown, newAgentDialog: (workspaceId: string | null) => unknown,
 *   showChanges: (w: WorkspaceInfo) => unknown, toggleWorkspace: (id: string) => void,
 *   onPaint: (rows: number) => void,
 * }} SidebarCtx
 */

/**
 * What a root's subagents ask of their user: how many, and the one to open.
 * @typedef {{n: number, first: AgentInfo}} Rollup
 */

/**
 * @typedef {{ kind: 'project', key: string, project: string, host: string | null }} ProjectEntry
 * @typedef {{ kind: 'workspace', key: string, w: WorkspaceInfo, count: number, collapsed: boolean }} WorkspaceEntry
 * @typedef {{ kind: 'agent', key: string, a: AgentInfo, kids: number, roll: Rollup | null, sub: boolean }} AgentEntry
 * @typedef {ProjectEntry | WorkspaceEntry | AgentEntry} Entry
 */

export class Sidebar {
  /**
   * @param {HTMLElement} list the `<ul>` the rows go in
   * @param {HTMLElement} scroller the element that scrolls it
   * @param {SidebarCtx} ctx what the rows show and do
   */
  constructor(list, scroller, ctx) {
    this.list = list;
    this.scroller = scroller;
    this.ctx = ctx;
    /** @type {Entry[]} */
    this.entries = [];
    /** Each entry's top, and the whole list's height last. */
    this.tops = new Float64Array(1);
    /**
     * Row elements by entry key: `{sig, el}`, `sig` saying what the row shows.
     * @type {Map<string, {sig: string, el: HTMLElement}>}
     */
    this.rows = new Map();
    /**
     * Each agent object's activity time and, once a filter looked, its searchable text (a new
     * object on each change).
     * @type {WeakMap<AgentInfo, {text: string | null, at: number}>}
     */
    this.index = new WeakMap();
    /** @type {Element[]} */
    this.shown = [];
    /** @type {{project: number, workspace: number, agent: number} | null} */
    this.heights = null;
    this.stale = true;
    /** The window was resized: row heights may have changed (a phone's rows are taller). */
    this.resized = false;
    this.narrowed = false;
    /** How many root rows the model holds (read by the benchmark). */
    this.agentRows = 0;
    this.frame = 0;
    /** @type {ReturnType<typeof setTimeout> | 0} */
    this.reorder = 0;
    scroller.addEventListener('scroll', () => this.schedule(), { passive: true });
    addEventListener('resize', () => { this.resized = true; this.schedule(); });
  }

  /** What the rows are made of changed (agents added, archived or moved, the filter): the
   * model is built again at the next frame. */
  invalidate() {
    this.stale = true;
    this.schedule();
  }

  /** An agent's row shows something new (a status, an attention): it is redrawn at the next
   * frame; the rows it may move (an order by activity, a filter, a root's roll-up) follow
   * within `REORDER_MS`. */
  touch() {
    this.schedule();
    if (this.reorder) return;
    this.reorder = setTimeout(() => { this.reorder = 0; this.invalidate(); }, REORDER_MS);
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      if (this.stale) {
        this.stale = false;
        this.build();
      } else if (this.resized) {
        this.layout();
      }
      this.paint();
      this.ctx.onPaint(this.agentRows);
    });
  }

  /** When an agent was last active, read once per version of the agent.
   * @param {AgentInfo} a
   */
  indexed(a) {
    let found = this.index.get(a);
    if (!found) {
      found = { text: null, at: Date.parse(a.lastActivityAt || a.createdAt) || 0 };
      this.index.set(a, found);
    }
    return found;
  }

  /** The text the filter looks in, made once per version of the agent (and only once a
   * filter looks).
   * @param {AgentInfo} a
   */
  text(a) {
    const found = this.indexed(a);
    found.text ??= `${a.title ?? ''} ${a.type} ${a.id} ${a.cwd}`.toLowerCase();
    return found.text;
  }

  /** The model: every row in order, from the page's state. */
  build() {
    const { S } = this.ctx;
    const filter = S.filter.trim().toLowerCase();
    // The text filter and the quick filter look at every agent, subagents too: a root shows
    // when it or one of its subagents matches, with the subagents that do under it.
    const narrowed = Boolean(filter || S.quick);
    /** @param {AgentInfo} a */
    const matches = (a) => (!filter || this.text(a).includes(filter)) && this.ctx.quickMatch(a);
    /** @type {Map<string, AgentInfo[]>} */
    const roots = new Map();
    /** @type {Map<string, AgentInfo[]>} */
    const kidsOf = new Map();
    /** @type {Map<string, number>} */
    const childCount = new Map();
    // What subagents ask of their user rolls up to their root: how many, and the one to open
    // (a permission first, since it blocks a turn).
    /** @type {Map<string, Rollup>} */
    const rollup = new Map();
    for (const a of S.agents.values()) {
      if (!a.parentAgentId) {
        if (a.archivedAt && !S.showArchived) continue;
        pushTo(roots, a.workspaceId, a);
        continue;
      }
      if (a.archivedAt) continue;
      childCount.set(a.parentAgentId, (childCount.get(a.parentAgentId) || 0) + 1);
      if (narrowed) {
        pushTo(kidsOf, a.parentAgentId, a);
      }
      if (!a.requiresAttention || a.attentionReason === 'finished') continue;
      let root = a;
      for (let i = 0; i < 64 && root.parentAgentId; i++) {
        const up = S.agents.get(root.parentAgentId);
        if (!up) break;
        root = up;
      }
      // A new roll-up's first is this agent (what the test below would make it).
      const r = rollup.get(root.id) || { n: 0, first: a };
      r.n += 1;
      if (!r.first || (a.attentionReason === 'permission' && r.first.attentionReason !== 'permission')) r.first = a;
      rollup.set(root.id, r);
    }
    /** @type {Map<string, AgentInfo[]>} */
    const hits = new Map();
    if (narrowed) {
      for (const [workspaceId, list] of roots) {
        const kept = list.filter((a) => {
          /** @type {AgentInfo[]} */
          const found = [];
          const queue = [...(kidsOf.get(a.id) || [])];
          for (let i = 0; i < queue.length && i < 10000; i++) {
            const d = queue[i];
            if (matches(d)) found.push(d);
            queue.push(...(kidsOf.get(d.id) || []));
          }
          if (!matches(a) && !found.length) return false;
          hits.set(a.id, found);
          return true;
        });
        roots.set(workspaceId, kept);
      }
    }
    // Group by project: a worktree counts under the checkout it was made from; another host's
    // checkout is another project, even at the same path.
    /** @type {Map<string, WorkspaceInfo[]>} */
    const projects = new Map();
    for (const w of S.workspaces.values()) {
      if (w.archivedAt && !S.showArchived) continue;
      const agents = roots.get(w.id) || [];
      if (narrowed && !agents.length && (S.quick || !w.name.toLowerCase().includes(filter))) continue;
      const project = `${w.host ? `${w.host}:` : ''}${w.worktree?.source || w.path}`;
      pushTo(projects, project, w);
    }
    /** @type {Entry[]} */
    const entries = [];
    let agentRows = 0;
    const byName = [...projects].sort((x, y) => byText(basename(x[0]), basename(y[0])));
    for (const [project, wss] of byName) {
      entries.push({ kind: 'project', key: `p:${project}`, project, host: wss[0].host ?? null });
      wss.sort((x, y) => Number(x.kind === WorkspaceKind.Worktree) - Number(y.kind === WorkspaceKind.Worktree) || byText(x.name, y.name));
      for (const w of wss) {
        const agents = roots.get(w.id) || [];
        const collapsed = Boolean(S.collapsed[w.id]);
        entries.push({ kind: 'workspace', key: `w:${w.id}`, w, count: agents.length, collapsed });
        if (collapsed) continue;
        // The most recently active first; each agent's time read once, not at each comparison.
        const recent = agents.map((a) => ({ at: this.indexed(a).at, a })).sort((x, y) => y.at - x.at);
        agentRows += recent.length;
        for (const { a } of recent) {
          entries.push({ kind: 'agent', key: `a:${a.id}`, a, kids: childCount.get(a.id) || 0, roll: rollup.get(a.id) ?? null, sub: false });
          for (const d of hits.get(a.id) || []) entries.push({ kind: 'agent', key: `s:${d.id}`, a: d, kids: 0, roll: null, sub: true });
        }
      }
    }
    this.entries = entries;
    this.agentRows = agentRows;
    this.narrowed = narrowed;
    this.layout(true);
  }

  /**
   * Each row's top, from each kind of row's height: after a build (`rebuilt`), else only when
   * a resize changed a height.
   * @param {boolean} [rebuilt]
   */
  layout(rebuilt = false) {
    const before = this.heights;
    if (this.resized) this.heights = null;
    this.resized = false;
    const heights = this.rowHeights();
    const same = before && heights.project === before.project && heights.workspace === before.workspace && heights.agent === before.agent;
    if (same && !rebuilt) return;
    const { entries } = this;
    const tops = new Float64Array(entries.length + 1);
    for (let i = 0; i < entries.length; i++) tops[i + 1] = tops[i] + heights[entries[i].kind];
    this.tops = tops;
  }

  /** Each kind of row's height in pixels, as the stylesheet fixes it (`--row-*` on the list). */
  rowHeights() {
    if (!this.heights) {
      const style = getComputedStyle(this.list);
      /**
       * @param {string} name
       * @param {number} fallback
       */
      const px = (name, fallback) => parseFloat(style.getPropertyValue(name)) || fallback;
      this.heights = { project: px('--row-project', 28), workspace: px('--row-workspace', 32), agent: px('--row-agent', 32) };
    }
    return this.heights;
  }

  /** The window: the rows in view, in order, with the height of the rest as padding. */
  paint() {
    const { entries, tops } = this;
    const n = entries.length;
    if (!n) {
      const { S } = this.ctx;
      const text = S.synced ? (this.narrowed ? 'Nothing matches the filter.' : 'No agents yet. Start one with “New agent”.') : '';
      this.list.style.padding = '0';
      this.list.replaceChildren(h('li', { class: 'empty' }, text));
      this.shown = [];
      return;
    }
    const offset = this.list.offsetTop - this.scroller.offsetTop;
    const viewTop = Math.max(0, this.scroller.scrollTop - offset);
    const viewBottom = viewTop + (this.scroller.clientHeight || innerHeight);
    let first = firstBelow(tops, viewTop);
    let last = first;
    while (last < n && tops[last] < viewBottom) last++;
    first = Math.max(0, first - OVERSCAN);
    last = Math.min(n, last + OVERSCAN);
    /** @type {HTMLElement[]} */
    const els = [];
    for (let i = first; i < last; i++) els.push(this.row(entries[i]));
    // Only the rows in the window are kept: one scrolled back into it is built again.
    if (this.rows.size > els.length) {
      const kept = new Set();
      for (let i = first; i < last; i++) kept.add(entries[i].key);
      for (const key of this.rows.keys()) if (!kept.has(key)) this.rows.delete(key);
    }
    this.list.style.paddingTop = `${tops[first]}px`;
    this.list.style.paddingBottom = `${tops[n] - tops[last]}px`;
    if (els.length === this.shown.length && els.every((el, i) => el === this.shown[i])) return;
    // Rows that stay keep their place (and their focus); new ones go in between.
    let at = this.list.firstChild;
    for (const el of els) {
      if (at === el) { at = at.nextSibling; continue; }
      this.list.insertBefore(el, at);
    }
    while (at) {
      const next = at.nextSibling;
      at.remove();
      at = next;
    }
    this.shown = els;
  }

  /**
   * One row's element: the one built before while what it shows is the same.
   * @param {Entry} entry
   * @returns {HTMLElement}
   */
  row(entry) {
    const sig = this.signature(entry);
    const hit = this.rows.get(entry.key);
    if (hit && hit.sig === sig) return hit.el;
    const el = entry.kind === 'agent' ? this.agentRow(entry)
      : entry.kind === 'workspace' ? this.workspaceRow(entry)
        : this.projectRow(entry);
    this.rows.set(entry.key, { sig, el });
    return el;
  }

  /** @param {Entry} entry */
  signature(entry) {
    const { S } = this.ctx;
    switch (entry.kind) {
      case 'project': return `${entry.project}|${this.ctx.hostKey(entry.host)}`;
      case 'workspace': {
        const { w } = entry;
        return `${w.name}|${w.kind}|${w.activity}|${entry.count}|${entry.collapsed}`;
      }
      default: {
        const { a, roll } = entry;
        return `${a.status}|${a.title}|${a.type}|${a.requiresAttention}|${a.attentionReason}|${a.archivedAt}|${a.limited ? a.limited.retryAt : ''}|${entry.kids}|${S.layout.active === a.id}|${roll ? `${roll.n}|${roll.first.id}|${roll.first.attentionReason}|${this.ctx.label(roll.first)}` : ''}`;
      }
    }
  }

  /** @param {ProjectEntry} entry */
  projectRow({ project, host }) {
    return h('li', { class: 'project-head', dataset: { project } },
      h('span', { class: 'project-name', title: project }, basename(project)), this.ctx.hostBadge(host));
  }

  /** @param {WorkspaceEntry} entry */
  workspaceRow({ w, count, collapsed }) {
    const { ctx } = this;
    return h('li', { class: 'workspace', dataset: { workspaceId: w.id } },
      h('div', { class: 'ws-head' },
        h('button', { type: 'button', class: 'ws-toggle', 'aria-expanded': String(!collapsed), onclick: () => ctx.toggleWorkspace(w.id) },
          h('span', { class: `activity activity-${w.activity ?? 'none'}`, role: 'img', 'aria-label': `activity ${w.activity ?? 'none'}`, title: w.activity ?? 'no activity' }),
          h('span', { class: 'ws-name' }, w.kind === WorkspaceKind.Worktree ? `⎇ ${w.name}` : w.name),
          h('span', { class: 'count' }, count)),
        w.kind !== WorkspaceKind.Directory ? h('button', { type: 'button', class: 'icon', title: 'Changes', 'aria-label': `Changes in ${w.name}`, onclick: () => ctx.showChanges(w) }, '±') : null,
        h('button', { type: 'button', class: 'icon', title: 'New agent here', 'aria-label': `New agent in ${w.name}`, onclick: () => ctx.newAgentDialog(w.id) }, '+')));
  }

  /**
   * A root's row, or (`sub`) a subagent's that a filter found, under its root.
   * @param {AgentEntry} entry
   */
  agentRow({ a, kids, roll, sub }) {
    const { ctx } = this;
    const active = ctx.S.layout.active === a.id;
    return h('li', { class: `agent-row${sub ? ' sub' : ''}${active ? ' active' : ''}${a.archivedAt ? ' archived' : ''}`, dataset: { agentId: a.id } },
      h('button', { type: 'button', class: 'open', onclick: () => ctx.openAgent(a.id), 'aria-current': active ? 'page' : null },
        ctx.dot(a.status),
        h('span', { class: 'title' }, ctx.label(a)),
        h('span', { class: 'provider' }, a.type),
        kids ? h('span', { class: 'kids', title: plural(kids, 'subagent', 'subagents') }, `+${kids} sub`) : null,
        ctx.attentionMark(a)),
      roll ? h('button', {
        type: 'button', class: `small sub-attention reason-${roll.first.attentionReason}`,
        title: `${plural(roll.n, 'subagent needs', 'subagents need')} you: open “${ctx.label(roll.first)}”, which ${ctx.reason(roll.first)}`,
        'aria-label': `! ${roll.n} sub: ${plural(roll.n, 'subagent needs', 'subagents need')} you; open ${ctx.label(roll.first)}`,
        onclick: () => ctx.openAgent(roll.first.id),
      }, `! ${roll.n} sub`) : null,
      a.archivedAt ? h('button', { type: 'button', class: 'small', onclick: () => ctx.unarchive(a.id) }, 'Unarchive') : null);
  }
}

/**
 * Appends `value` to the list at `key` in `map`, made on first use.
 * @template K, V
 * @param {Map<K, V[]>} map
 * @param {K} key
 * @param {V} value
 */
function pushTo(map, key, value) {
  const list = map.get(key);
  if (list) list.push(value);
  else map.set(key, [value]);
}

/**
 * The index of the first row whose bottom is below `y` (binary search over the tops).
 * @param {Float64Array} tops
 * @param {number} y
 */
function firstBelow(tops, y) {
  let lo = 0;
  let hi = tops.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (tops[mid + 1] <= y) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * A path's last part.
 * @param {string} p
 */
export function basename(p) { return (p || '').replace(/\/+$/, '').split('/').pop() || p; }
