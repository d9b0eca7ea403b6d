// drover's web UI: the sidebar of workspaces and agents, per-browser tabs, the agent pane with
// its timeline, jobs, subagents track and composer, and the dialogs. It speaks the client protocol
// (docs/protocol.md) and nothing else.
import { Conn, ProtocolError, errorMessage, isOffline } from './conn.js';
import { ClientType, DaemonType, HostState, RuntimeState, WorkspaceKind } from './protocol.gen.js';
import { h, plural, modal, confirmDialog, ago, byId, within, byText } from './dom.js';
import { TimelineView } from './timeline.js';
import { startCard, startCardKey, startWhen, retryIn } from './startcard.js';
import { Sidebar } from './sidebar.js';
import { Terminals } from './terminal.js';
/** @typedef {import('./protocol.gen.js').AgentInfo} AgentInfo */
/** @typedef {import('./protocol.gen.js').ProviderInfo} ProviderInfo */
/** @typedef {import('./protocol.gen.js').DaemonMessage} DaemonMessage */
/** @typedef {import('./protocol.gen.js').Delivery} Delivery */
/** @typedef {import('./protocol.gen.js').HostInfo} HostInfo */
/** @typedef {import('./protocol.gen.js').JobInfo} JobInfo */
/** @typedef {import('./protocol.gen.js').QueuedMessageInfo} QueuedMessageInfo */
/** @typedef {import('./protocol.gen.js').ScheduleInfo} ScheduleInfo */
/** @typedef {import('./protocol.gen.js').WorkspaceInfo} WorkspaceInfo */
/** @typedef {import('./protocol.gen.js').ClientMessage} ClientMessage */
/**
 * What an agent's tree is busy with (an `agent_active` refusal's details, `archive_finished`'s
 * skipped agents): items per activity family.
 * @typedef {{families?: Record<string, Array<{title?: string, detail?: string}>>}} ActivityReport
 */
/** @typedef {import('./protocol.gen.js').PermissionPolicy} PermissionPolicy */
/**
 * A message in an agent's queue as this browser keeps it: the daemon's inbox (`theirs`: sent
 * by another client) and what this browser sent since (`at`: when, in ms).
 * @typedef {{messageId: string, text: string, delivery: Delivery, at: number, theirs?: boolean}} Queued
 */
/** @typedef {import('./timeline.js').Item} Item */
/**
 * An open job-output dialog's follow (`S.follows`).
 * @typedef {{session: string | null, push: (payload: JobOutputPush) => void, restart: () => void}} Follow
 */
/**
 * An agent's pane: its parts, and the key of what each part last showed (a part is built
 * again only when its key changes).
 * @typedef {{
 *   id: string, loaded: boolean, loading: boolean, root: HTMLElement, view: TimelineView,
 *   header: HTMLElement, headerKey?: string | null, startEl: HTMLElement, startKey?: string | null,
 *   startTimer?: ReturnType<typeof setTimeout>, jobsEl: HTMLElement, jobsKey?: string | null,
 *   terms: {el: HTMLElement, render: (workspaceId: string | null, usable: boolean) => void},
 *   track: HTMLElement, trackKey?: string | null, tree?: import('./protocol.gen.js').TreeSpendInfo | null,
 *   treeKey?: string | null, schedulesEl: HTMLElement, schedulesKey?: string | null, queuedEl: HTMLElement,
 *   queuedFor?: string | null, queuedTimer?: ReturnType<typeof setTimeout> | null, archivedEl: HTMLElement,
 *   archivedKey?: string | null, archivedElsewhere?: boolean, droppedEl: HTMLElement, droppedKey?: string | null,
 *   seen?: string | null, input: HTMLTextAreaElement, send: HTMLButtonElement, composerError: HTMLElement,
 *   quietEl: HTMLElement, quietShownEl: HTMLElement, quietSaidEl: HTMLElement, heardAt: number, quietText?: string,
 * }} Pane
 */
/** What a job's output answer or push carries. */
/** @typedef {Extract<DaemonMessage, {type: 'job_output_update'}>['payload']} JobOutputPush */

// ---- state ------------------------------------------------------------------------------

const store = {
  /**
   * @template T
   * @param {string} key
   * @param {T} fallback
   * @returns {T}
   */
  get(key, fallback) {
    try { const v = JSON.parse(localStorage.getItem(key) ?? 'null'); return v ?? fallback; } catch { return fallback; }
  },
  /**
   * @param {string} key
   * @param {unknown} value
   */
  set(key, value) {
    try { localStorage.setItem(key, JSON.stringify(value)); } catch { /* private mode: layout is per page then */ }
  },
};

const S = {
  /** @type {Map<string, AgentInfo>} */
  agents: new Map(),
  // The hosts this daemon links to, by name (`session_state`, then `host_update`).
  /** @type {Map<string, HostInfo>} */
  hosts: new Map(),
  // Every schedule by id (`list_schedules`, then `schedule_update`).
  /** @type {Map<string, ScheduleInfo>} */
  schedules: new Map(),
  /** @type {Map<string, WorkspaceInfo>} */
  workspaces: new Map(),
  // Every job of the daemon by id (`list_jobs` after each `session_state`, then `job_update`).
  /** @type {Map<string, JobInfo>} */
  jobs: new Map(),
  // The jobs whose output an open dialog follows, by id: `{session, push(payload), restart()}`.
  /** @type {Map<string, Follow>} */
  follows: new Map(),
  // The session's id (`welcome`): a new one after a reconnect.
  /** @type {string | null} */
  sessionId: null,
  /** @type {ProviderInfo[] | null} */
  providers: null,
  state: 'connecting',
  retryAt: 0,
  filter: '',
  // A quick filter: `needs` (needs me), `running`, `errors`, or none.
  /** @type {string | null} */
  quick: null,
  showArchived: false,
  // The agents whose track shows their archived subagents too.
  /** @type {Set<string>} */
  trackArchived: new Set(),
  // This browser's layout: which agents have tabs, which is in front.
  layout: store.get('drover.layout', /** @type {{tabs: string[], active: string | null}} */ ({ tabs: [], active: null })),
  // What the user typed and has not sent, per agent: survives reconnects and reloads.
  drafts: store.get('drover.drafts', /** @type {Record<string, string>} */ ({})),
  // The messages queued for each agent that have not started yet: the daemon's inbox as
  // `get_agent` last said it, with what this browser sent since.
  queued: store.get('drover.queued', /** @type {Record<string, Queued[]>} */ ({})),
  // Text of messages this browser queued that the daemon dropped before they ran (a Stop, an
  // archive, another client), per agent: offered back to the composer until taken or dismissed.
  dropped: store.get('drover.dropped', /** @type {Record<string, string[]>} */ ({})),
  /** @type {Record<string, Delivery>} */
  delivery: {},
  notify: store.get('drover.notify', false),
  /** @type {Map<string, Pane>} */
  panes: new Map(),
  collapsed: store.get('drover.collapsed', /** @type {Record<string, boolean>} */ ({})),
  synced: false,
};

// ---- the token --------------------------------------------------------------------------

// `#token=…` in the address: kept in localStorage and taken out of the address bar at once
// (fragments never reach the server, its logs or a referrer; the address bar is what remains).
// `#agent=<id>` (a notification's link): that agent's tab opens once the agents are known.
let linkedAgent = decodeURIComponent((/(?:^#|&)agent=([^&]+)/.exec(location.hash) || [])[1] || '') || null;
if (linkedAgent && !/(?:^#|&)token=/.test(location.hash)) history.replaceState(null, '', location.pathname + location.search);
// The same link followed in a page already open (the address typed or pasted into its bar)
// changes only the fragment: its agent opens too.
window.addEventListener('hashchange', () => {
  const id = decodeURIComponent((/(?:^#|&)agent=([^&]+)/.exec(location.hash) || [])[1] || '');
  if (!id || /(?:^#|&)token=/.test(location.hash)) return;
  history.replaceState(null, '', location.pathname + location.search);
  if (!S.synced) linkedAgent = id;
  else if (S.agents.has(id) && !S.agents.get(id)?.archivedAt) openAgent(id);
});

(function takeToken() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!m) return;
  store.set('drover.token', decodeURIComponent(m[1]));
  history.replaceState(null, '', location.pathname + location.search);
}());

const conn = new Conn({
  token: store.get('drover.token', null),
  onMessage,
  onState(state, info) {
    S.state = state;
    if (state === 'online') S.sessionId = info.sessionId ?? null;
    if (state === 'offline') S.retryAt = Date.now() + (info.retryInMs ?? 0);
    if (state !== 'online') S.synced = false;
    renderConnection();
    render();
  },
});

// The workspace terminals (terminal.js): their list, views and messages.
const terminals = new Terminals({ conn, failed, store, changed: () => render({ sidebar: false }) });

// ---- messages from the daemon -----------------------------------------------------------

/** @param {DaemonMessage} msg */
function onMessage(msg) {
  if (terminals.onMessage(msg)) return;
  switch (msg.type) {
    case DaemonType.SessionState:
      if (!timing.stateAt) timing.stateAt = performance.now();
      S.agents = new Map(msg.payload.agents.map((a) => [a.id, a]));
      S.workspaces = new Map(msg.payload.workspaces.map((w) => [w.id, w]));
      S.hosts = new Map((msg.payload.hosts || []).map((x) => [x.name, x]));
      S.synced = true;
      // Every subscription is gone after a reconnect or a resync: panes load again.
      for (const pane of S.panes.values()) pane.loaded = false;
      pruneLayout();
      if (linkedAgent && S.agents.has(linkedAgent) && !S.agents.get(linkedAgent)?.archivedAt) {
        if (!S.layout.tabs.includes(linkedAgent)) S.layout.tabs.push(linkedAgent);
        S.layout.active = linkedAgent;
        saveLayout();
      }
      linkedAgent = null;
      if (S.showArchived) loadArchived();
      conn.request({ type: ClientType.ListSchedules }).then((m) => {
        S.schedules = new Map(/** @type {ScheduleInfo[]} */ (m.payload.schedules).map((x) => [x.id, x]));
        render({ sidebar: false });
      }).catch(() => {});
      loadJobs();
      terminals.synced(S.sessionId);
      // A new session follows nothing: open job dialogs follow again from where they are.
      for (const f of S.follows.values()) if (f.session !== S.sessionId) f.restart();
      if (!S.providers) conn.request({ type: ClientType.ListProviders }).then((m) => { S.providers = m.payload.providers; }).catch(() => {});
      render();
      break;
    case DaemonType.AgentStatus:
    case DaemonType.AgentCreated: {
      const a = msg.payload.agent;
      const before = S.agents.get(a.id);
      S.agents.set(a.id, a);
      if (a.archivedAt) archived(a);
      else if (S.panes.get(a.id)?.loaded && (before?.status !== a.status || (S.queued[a.id] || []).length)) refreshQueued(a.id);
      if (a.requiresAttention && !(before && before.requiresAttention)) notifyAttention(a);
      // An open changes view reads git again when a turn in its workspace ends.
      if (openChanges && openChanges.workspaceId === a.workspaceId && before && busy(before) && !busy(a)) openChanges.load();
      sidebarChange(before, a);
      render({ sidebar: false });
      break;
    }
    case DaemonType.HostUpdate:
      if (msg.payload.host) S.hosts.set(msg.payload.name, msg.payload.host);
      else S.hosts.delete(msg.payload.name);
      render();
      break;
    case DaemonType.WorkspaceUpdate:
      if (msg.payload.workspace) S.workspaces.set(msg.payload.workspace.id, msg.payload.workspace);
      else { const w = S.workspaces.get(msg.payload.workspaceId); if (w) w.activity = msg.payload.activity; }
      render();
      break;
    case DaemonType.AgentUpdate: {
      const pane = S.panes.get(msg.payload.agentId);
      if (pane) pane.heardAt = Date.now();
      if (pane && pane.loaded) {
        const item = pane.view.apply(msg.payload.notification);
        if (item) settleQueued(msg.payload.agentId, [item]);
      }
      break;
    }
    case DaemonType.ScheduleUpdate:
      if (msg.payload.schedule) S.schedules.set(msg.payload.scheduleId, msg.payload.schedule);
      else S.schedules.delete(msg.payload.scheduleId);
      render({ sidebar: false });
      break;
    case DaemonType.JobUpdate:
      S.jobs.set(msg.payload.job.id, msg.payload.job);
      render({ sidebar: false });
      break;
    case DaemonType.JobOutputUpdate: {
      const f = S.follows.get(msg.payload.jobId);
      if (f) f.push(msg.payload);
      break;
    }
    case DaemonType.ResyncRequired:
      // Fell behind: every subscription was dropped; read everything again.
      conn.hello();
      break;
    default:
  }
}

/**
 * The one rule for which `AgentInfo` wins: the daemon's events (`session_state`,
 * `agent_status`, `agent_created`), in the order they arrive, always do. An answer to a
 * request (`agent_created` to `create_agent`, `initialize_agent_request`, `agents`, `agent`)
 * was read at some moment and may reach this page after a newer event: it only fills in an
 * agent this page has not heard of yet, and never overwrites what an event said.
 * @param {AgentInfo} info
 */
function learn(info) {
  if (S.agents.has(info.id)) return;
  S.agents.set(info.id, info);
  sidebarView.invalidate();
}

function pruneLayout() {
  const before = S.layout.tabs.length;
  S.layout.tabs = S.layout.tabs.filter((id) => S.agents.has(id) && !S.agents.get(id)?.archivedAt);
  if (!S.layout.active || !S.layout.tabs.includes(S.layout.active)) S.layout.active = S.layout.tabs[0] ?? null;
  if (before !== S.layout.tabs.length) saveLayout();
}

/**
 * An agent was archived. A tab whose message box holds unsent text stays open when the archive
 * came from elsewhere (another browser, the CLI, an agent, a cascade): its pane says so, keeps
 * the text and offers Unarchive. Otherwise its tab closes.
 * @param {AgentInfo} a
 */
function archived(a) {
  const here = archivingHere.delete(a.id);
  const pane = S.panes.get(a.id);
  if (pane?.archivedElsewhere) return;
  if (!here && S.layout.tabs.includes(a.id) && (S.drafts[a.id] || '').trim()) {
    if (pane) pane.archivedElsewhere = true;
    else keptArchived.add(a.id);
    return;
  }
  dropTabs(a.id);
}

/**
 * @param {string} id
 */
function dropTabs(id) {
  // An agent archived anywhere (here, another browser, the CLI, an agent, a cascade) leaves
  // this layout; its draft and queue go with it.
  if (S.layout.tabs.includes(id)) {
    closeTabLayoutOnly(id);
  }
  delete S.queued[id];
  store.set('drover.queued', S.queued);
}

function saveLayout() { store.set('drover.layout', S.layout); }

// ---- notifications and attention ---------------------------------------------------------

function attentionCount() {
  let n = 0;
  for (const a of S.agents.values()) if (a.requiresAttention && !a.archivedAt) n += 1;
  return n;
}

/**
 * @param {AgentInfo} a
 */
function notifyAttention(a) {
  if (!S.notify || typeof Notification === 'undefined' || Notification.permission !== 'granted') return;
  if (!document.hidden && S.layout.active === a.id) return;
  const n = new Notification(`${label(a)} ${reasonText(a) || 'needs you'}`, { body: a.cwd, tag: a.id });
  n.onclick = () => { window.focus(); openAgent(a.id); };
}

/** @type {Record<string, string>} */
const REASON = {
  permission: 'asks for a permission',
  finished: 'finished',
  error: 'failed',
  interrupted: 'was interrupted',
  auth_required: 'needs a sign-in',
  limited: 'waits for its usage limit',
  budget_warning: 'spent over 80 % of its budget',
};

/**
 * Why the agent needs its user, in words. A budget's warning stays its reason at 100 % too:
 * once the tree's spend as this browser sees it (a lower bound) reaches the budget, it says so.
 * @param {AgentInfo} a
 */
function reasonText(a) {
  if (a.attentionReason === 'budget_warning' && a.budget && budgetShare(a.budget, visibleTreeSum(a)) >= 1) {
    return 'spent its budget: nothing new starts until it is raised';
  }
  return REASON[a.attentionReason ?? ''];
}

// ---- helpers ------------------------------------------------------------------------------

/**
 * @param {{id: string, type: string, title?: string | null}} a
 */
function label(a) { return a.title || `${a.type} ${a.id.slice(-6)}`; }
/**
 * @param {AgentInfo} a
 */
function isRoot(a) { return !a.parentAgentId; }
/**
 * @param {string} id
 */
function children(id) {
  const out = [];
  for (const a of S.agents.values()) if (a.parentAgentId === id && !a.archivedAt) out.push(a);
  return out.sort((x, y) => byText(x.createdAt, y.createdAt));
}
/**
 * @param {AgentInfo} a
 */
function busy(a) { return a.status === 'running' || a.status === 'initializing'; }
/**
 * Whether a process runs for the agent: its runtime's state, as the daemon says it.
 * @param {AgentInfo} a
 */
function live(a) {
  return a.runtime?.state ?? RuntimeState.Cold;
}

/** What each runtime state means, on its badge's hover. */
const RUNTIME_TITLE = {
  [RuntimeState.Live]: 'the agent process runs',
  [RuntimeState.Starting]: 'its process is starting',
  [RuntimeState.Queued]: 'waits for a free slot under max_live',
  [RuntimeState.Cold]: 'no process: it starts when it gets work',
};

/**
 * @param {string} status
 * @param {string} [extra]
 */
function dot(status, extra = '') {
  return h('span', { class: `dot status-${status} ${extra}`, role: 'img', 'aria-label': status, title: status });
}

/** A passing message; `action` (`{text, run}`) adds a button that runs it and ends the toast. */
function saveDropped() { store.set('drover.dropped', S.dropped); }

/**
 * @param {string} text
 * @param {'info' | 'error'} [kind]
 * @param {{action?: {text: string, run: () => unknown} | null, ms?: number}} [options]
 */
function toast(text, kind = 'info', { action = null, ms = kind === 'error' ? 8000 : 4000 } = {}) {
  const el = h('div', { class: `toast ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, text,
    action ? h('button', { type: 'button', class: 'small toast-action', onclick: () => { el.remove(); action.run(); } }, action.text) : null);
  byId('toasts').appendChild(el);
  setTimeout(() => el.remove(), ms);
  return el;
}

/** How long the Unarchive of an archive made from a tab or the track is offered. */
const UNDO_MS = 8000;

/**
 * @param {string} id
 */
function unarchive(id) {
  const a = S.agents.get(id);
  // The subagents archived with it (by its archive's cascade: at the same moment or just after).
  const since = a?.archivedAt ? Date.parse(a.archivedAt) - 1000 : null;
  const cascaded = since === null ? [] : [...S.agents.values()].filter((x) => x.parentAgentId === id && x.archivedAt && Date.parse(x.archivedAt) >= since);
  return conn.request({ type: ClientType.Unarchive, agentId: id }).then(() => {
    // (Some were cascaded only if the agent is known.)
    if (!cascaded.length || !a) return;
    toast(`${plural(cascaded.length, 'subagent was', 'subagents were')} archived with “${label(a)}”.`, 'info', {
      action: { text: 'Bring back too', run: () => Promise.all(cascaded.map((x) => conn.request({ type: ClientType.Unarchive, agentId: x.id }))).catch(failed('Unarchive')) },
      ms: UNDO_MS,
    });
  }, failed('Unarchive'));
}

/**
 * @param {string} what
 */
function failed(what) {
  return (/** @type {unknown} */ e) => toast(`${what}: ${errorMessage(e)}`, 'error');
}

// ---- rendering ----------------------------------------------------------------------------

let frame = 0;
// What this page shows, as the daemon last heard it (`watching`): it sends no notification
// about the agent in front of the user. Told here, not in the animation frame, which a hidden
// page does not get.
/** @type {{session: string | null, agentId: string | null | undefined}} */
let watchingSent = { session: null, agentId: undefined };
function reportWatching() {
  if (S.state !== 'online' || !S.synced) return;
  const agentId = document.hidden ? null : (S.layout.active ?? null);
  if (watchingSent.session === S.sessionId && watchingSent.agentId === agentId) return;
  watchingSent = { session: S.sessionId, agentId };
  // The body says what the daemon acknowledged (for the browser tests).
  conn.request({ type: ClientType.Watching, agentId }).then(() => { document.body.dataset.watching = agentId ?? ''; }).catch(() => {});
}

/**
 * Draws what changed at the next frame. The sidebar is the costly part with thousands of
 * agents: `sidebar: 'model'` (what its rows are made of changed: agents, workspaces, the
 * filter) builds its model again; `'rows'` (which agent is open) redraws only the rows in view
 * whose look changed; `false` leaves it alone.
 * @param {{sidebar?: 'model' | 'rows' | false}} [what]
 */
function render({ sidebar = 'model' } = {}) {
  if (sidebar === 'model') sidebarView.invalidate();
  else if (sidebar === 'rows') sidebarView.schedule();
  reportWatching();
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    renderTabs();
    renderPane();
    const n = attentionCount();
    document.title = n ? `(${n}) drover` : 'drover';
  });
}

// When the first state arrived, when the sidebar first showed it, and how many root rows it
// holds (read by the benchmark).
const timing = { stateAt: 0, renderedAt: 0, rows: 0 };
/** @type {Window & {droverTiming?: typeof timing}} */ (window).droverTiming = timing;

/**
 * What a sidebar row shows of an agent (`touch`), or where it goes (`invalidate`).
 * @param {AgentInfo | undefined} before
 * @param {AgentInfo} a
 */
function sidebarChange(before, a) {
  if (!before || before.workspaceId !== a.workspaceId || before.parentAgentId !== a.parentAgentId || before.archivedAt !== a.archivedAt) {
    sidebarView.invalidate();
  } else if (`${before.status}|${before.title}|${before.type}|${before.requiresAttention}|${before.attentionReason}|${before.limited?.retryAt}|${before.lastActivityAt}`
    !== `${a.status}|${a.title}|${a.type}|${a.requiresAttention}|${a.attentionReason}|${a.limited?.retryAt}|${a.lastActivityAt}`) {
    sidebarView.touch();
  }
}

/**
 * The host a project is on, as its badge shows it: a change redraws the badge.
 * @param {string | null | undefined} name
 */
function hostKey(name) {
  const host = name ? S.hosts.get(name) : null;
  return name ? `${name}|${host?.state}|${host?.since}|${host?.error}` : '';
}

const sidebarView = new Sidebar(byId('workspaces'), within(document, '#sidebar nav'), {
  S, label, dot, hostBadge, hostKey, attentionMark, quickMatch, openAgent, unarchive, newAgentDialog, showChanges,
  reason: (/** @type {AgentInfo} */ a) => reasonText(a) || 'needs you',
  /** @param {string} id */
  toggleWorkspace(id) {
    S.collapsed[id] = !S.collapsed[id];
    store.set('drover.collapsed', S.collapsed);
    render();
  },
  /** @param {number} rows */
  onPaint(rows) {
    if (!timing.renderedAt && S.synced) timing.renderedAt = performance.now();
    timing.rows = rows;
  },
});

function renderConnection() {
  const el = byId('connection');
  el.replaceChildren();
  el.className = `connection ${S.state}`;
  if (S.state === 'online') {
    el.hidden = true;
  } else if (S.state === 'unauthorized') {
    el.hidden = true;
  } else {
    el.hidden = false;
    const secs = Math.max(0, Math.ceil((S.retryAt - Date.now()) / 1000));
    el.append(S.state === 'offline' ? `Offline: the daemon does not answer. Retrying${secs ? ` in ${secs} s` : ''}…` : 'Connecting…',
      S.state === 'offline' ? h('button', { type: 'button', onclick: () => conn.retry() }, 'Retry now') : '');
  }
  byId('login').hidden = S.state !== 'unauthorized';
  byId('app').hidden = S.state === 'unauthorized';
}
setInterval(() => { if (S.state === 'offline') renderConnection(); }, 1000);

// An agent retrying its model API (a refused key, a rate limit: claude's ten retries take
// minutes) sends nothing meanwhile: after QUIET_MS without a word during its turn, its pane
// says so (not while it waits for a permission answer, which is you). The silence is counted
// on the page's own clock, from when it received the agent's last item: the browser's clock
// need not be in step with the daemon's. The counter is shown, not announced: the live region
// says once that the turn is quiet, and speaks again only when the note goes and comes back.
const QUIET_MS = 30000;
const QUIET_SAYS = 'its turn still runs. An agent retrying its model API (after a refused key or a rate limit) says nothing meanwhile; Stop cancels the turn.';
setInterval(() => {
  for (const pane of S.panes.values()) {
    const a = S.agents.get(pane.id);
    const quiet = Date.now() - pane.heardAt;
    const show = Boolean(pane.loaded && a && a.status === 'running' && a.attentionReason !== 'permission' && quiet >= QUIET_MS);
    const text = show ? `Nothing from the agent for ${quiet < 60000 ? `${Math.floor(quiet / 1000)} s` : `${Math.floor(quiet / 60000)} min`}: ${QUIET_SAYS}` : '';
    if (text === (pane.quietText ?? '')) continue;
    pane.quietText = text;
    pane.quietEl.hidden = !show;
    pane.quietShownEl.textContent = text;
    const said = show ? `Nothing from the agent for ${QUIET_MS / 1000} s or more: ${QUIET_SAYS}` : '';
    if (pane.quietSaidEl.textContent !== said) pane.quietSaidEl.textContent = said;
  }
}, 1000);

/**
 * What a quick filter keeps.
 * @param {AgentInfo} a
 */
function quickMatch(a) {
  switch (S.quick) {
    case 'needs': return a.requiresAttention && a.attentionReason !== 'finished';
    case 'running': return busy(a);
    case 'errors': return a.status === 'error' || a.attentionReason === 'error' || Boolean(a.startFailure);
    default: return true;
  }
}

/**
 * The host a project is on, and whether it can be reached now (nothing for this machine).
 * @param {string | null | undefined} name
 */
function hostBadge(name) {
  if (!name) return null;
  const host = S.hosts.get(name);
  const up = host?.state === HostState.Reachable;
  const since = host ? new Date(host.since).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' }) : '';
  const title = up ? `on host ${name}` : `host ${name} is ${host?.state ?? 'gone'} since ${since}${host?.error ? `: ${host.error}` : ''}; its agents go on running there`;
  return h('span', { class: `host-badge${up ? '' : ' down'}`, title }, up ? `@${name}` : `@${name} · ${host?.state ?? 'gone'}`);
}

/**
 * What a row shows of the agent's attention: a sign-in it waits for is said in words.
 * @param {AgentInfo} a
 */
function attentionMark(a) {
  if (!a.requiresAttention) return null;
  if (a.attentionReason === 'auth_required') return h('span', { class: 'badge attention reason-auth_required', title: REASON.auth_required }, 'sign-in needed');
  if (a.attentionReason === 'limited' && a.limited) {
    const at = new Date(a.limited.retryAt);
    const when = at.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
    return h('span', { class: 'badge attention reason-limited', title: `${REASON.limited}: ${a.limited.error}` }, `limited until ${when}`);
  }
  return h('span', { class: `attention reason-${a.attentionReason}`, title: reasonText(a) }, a.attentionReason === 'permission' ? '!' : '●');
}

function loadArchived() {
  conn.request({ type: ClientType.ListAgents, includeArchived: true }).then((m) => {
    for (const a of m.payload.agents) learn(a);
    conn.request({ type: ClientType.ListWorkspaces, includeArchived: true }).then((w) => {
      for (const ws of w.payload.workspaces) if (!S.workspaces.has(ws.id)) S.workspaces.set(ws.id, ws);
      render();
    }).catch(() => {});
    render();
  }).catch(failed('Listing archived agents'));
}

// ---- tabs ---------------------------------------------------------------------------------

/**
 * @param {string} id
 */
function openAgent(id) {
  if (!S.layout.tabs.includes(id)) S.layout.tabs.push(id);
  S.layout.active = id;
  saveLayout();
  closeDrawer();
  render({ sidebar: 'rows' });
}

function closeDrawer() {
  document.body.classList.remove('drawer-open');
  byId('drawer-toggle').setAttribute('aria-expanded', 'false');
}

/**
 * @param {string} id
 */
function closeTabLayoutOnly(id) {
  const i = S.layout.tabs.indexOf(id);
  if (i < 0) return;
  S.layout.tabs.splice(i, 1);
  if (S.layout.active === id) S.layout.active = S.layout.tabs[Math.min(i, S.layout.tabs.length - 1)] ?? null;
  saveLayout();
  const pane = S.panes.get(id);
  if (pane) { pane.root.remove(); S.panes.delete(id); }
  render({ sidebar: 'rows' });
}

/**
 * A root agent's tab is its home: closing it archives it. A subagent's is only a view.
 * @param {string} id
 */
async function closeTab(id) {
  const a = S.agents.get(id);
  if (!a || a.archivedAt || !isRoot(a)) { closeTabLayoutOnly(id); return; }
  await archiveAgent(a, { undo: true });
}

/**
 * Archives `a`. An idle agent goes at once (or after `ask` confirms); when the daemon refuses
 * because work still runs, the dialog lists that work from the refusal and offers to stop it.
 */
/**
 * @param {AgentInfo} a
 * @param {{ask?: {title: string, body: string, confirm: string} | null, undo?: boolean}} [options]
 */
async function archiveAgent(a, { ask = null, undo = false } = {}) {
  if (ask && !(await confirmDialog(ask))) return false;
  // This page asked: its tab closes when the archive is announced (another client's archive
  // keeps a draft's tab open instead, see `archivedElsewhere`).
  archivingHere.add(a.id);
  const done = () => {
    if (undo) toast(`Archived “${label(a)}”.`, 'info', { action: { text: 'Unarchive', run: () => unarchive(a.id) }, ms: UNDO_MS });
    return true;
  };
  try {
    await conn.request({ type: ClientType.Archive, agentId: a.id });
    return done();
  } catch (e) {
    if (!(e instanceof ProtocolError) || e.code !== 'agent_active') { archivingHere.delete(a.id); failed('Archive')(e); return false; }
    const stop = await stopAndArchiveDialog(a, e.details);
    if (!stop) { archivingHere.delete(a.id); return false; }
    try {
      await conn.request({ type: ClientType.Archive, agentId: a.id, stopActivity: true });
      return done();
    } catch (e2) { archivingHere.delete(a.id); failed('Stop and archive')(e2); return false; }
  }
}

/** The agents this page archived itself (their announcement closes their tab at once). */
const archivingHere = new Set();
/** Tabs kept open with a draft after an archive from elsewhere, whose pane is not built yet. */
const keptArchived = new Set();

/** @type {Record<string, [string, string]>} */
const FAMILY = {
  turn: ['turn is running', 'turns are running'],
  subagent: ['subagent is running', 'subagents are running'],
  job: ['job is running', 'jobs are running'],
  schedule: ['schedule is active', 'schedules are active'],
};

/**
 * Plain-words lines for an activity report: `1 turn is running`, `2 subagents are running`.
 * @param {ActivityReport | null | undefined} report
 */
export function activityLines(report) {
  const lines = [];
  for (const [family, items] of Object.entries(report?.families || {})) {
    if (!items.length) continue;
    const [one, many] = FAMILY[family] || [`${family} item is running`, `${family} items are running`];
    lines.push({ family, text: `${items.length} ${items.length === 1 ? one : many}`, items });
  }
  return lines;
}

/**
 * @param {AgentInfo} a
 * @param {ActivityReport | null | undefined} report
 */
function stopAndArchiveDialog(a, report) {
  const lines = activityLines(report);
  return modal('Stop and archive', (close) => h('form', { onsubmit: (e) => { e.preventDefault(); close(true); } },
    h('h2', null, `“${label(a)}” is still working`),
    h('p', null, 'Archiving stops this work first:'),
    h('ul', { class: 'activity-list' }, lines.map((l) => h('li', { dataset: { family: l.family } }, h('strong', null, l.text),
      h('ul', null, l.items.map((it) => h('li', null, [it.title, it.detail].filter(Boolean).join(': '))))))),
    h('div', { class: 'dialog-actions' },
      h('button', { type: 'button', onclick: () => close(false) }, 'Cancel'),
      h('button', { type: 'submit', class: 'danger', autofocus: true }, 'Stop and archive'))), { className: 'stop-archive' });
}

function renderTabs() {
  const bar = byId('tabs');
  const tabs = S.layout.tabs.map((id) => {
    const a = S.agents.get(id);
    if (!a) return null;
    const active = S.layout.active === id;
    // A list of buttons, not an ARIA tablist: each tab has its own close button beside it.
    return h('div', { class: `tab${active ? ' active' : ''}`, role: 'listitem', dataset: { agentId: id } },
      h('button', {
        type: 'button', id: `tab-${id}`, 'aria-current': active ? 'page' : null, 'aria-keyshortcuts': 'ArrowLeft ArrowRight Delete',
        class: 'tab-open', onclick: () => openAgent(id), onkeydown: tabKeys,
      }, dot(a.status), h('span', { class: 'title' }, label(a)), a.parentAgentId ? h('span', { class: 'badge' }, 'sub') : null,
      a.requiresAttention ? h('span', { class: 'attention' }, '●') : null),
      isRoot(a) && !a.archivedAt
        ? h('button', { type: 'button', class: 'tab-close tab-archive', 'aria-label': `Archive ${label(a)}`, title: 'Archive: closes its tab on every browser (Unarchive for a few seconds after)', onclick: () => closeTab(id) }, '⊟')
        : h('button', { type: 'button', class: 'tab-close tab-hide', 'aria-label': `Close the tab of ${label(a)}`, title: a.archivedAt ? 'Close this tab' : 'Close this tab only: the subagent keeps running in its parent’s track', onclick: () => closeTab(id) }, '×'));
  });
  bar.replaceChildren(...tabs.filter((t) => t !== null));
}

/**
 * @param {KeyboardEvent} e
 */
function tabKeys(e) {
  // The tab with the focus, which need not be the one in front.
  const tab = /** @type {HTMLElement | null} */ (/** @type {HTMLElement} */ (e.currentTarget).closest('.tab'));
  const id = tab?.dataset.agentId ?? S.layout.active;
  if (!id) return;
  const i = S.layout.tabs.indexOf(id);
  let next = null;
  if (e.key === 'ArrowRight') next = S.layout.tabs[(i + 1) % S.layout.tabs.length];
  else if (e.key === 'ArrowLeft') next = S.layout.tabs[(i - 1 + S.layout.tabs.length) % S.layout.tabs.length];
  else if (e.key === 'Delete') {
    const a = S.agents.get(id);
    if (a && isRoot(a) && !a.archivedAt && (S.drafts[id] || '').trim()) {
      confirmDialog({ title: `Archive “${label(a)}”?`, body: 'Its message box holds text you have not sent.', confirm: 'Archive' }).then((yes) => { if (yes) closeTab(id); });
      return;
    }
    closeTab(id);
    return;
  }
  if (!next) return;
  e.preventDefault();
  openAgent(next);
  requestAnimationFrame(() => document.getElementById(`tab-${next}`)?.focus());
}

// ---- the landing view ---------------------------------------------------------------------

/**
 * With no agent in front (a phone's first screen): what needs the user, most urgent first,
 * each one tap away; subagents too, named with their root.
 */
function renderLanding() {
  /** @type {Record<string, number>} */
  const rank = { permission: 0, auth_required: 1, error: 2, limited: 3, interrupted: 4, budget_warning: 5 };
  const needs = [...S.agents.values()]
    .filter((a) => !a.archivedAt && a.requiresAttention && (a.attentionReason ?? '') in rank)
    .sort((x, y) => rank[x.attentionReason ?? ''] - rank[y.attentionReason ?? ''] || byText(y.attentionTimestamp || '', x.attentionTimestamp || ''));
  const key = JSON.stringify(needs.map((a) => [a.id, a.attentionReason, a.title]));
  const host = byId('empty');
  if (host.dataset.key === key) return;
  host.dataset.key = key;
  /** @param {AgentInfo} a */
  const rootOf = (a) => {
    let r = a;
    for (let i = 0; i < 64 && r.parentAgentId; i++) {
      const up = S.agents.get(r.parentAgentId);
      if (!up) break;
      r = up;
    }
    return r;
  };
  host.replaceChildren(needs.length
    ? h('section', { class: 'landing', 'aria-label': 'Needs you' },
      h('h2', null, needs.length === 1 ? '1 agent needs you' : `${needs.length} agents need you`),
      h('ul', { class: 'needs', role: 'list' }, needs.slice(0, 50).map((a) => {
        const root = rootOf(a);
        return h('li', { dataset: { agentId: a.id } },
          h('button', { type: 'button', class: `need reason-${a.attentionReason}`, onclick: () => openAgent(a.id) },
            dot(a.status), h('span', { class: 'title' }, label(a)),
            root.id !== a.id ? h('span', { class: 'muted' }, `under ${label(root)}`) : null,
            h('span', { class: 'why' }, reasonText(a))));
      })))
    : h('p', null, 'Nothing needs you. Open an agent from the sidebar, or start a new one.'));
}

// ---- the agent pane -----------------------------------------------------------------------

function renderPane() {
  const host = byId('pane');
  const id = S.layout.active;
  const a = id && S.agents.get(id);
  for (const [pid, pane] of S.panes) pane.root.hidden = pid !== id;
  byId('empty').hidden = Boolean(a);
  if (!a) { renderLanding(); return; }
  let pane = S.panes.get(id);
  if (!pane) {
    pane = makePane(a);
    S.panes.set(id, pane);
    host.appendChild(pane.root);
  }
  host.setAttribute('aria-labelledby', `tab-${id}`);
  if (!pane.loaded && S.state === 'online' && !pane.loading) loadPane(pane);
  // Looking at the agent is seeing what it asked attention for (a permission stays until it
  // is answered, a sign-in until it is done).
  if (a.requiresAttention && a.attentionReason !== 'permission' && a.attentionReason !== 'auth_required' && !document.hidden && S.state === 'online'
    && pane.seen !== a.attentionTimestamp) {
    pane.seen = a.attentionTimestamp;
    conn.request({ type: ClientType.ClearAttention, agentId: a.id }).catch(() => { pane.seen = null; });
  }
  renderHeader(pane, a);
  renderStartCard(pane, a);
  renderTerminals(pane, a);
  renderJobs(pane, a);
  renderTrack(pane, a);
  renderSchedules(pane, a);
  renderQueued(pane);
  renderDropped(pane);
  renderArchivedNote(pane, a);
  pane.send.disabled = S.state !== 'online' || Boolean(a.archivedAt);
}

/**
 * The Terminals panel of the agent's workspace: terminals of this daemon, in a live workspace.
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function renderTerminals(pane, a) {
  const w = S.workspaces.get(a.workspaceId);
  pane.terms.render(a.workspaceId, !a.archivedAt && !a.host && !w?.archivedAt);
}

/**
 * An archived agent's pane says so where one types, keeps the text, and offers Unarchive.
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function renderArchivedNote(pane, a) {
  const key = a.archivedAt ? `${a.archivedAt}|${Boolean(pane.archivedElsewhere)}` : '';
  if (pane.archivedKey === key) return;
  pane.archivedKey = key;
  pane.archivedEl.hidden = !a.archivedAt;
  if (!a.archivedAt) { pane.archivedElsewhere = false; pane.archivedEl.replaceChildren(); return; }
  pane.archivedEl.replaceChildren(
    h('span', null, pane.archivedElsewhere
      ? `“${label(a)}” was archived elsewhere (another browser, the CLI or an agent) while you were typing. Your text is kept; unarchive to send it.`
      : `“${label(a)}” is archived. Unarchive it to send it messages.`),
    h('button', { type: 'button', class: 'small primary', onclick: () => unarchive(a.id) }, 'Unarchive'));
}

/**
 * Messages the daemon dropped before they ran: their text, offered back to the composer.
 * @param {Pane} pane
 */
function renderDropped(pane) {
  const dropped = S.dropped[pane.id] || [];
  const key = JSON.stringify(dropped);
  if (pane.droppedKey === key) return;
  pane.droppedKey = key;
  pane.droppedEl.hidden = !dropped.length;
  if (!dropped.length) { pane.droppedEl.replaceChildren(); return; }
  const forget = () => { delete S.dropped[pane.id]; saveDropped(); renderDropped(pane); };
  pane.droppedEl.replaceChildren(
    h('span', null, `${plural(dropped.length, 'queued message was', 'queued messages were')} dropped before ${dropped.length === 1 ? 'it' : 'they'} ran (a Stop, an archive or another client): `,
      h('q', { class: 'dropped-text' }, dropped.join(' · '))),
    h('button', { type: 'button', class: 'small primary', onclick: () => {
      pane.input.value = [...dropped, pane.input.value].filter((t) => t.trim()).join('\n\n');
      S.drafts[pane.id] = pane.input.value;
      store.set('drover.drafts', S.drafts);
      forget();
      pane.input.focus();
    } }, 'Put back in the message box'),
    h('button', { type: 'button', class: 'small', onclick: forget }, 'Dismiss'));
}

/**
 * @param {AgentInfo} a
 */
function makePane(a) {
  const id = a.id;
  const pane = /** @type {Pane} */ ({ id, loaded: false, loading: false });
  pane.view = new TimelineView(id, {
    answer: (seq, optionId) => conn.request({ type: ClientType.AnswerPermission, agentId: id, seq, optionId }).catch((e) => { failed('Answer')(e); throw e; }),
    older: () => loadOlder(pane),
  });
  pane.header = h('header', { class: 'pane-head' });
  pane.startEl = h('div', { class: 'start-host', hidden: true });
  pane.jobsEl = h('section', { class: 'jobs', 'aria-label': 'Jobs' });
  pane.terms = terminals.panel();
  pane.track = h('section', { class: 'track', 'aria-label': 'Subagents' });
  pane.schedulesEl = h('section', { class: 'schedules', 'aria-label': 'Schedules', hidden: true });
  pane.queuedEl = h('ul', { class: 'queued', 'aria-label': 'Queued messages' });
  pane.archivedEl = h('div', { class: 'pane-note archived-note', role: 'status', hidden: true });
  pane.droppedEl = h('div', { class: 'pane-note dropped-note', role: 'status', hidden: true });
  // The note with its counter, hidden from screen readers; what they are told, in a live
  // region that is always there (so that it is heard) and changes only when the note comes
  // or goes.
  pane.quietShownEl = h('span', { 'aria-hidden': 'true' });
  pane.quietEl = h('div', { class: 'pane-note quiet-note', hidden: true }, pane.quietShownEl);
  pane.quietSaidEl = h('div', { class: 'visually-hidden quiet-said', role: 'status' });
  // When this page last received something from the agent, on its own clock (0 until its
  // timeline loads).
  pane.heardAt = 0;
  if (keptArchived.delete(id)) pane.archivedElsewhere = true;
  pane.input = h('textarea', {
    class: 'composer-input', rows: '2', 'aria-label': 'Message', placeholder: 'Message (Enter sends; Shift+Enter for a new line)',
    oninput: (e) => { S.drafts[id] = /** @type {HTMLTextAreaElement} */ (e.target).value; store.set('drover.drafts', S.drafts); },
    onkeydown: (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        // Ctrl/Cmd+Enter steers, Alt+Enter injects, plain Enter uses the chosen delivery.
        const delivery = e.ctrlKey || e.metaKey ? 'steer' : e.altKey ? 'inject' : S.delivery[id] || 'followup';
        sendMessage(pane, delivery);
      }
    },
  });
  pane.input.value = S.drafts[id] || '';
  /** @type {Array<[Delivery, string, string]>} */
  const choices = [['followup', 'Follow up', 'Queued for the next turn; never interrupts'], ['steer', 'Steer', 'Stops the current turn and runs first (Ctrl+Enter)'], ['inject', 'Inject', 'Context for the next prompt; does not wake the agent (Alt+Enter)']];
  const deliveries = h('div', { class: 'delivery', role: 'radiogroup', 'aria-label': 'Delivery' },
    choices.map(([value, text, title]) => h('label', { title }, h('input', {
      type: 'radio', name: `delivery-${id}`, value, checked: (S.delivery[id] || 'followup') === value,
      onchange: () => { S.delivery[id] = value; },
    }), text)));
  pane.send = h('button', { type: 'button', class: 'primary', onclick: () => sendMessage(pane, S.delivery[id] || 'followup') }, 'Send');
  pane.composerError = h('div', { class: 'composer-error', role: 'alert' });
  pane.root = h('div', { class: 'agent-pane', dataset: { agentId: id } }, pane.header, pane.startEl, pane.view.el,
    h('div', { class: 'bottom' }, pane.terms.el, pane.jobsEl, pane.schedulesEl, pane.track, pane.queuedEl, pane.quietEl, pane.quietSaidEl, pane.droppedEl, pane.archivedEl,
      h('div', { class: 'composer' }, pane.input, h('div', { class: 'composer-bar' }, deliveries, pane.send), pane.composerError)));
  return pane;
}

/**
 * @param {Pane} pane
 */
async function loadPane(pane) {
  pane.loading = true;
  try {
    const m = await conn.request({ type: ClientType.InitializeAgentRequest, agentId: pane.id, limit: 200 });
    const p = m.payload;
    learn(p.info);
    const items = /** @type {import('./protocol.gen.js').AgentUpdate[]} */ (p.updates).map((u) => u.notification.item);
    pane.view.reset(items, p.hasOlder);
    // A silence counts from when this page received the agent's last item: the item's own
    // time is the daemon's clock, which the browser's need not agree with.
    pane.heardAt = Date.now();
    settleQueued(pane.id, items);
    pane.loaded = true;
    // A failed start's kept messages are read again (`renderStartCard`).
    pane.queuedFor = null;
    loadQueued(pane);
    render({ sidebar: false });
  } catch (e) {
    if (!isOffline(e)) failed('Opening the agent')(e);
  } finally {
    pane.loading = false;
  }
}

/**
 * @param {Pane} pane
 */
async function loadOlder(pane) {
  const first = pane.view.firstSeq();
  if (first === null || pane.view.loadingOlder) return;
  pane.view.loadingOlder = true;
  try {
    const m = await conn.request({ type: ClientType.FetchTimeline, agentId: pane.id, before: first, limit: 100 });
    pane.view.prepend(m.payload.items.slice().reverse(), m.payload.hasOlder);
  } catch (e) { failed('Loading older messages')(e); } finally { pane.view.loadingOlder = false; }
}

/**
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function renderHeader(pane, a) {
  const w = S.workspaces.get(a.workspaceId);
  const tree = a.budget ? treeSpend(pane, a) : null;
  const key = JSON.stringify([a.title, a.status, a.type, a.currentModeId, a.availableModes, a.model, a.configOptions, a.cwd, w?.worktree?.branch, live(a), a.archivedAt, a.parentAgentId, a.error, Boolean(a.startFailure), a.spend, a.budget, tree, a.host && S.hosts.get(a.host)]);
  if (pane.headerKey === key) return;
  pane.headerKey = key;
  const title = h('h1', { class: 'agent-title' },
    h('button', { type: 'button', class: 'title-edit', title: 'Rename', 'aria-label': `Rename ${label(a)}`, onclick: () => editTitle(pane, a) }, label(a)));
  const modes = a.availableModes || [];
  const mode = h('select', {
    'aria-label': 'Mode', disabled: !modes.length,
    onchange: (e) => conn.request({ type: ClientType.SetMode, agentId: a.id, modeId: /** @type {HTMLSelectElement} */ (e.target).value }).catch(failed('Mode')),
  }, (modes.length ? modes : [{ id: a.currentModeId || '', name: a.currentModeId || 'mode' }]).map((/** @type {{id: string, name?: string}} */ m) => h('option', { value: m.id, selected: m.id === a.currentModeId }, m.name || m.id)));
  const model = h('input', {
    class: 'model', 'aria-label': 'Model', value: a.model || '', placeholder: 'model', size: '14',
    onchange: (e) => { const v = /** @type {HTMLInputElement} */ (e.target).value.trim(); if (v) conn.request({ type: ClientType.SetModel, agentId: a.id, modelId: v }).catch(failed('Model')); },
  });
  // What the live session offers to set (ACP config options) replaces the older controls of
  // the same category.
  const options = a.configOptions || [];
  const offers = (/** @type {string} */ category) => options.some((o) => o.category === category);
  const settings = options.map((o) => h('select', {
    class: 'setting', 'aria-label': o.name, title: o.description || o.name,
    onchange: (e) => conn.request({ type: ClientType.SetConfigOption, agentId: a.id, configId: o.id, value: /** @type {HTMLSelectElement} */ (e.target).value }).catch(failed(o.name)),
  }, o.values.map((v) => h('option', { value: v.value, selected: v.value === o.currentValue, title: v.description || '' },
    // A value says what it is of, but for the mode's and the model's, which speak for themselves.
    ['mode', 'model'].includes(o.category ?? '') ? v.name : `${o.category === 'thought_level' ? 'effort' : o.name}: ${v.name}`))));
  const parent = a.parentAgentId && S.agents.get(a.parentAgentId);
  pane.header.replaceChildren(
    h('div', { class: 'head-row' }, dot(a.status), title,
      h('span', { class: 'badge' }, a.type), h('span', { class: `status-text status-${a.status}` }, a.status),
      h('span', { class: `badge runtime-${live(a)}`, title: RUNTIME_TITLE[live(a)] }, live(a)),
      hostBadge(a.host),
      h('span', { class: 'spacer' }),
      offers('mode') ? null : mode, offers('model') ? null : model, ...settings,
      h('button', { type: 'button', class: 'stop', disabled: !busy(a), onclick: () => conn.request({ type: ClientType.Cancel, agentId: a.id, keepInbox: false }).then(() => refreshQueued(a.id), failed('Stop')) }, 'Stop'),
      a.archivedAt ? null : h('button', { type: 'button', class: 'danger', onclick: () => archiveAgent(a, { ask: { title: `Archive “${label(a)}”?`, body: isRoot(a) ? 'It leaves every list and its subagents are archived with it.' : 'It leaves its parent’s track on every client.', confirm: 'Archive' } }) }, 'Archive'),
      a.archivedAt ? null : moreMenu(a)),
    h('div', { class: 'head-row meta' },
      h('span', { class: 'cwd', title: a.cwd }, a.cwd),
      w?.worktree ? h('span', { class: 'branch' }, `⎇ ${w.worktree.branch}`) : null,
      parent ? h('button', { type: 'button', class: 'link', onclick: () => openAgent(parent.id) }, `subagent of ${label(parent)}`) : null,
      spendBadge(a, tree),
      // A failed start says its words in its card.
      a.error && !a.startFailure ? h('span', { class: 'error-text' }, a.error) : null));
}

// ---- spend and budget --------------------------------------------------------------------

/**
 * `1000 tok · 0.0010 USD`; `unknown` when the agent reported nothing (never zero).
 * @param {import('./protocol.gen.js').SpendInfo | null | undefined} s
 */
function spendText(s) {
  const parts = [];
  if (s && s.tokens !== null && s.tokens !== undefined) parts.push(`${s.tokens} tok`);
  if (s && s.cost !== null && s.cost !== undefined) parts.push(`${s.cost.toFixed(4)} ${s.currency || 'USD'}`);
  return parts.length ? parts.join(' · ') : 'unknown';
}

/**
 * What the agent's tree spent, as `get_agent` says (archived subagents included). Asked again
 * when a spend in its tree as this browser sees it changes; until the answer, this browser's sum.
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function treeSpend(pane, a) {
  const sum = visibleTreeSum(a);
  const key = JSON.stringify(sum);
  if (pane.treeKey !== key && S.state === 'online') {
    pane.treeKey = key;
    conn.request({ type: ClientType.GetAgent, agentId: a.id }).then((m) => {
      pane.tree = m.payload.agent.treeSpend || null;
      render({ sidebar: false });
    }, () => { pane.treeKey = null; });
  }
  return pane.tree || sum;
}

/**
 * What the agent and the agents under it that this browser knows spent.
 * @param {AgentInfo} a
 */
function visibleTreeSum(a) {
  /** @type {{tokens: number | null, cost: number | null, currency: string | null | undefined}} */
  const sum = { tokens: null, cost: null, currency: null };
  /** @param {AgentInfo} x */
  const add = (x) => {
    if (x.spend?.tokens !== null && x.spend?.tokens !== undefined) sum.tokens = (sum.tokens || 0) + x.spend.tokens;
    if (x.spend?.cost !== null && x.spend?.cost !== undefined) { sum.cost = (sum.cost || 0) + x.spend.cost; sum.currency ||= x.spend.currency; }
  };
  /** @param {AgentInfo} x */
  const inTree = (x) => {
    for (let /** @type {AgentInfo | undefined} */ at = x, depth = 0; at && depth < 64; at = S.agents.get(at.parentAgentId ?? ''), depth++) {
      if (at.id === a.id) return true;
    }
    return false;
  };
  for (const x of S.agents.values()) if (inTree(x)) add(x);
  return sum;
}

/**
 * The larger share of its limits a tree's spend is (1 = spent).
 * @param {{tokens?: number | null, cost?: number | null}} b
 * @param {{tokens?: number | null, cost?: number | null} | null | undefined} tree
 */
function budgetShare(b, tree) {
  const shares = [];
  if (b.tokens !== null && b.tokens !== undefined) shares.push(b.tokens > 0 ? (tree?.tokens || 0) / b.tokens : 1);
  if (b.cost !== null && b.cost !== undefined) shares.push(b.cost > 0 ? (tree?.cost || 0) / b.cost : 1);
  return Math.max(0, ...shares);
}

/**
 * The header's spend: the agent's own, and for an agent with a budget its tree's against it
 * (the larger share of its limits), in the warning colour past 80 % and the danger one at 100 %.
 * @param {AgentInfo} a
 * @param {{tokens?: number | null, cost?: number | null, currency?: string | null} | null | undefined} tree
 */
function spendBadge(a, tree) {
  const own = h('span', { class: 'spend', title: 'what this agent reported spending' }, `spent ${spendText(a.spend)}`);
  if (!a.budget || !tree) return own;
  const b = a.budget;
  const limits = [];
  if (b.tokens !== null && b.tokens !== undefined) limits.push(`${tree.tokens || 0}/${b.tokens} tok`);
  if (b.cost !== null && b.cost !== undefined) limits.push(`${(tree.cost || 0).toFixed(4)}/${b.cost.toFixed(4)} ${tree.currency || 'USD'}`);
  const share = budgetShare(b, tree);
  const level = share >= 1 ? 'over' : share >= 0.8 ? 'warn' : 'ok';
  const why = { over: 'spent: no new turn starts in its tree until the budget is raised', warn: 'past 80 % of its budget', ok: 'its tree’s spend against its budget' }[level];
  return h('span', { class: 'spend' }, own,
    h('span', { class: `budget budget-${level}`, title: `${why}${b.hard ? '; hard: running turns are cancelled at 100 %' : ''}` },
      `tree ${limits.join(', ')} (${Math.round(share * 100)} %${b.hard ? ', hard' : ''})`));
}

/**
 * The header's overflow menu: what is used less often, so the header stays one row.
 * @param {AgentInfo} a
 */
function moreMenu(a) {
  const menu = h('details', { class: 'more' });
  const pick = (/** @type {() => void} */ run) => () => { menu.open = false; run(); };
  menu.append(h('summary', { class: 'icon', title: 'More', 'aria-label': `More for ${label(a)}` }, '⋯'),
    h('div', { class: 'more-items', role: 'menu' },
      h('button', { type: 'button', class: 'schedule-new', role: 'menuitem', title: 'Send this agent a prompt on a timetable', onclick: pick(() => scheduleDialog(a)) }, 'Schedule…'),
      h('button', { type: 'button', class: 'run-job', role: 'menuitem', title: 'Run a command for this agent in the background (a job)', onclick: pick(() => startJobDialog(a)) }, 'Run a command…')));
  return menu;
}

// ---- failed starts and sign-in -----------------------------------------------------------

/**
 * @param {string} name
 */
function providerLabel(name) {
  return (S.providers || []).find((p) => p.name === name)?.label || name;
}

/**
 * The "Sign in to …" or "Could not start" card while the agent's last start failed. Nothing
 * here starts the agent: only the card's buttons do (`sign_in`, `restart_agent`).
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function renderStartCard(pane, a) {
  const provider = providerLabel(a.type);
  const key = startCardKey(a) + provider;
  if (pane.startKey !== key) {
    pane.startKey = key;
    const card = startCard(a, {
      provider,
      signIn: (methodId, vars) => conn.request({ type: ClientType.SignIn, provider: a.type, methodId, ...(vars ? { vars } : {}) }),
      restart: () => conn.request({ type: ClientType.RestartAgent, agentId: a.id }),
    });
    pane.startEl.hidden = !card;
    pane.startEl.replaceChildren(...(card ? [card] : []));
  }
  // The countdown to the next automatic try, in place: the card (and a Retry's error) stays.
  const when = pane.startEl.querySelector('.start-when');
  if (when && a.startFailure) when.textContent = startWhen(a);
  clearTimeout(pane.startTimer);
  if (a.startFailure && (retryIn(a) ?? 0) > 0) pane.startTimer = setTimeout(() => render({ sidebar: false }), 1000);
  if (a.startFailure && pane.loaded && pane.queuedFor !== a.startFailure.at) {
    pane.queuedFor = a.startFailure.at;
    loadQueued(pane);
  }
}

/**
 * Reads the agent's inbox again soon (once for a burst of changes).
 * @param {string} id
 */
function refreshQueued(id) {
  const pane = S.panes.get(id);
  if (!pane || pane.queuedTimer) return;
  pane.queuedTimer = setTimeout(() => { pane.queuedTimer = null; if (pane.loaded) loadQueued(pane); }, 150);
}

/**
 * Whether the pane's timeline shows the turn of message `m` (or, for context, any use of it).
 * @param {Pane} pane
 * @param {Queued} m
 */
function started(pane, m) {
  for (const { item } of pane.view.items.values()) {
    if ((item.kind === 'user_message' || item.kind === 'turn_started') && item.data?.messageId === m.messageId) return true;
    if (m.delivery === 'inject' && item.kind === 'user_message' && item.data?.context?.length) return true;
  }
  return false;
}

/**
 * The queued list is the daemon's inbox (`get_agent`'s `queued`), with what this browser sent
 * after asking. A message this browser queued that is neither there nor started was dropped:
 * its text is offered back (once the timeline had a moment to show a turn that just started).
 * @param {Pane} pane
 */
async function loadQueued(pane) {
  const asked = Date.now();
  try {
    const m = await conn.request({ type: ClientType.GetAgent, agentId: pane.id });
    const mine = S.queued[pane.id] || [];
    const kept = /** @type {QueuedMessageInfo[]} */ (m.payload.agent.queued || []).map((q) => mine.find((x) => x.messageId === q.id)
      || { messageId: q.id, text: q.text, delivery: q.delivery, at: Date.parse(q.queuedAt), theirs: true });
    // What this browser sent after asking is not in the answer yet.
    const later = mine.filter((x) => x.at > asked && !kept.includes(x));
    const missing = mine.filter((x) => x.at <= asked && !kept.includes(x) && !x.theirs && !started(pane, x));
    S.queued[pane.id] = [...kept, ...later];
    store.set('drover.queued', S.queued);
    renderQueued(pane);
    if (missing.length) {
      setTimeout(() => {
        // Only what the loaded timeline covers can be told apart from a turn that started.
        const seq = pane.view.firstSeq();
        const first = seq === null ? undefined : pane.view.items.get(seq)?.item;
        const covered = (/** @type {Queued} */ x) => !pane.view.hasOlder || (first && Date.parse(first.at) <= x.at);
        const dropped = missing.filter((x) => covered(x) && !started(pane, x));
        if (!dropped.length) return;
        S.dropped[pane.id] = [...(S.dropped[pane.id] || []), ...dropped.map((x) => x.text)];
        saveDropped();
        renderDropped(pane);
      }, 1000);
    }
  } catch { /* read again at the next change or opening */ }
}

/**
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function editTitle(pane, a) {
  const input = h('input', { class: 'title-input', value: a.title || '', 'aria-label': 'Title' });
  const done = (/** @type {boolean} */ save) => {
    if (save && input.value.trim() !== (a.title || '')) conn.request({ type: ClientType.SetTitle, agentId: a.id, title: input.value.trim() || null }).catch(failed('Rename'));
    pane.headerKey = null;
    render({ sidebar: false });
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); done(true); }
    if (e.key === 'Escape') { e.preventDefault(); done(false); }
  });
  input.addEventListener('blur', () => done(true));
  within(pane.header, '.agent-title').replaceChildren(input);
  input.focus();
  input.select();
}

// ---- jobs ---------------------------------------------------------------------------------

function loadJobs() {
  conn.request({ type: ClientType.ListJobs }).then((m) => {
    S.jobs = new Map(/** @type {JobInfo[]} */ (m.payload.jobs).map((j) => [j.id, j]));
    render({ sidebar: false });
  }).catch(() => {});
}

/**
 * @param {number} ms
 */
function seconds(ms) { return ms < 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 1000)} s`; }

/**
 * How a job stands, in words: `running`, `exit 0 · 1.2 s`, `killed (request)`, `lost`.
 * @param {JobInfo} j
 */
export function jobState(j) {
  if (j.status === 'running') return 'running';
  const took = j.durationMs == null ? '' : ` · ${seconds(j.durationMs)}`;
  if (j.status === 'exited') return `${j.exitCode == null ? j.exit || 'exited' : `exit ${j.exitCode}`}${took}`;
  if (j.status === 'killed') return `killed${j.killedBy ? ` (${j.killedBy})` : ''}${took}`;
  return j.status;
}

/**
 * @param {JobInfo} j
 */
function jobDot(j) {
  if (j.status === 'running') return 'running';
  return j.status === 'exited' && j.exitCode === 0 ? 'idle' : 'error';
}

/**
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function renderJobs(pane, a) {
  const jobs = [...S.jobs.values()].filter((j) => j.agentId === a.id);
  const key = JSON.stringify(jobs.map((j) => [j.id, j.status, j.exitCode, j.killedBy])) + S.collapsed[`jobs-${a.id}`];
  if (pane.jobsKey === key) return;
  pane.jobsKey = key;
  if (!jobs.length) { pane.jobsEl.hidden = true; pane.jobsEl.replaceChildren(); return; }
  pane.jobsEl.hidden = false;
  const running = jobs.filter((j) => j.status === 'running').length;
  const collapsed = S.collapsed[`jobs-${a.id}`];
  const summary = [plural(jobs.length, 'job', 'jobs'), running ? `${running} running` : null].filter(Boolean).join(' · ');
  pane.jobsEl.replaceChildren(
    h('div', { class: 'track-head' },
      h('button', { type: 'button', class: 'track-toggle', 'aria-expanded': String(!collapsed), onclick: () => { S.collapsed[`jobs-${a.id}`] = !collapsed; store.set('drover.collapsed', S.collapsed); render({ sidebar: false }); } }, summary)),
    ...(collapsed ? [] : [h('ul', { class: 'track-rows', role: 'list' }, jobs.slice().reverse().map((j) => h('li', { class: 'track-row job-row', dataset: { jobId: j.id, status: j.status } },
      h('button', { type: 'button', class: 'open', title: `${j.command}\nin ${j.cwd}\nstarted by ${j.startedBy}`, onclick: () => jobOutputDialog(j.id) },
        h('span', { class: `dot status-${jobDot(j)}`, role: 'img', 'aria-label': j.status, title: j.status }), h('span', { class: 'provider' }, j.id), h('code', { class: 'title' }, j.command), h('span', { class: 'status-text' }, jobState(j))),
      j.status === 'running' ? h('button', { type: 'button', class: 'small danger', onclick: () => conn.request({ type: ClientType.KillJob, jobId: j.id }).catch(failed('Kill')) }, 'Kill') : null)))]));
}

/**
 * @param {AgentInfo} a
 */
async function startJobDialog(a) {
  await modal('Run a command', (close) => {
    const error = h('div', { class: 'error-text', role: 'alert' });
    const command = h('input', { name: 'command', required: true, autofocus: true, class: 'wide-input', placeholder: 'cargo test 2>&1', 'aria-label': 'Command' });
    const cwd = h('input', { name: 'cwd', class: 'wide-input', placeholder: a.cwd, 'aria-label': 'Directory' });
    const notify = h('input', { type: 'checkbox', name: 'notify', checked: true });
    /** @param {Event} e */
    const submit = async (e) => {
      e.preventDefault();
      error.textContent = '';
      /** @type {Extract<ClientMessage, {type: 'start_job'}>} */
      const msg = { type: ClientType.StartJob, agentId: a.id, command: command.value, notifyOnExit: notify.checked };
      if (cwd.value.trim()) msg.cwd = cwd.value.trim();
      try {
        const m = await conn.request(msg);
        // The answer fills in; a `job_update` that came first (it may have ended) wins.
        if (!S.jobs.has(m.payload.job.id)) S.jobs.set(m.payload.job.id, m.payload.job);
        close(true);
        render({ sidebar: false });
        toast(`Started ${m.payload.job.id}`);
      } catch (err) { error.textContent = errorMessage(err); }
    };
    return h('form', { onsubmit: submit },
      h('h2', null, `Run a command for “${label(a)}”`),
      h('p', { class: 'muted' }, 'It runs in the background with its own process group; it keeps running after the turn and is stopped if the agent is archived.'),
      h('label', { class: 'field' }, h('span', null, 'Command'), command),
      h('label', { class: 'field' }, h('span', null, 'Directory (default: the agent’s)'), cwd),
      h('label', null, notify, ' Tell the agent when it ends'),
      error,
      h('div', { class: 'dialog-actions' },
        h('button', { type: 'button', onclick: () => close(false) }, 'Cancel'),
        h('button', { type: 'submit', class: 'primary' }, 'Run')));
  }, { className: 'new-agent start-job' });
}

/**
 * The job's output while the dialog is open: its last 256 KiB, then what the daemon pushes as
 * the job writes (`follow_job` → `job_output_update`), by byte offset, so never a byte twice;
 * followed again from the same offset after a reconnect (a new session has no follows).
 * @param {string} id
 */
function jobOutputDialog(id) {
  let open = true;
  /** What `job_output` pushes reach while the dialog is open (`S.follows`). */
  /** @type {Follow} */
  const follow = { session: null, push: () => {}, restart: () => {} };
  modal(`Output of ${id}`, (close) => {
    const j = S.jobs.get(id);
    const out = h('pre', { class: 'code job-output', tabindex: '0', 'aria-label': 'Output' });
    const state = h('p', { class: 'muted job-state' }, j ? jobState(j) : '');
    const kill = h('button', { type: 'button', class: 'danger', hidden: !j || j.status !== 'running', onclick: () => conn.request({ type: ClientType.KillJob, jobId: id }).catch(failed('Kill')) }, 'Kill');
    const show = (/** @type {JobInfo} */ job) => { state.textContent = jobState(job); kill.hidden = job.status !== 'running'; };
    // Where the next byte shown starts.
    /** @type {number | null} */
    let offset = null;
    const ended = async () => {
      if (S.follows.get(id) === follow) S.follows.delete(id);
      out.dataset.eof = 'true';
      // Its `job_update` may still be on its way: ask how it ended.
      const w = await conn.request({ type: ClientType.WaitJob, jobId: id, timeoutMs: 10000 });
      S.jobs.set(id, w.payload.job);
      show(w.payload.job);
      render({ sidebar: false });
    };
    /** @param {JobOutputPush} p */
    const append = (p) => {
      const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      if (p.skipped && offset != null) out.append(`\n[… ${p.skipped} bytes no longer kept …]\n`);
      if (p.text) out.append(p.text);
      if (atBottom) out.scrollTop = out.scrollHeight;
      offset = p.nextOffset;
      const now = S.jobs.get(id);
      if (now) show(now);
      if (p.eof) ended().catch((e) => { if (open) state.textContent = errorMessage(e); });
    };
    // A push of an earlier follow (before a reconnect) is not where this one stands: skip it.
    follow.push = (p) => { if (open && p.offset - p.skipped === offset) append(p); };
    follow.restart = async () => {
      try {
        if (offset == null) {
          const m = await conn.request({ type: ClientType.JobOutput, jobId: id, tail: 262144 });
          append(m.payload);
          if (m.payload.eof || !open) return;
        }
        follow.session = S.sessionId;
        S.follows.set(id, follow);
        await conn.request({ type: ClientType.FollowJob, jobId: id, offset });
      } catch (e) {
        if (open) state.textContent = errorMessage(e);
      }
    };
    follow.restart();
    return h('div', null, h('h2', null, j ? h('code', null, j.command) : id), state, out,
      h('div', { class: 'dialog-actions' },
        kill, h('button', { type: 'button', autofocus: true, onclick: () => close() }, 'Close')));
  }, { className: 'wide' }).then(() => {
    open = false;
    if (S.follows.get(id) === follow) {
      S.follows.delete(id);
      conn.request({ type: ClientType.UnfollowJob, jobId: id }).catch(() => {});
    }
  });
}

// ---- the subagents track ------------------------------------------------------------------

/**
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function renderTrack(pane, a) {
  const kids = children(a.id);
  // The subagents the agent's process runs itself: shown, not driven (they end with it).
  const own = a.ownSubagents || [];
  // Archived subagents, when asked for ("Show archived"): read, and brought back from here.
  const showArchived = S.trackArchived.has(a.id);
  const gone = showArchived ? [...S.agents.values()].filter((x) => x.parentAgentId === a.id && x.archivedAt) : [];
  const key = JSON.stringify([kids.map((k) => [k.id, k.status, k.title, k.type, k.requiresAttention, k.host && S.hosts.get(k.host)?.state]), own, showArchived, gone.map((g) => [g.id, g.title])]) + S.collapsed[`track-${a.id}`];
  if (pane.trackKey === key) return;
  pane.trackKey = key;
  if (!kids.length && !own.length && !showArchived) {
    // Nothing runs under it: the track shows only the way to the archived subagents this page
    // knows of (the sidebar's "archived" loads them all).
    const known = [...S.agents.values()].some((x) => x.parentAgentId === a.id && x.archivedAt);
    pane.track.hidden = !known;
    pane.track.replaceChildren(...(known ? [h('div', { class: 'track-head' }, h('span', { class: 'muted' }, 'No subagents'), archivedToggle(a, showArchived))] : []));
    return;
  }
  pane.track.hidden = false;
  const running = kids.filter(busy).length + own.filter((s) => s.state === 'running').length;
  const attention = kids.filter((k) => k.requiresAttention).length;
  const summary = [plural(kids.length + own.length, 'subagent', 'subagents'), running ? `${running} running` : null, attention ? `${attention} ${attention === 1 ? 'needs' : 'need'} attention` : null].filter(Boolean).join(' · ');
  const collapsed = S.collapsed[`track-${a.id}`];
  const provider = providerLabel(a.type);
  pane.track.replaceChildren(
    h('div', { class: 'track-head' },
      h('button', { type: 'button', class: 'track-toggle', 'aria-expanded': String(!collapsed), onclick: () => { S.collapsed[`track-${a.id}`] = !collapsed; store.set('drover.collapsed', S.collapsed); render({ sidebar: false }); } }, summary),
      kids.length ? h('button', { type: 'button', class: 'small', onclick: () => archiveFinished(a) }, 'Archive finished') : null,
      archivedToggle(a, showArchived)),
    ...(collapsed ? [] : [h('ul', { class: 'track-rows', role: 'list' }, kids.map((k) => h('li', { class: 'track-row', dataset: { agentId: k.id } },
      h('button', { type: 'button', class: 'open', onclick: () => openAgent(k.id) }, dot(k.status), h('span', { class: 'title' }, label(k)), h('span', { class: 'provider' }, k.type), hostBadge(k.host),
        h('span', { class: 'status-text' }, k.status), k.requiresAttention ? h('span', { class: 'attention' }, reasonText(k) || '●') : null),
      h('button', { type: 'button', class: 'small', onclick: () => conn.request({ type: ClientType.Detach, agentId: k.id }).catch(failed('Detach')) }, 'Detach'),
      h('button', { type: 'button', class: 'icon archive-x', 'aria-label': `Archive ${label(k)}`, title: 'Archive',
        onclick: () => archiveAgent(k, { ask: { title: `Archive “${label(k)}”?`, body: 'It leaves this track on every client, with its own subagents.', confirm: 'Archive' }, undo: true }) }, '×'))).concat(
      own.map((s) => h('li', { class: 'track-row own-subagent', dataset: { ownId: s.id, state: s.state }, title: `${provider}’s own subagent: it runs inside the agent and ends with it` },
        h('span', { class: 'open' }, dot(s.state === 'running' ? 'running' : 'idle'), h('span', { class: 'title' }, s.title),
          h('span', { class: 'provider' }, `${provider}’s`), h('span', { class: 'status-text' }, s.state))))).concat(
      gone.map((g) => h('li', { class: 'track-row archived', dataset: { agentId: g.id } },
        h('button', { type: 'button', class: 'open', onclick: () => openAgent(g.id) }, dot(g.status), h('span', { class: 'title' }, label(g)), h('span', { class: 'provider' }, g.type),
          h('span', { class: 'status-text' }, 'archived')),
        h('button', { type: 'button', class: 'small', onclick: () => unarchive(g.id) }, 'Unarchive')))))]));
}

/**
 * The track head's switch to list the agent's archived subagents (loaded when first asked).
 * @param {AgentInfo} a
 * @param {boolean} shown
 */
function archivedToggle(a, shown) {
  return h('button', {
    type: 'button', class: 'small track-archived', 'aria-pressed': String(shown),
    onclick: () => {
      if (shown) S.trackArchived.delete(a.id); else { S.trackArchived.add(a.id); loadArchived(); }
      render({ sidebar: false });
    },
  }, shown ? 'Hide archived' : 'Show archived');
}

// ---- schedules ----------------------------------------------------------------------------

/**
 * The schedules that are this agent's: sending to it, or creating its subagents.
 * @param {AgentInfo} a
 */
function schedulesOf(a) {
  return [...S.schedules.values()].filter((x) => x.state !== 'finished'
    && (x.agentId === a.id || x.newAgent?.parentAgentId === a.id));
}

/**
 * @param {string | null | undefined} iso
 */
function localTime(iso) {
  return iso ? new Date(iso).toLocaleString() : '';
}

/**
 * When a schedule fires, as the daemon describes it; a one-off's time in this browser's time
 * zone and words, as its next run is shown (the daemon's description says it in UTC).
 * @param {import('./protocol.gen.js').ScheduleInfo} x
 */
function fires(x) {
  const at = x.cadence?.kind === 'once' ? x.cadence.at : null;
  return typeof at === 'string' ? `once at ${localTime(at)}` : x.description;
}

/**
 * @param {Pane} pane
 * @param {AgentInfo} a
 */
function renderSchedules(pane, a) {
  const list = schedulesOf(a);
  const key = JSON.stringify(list.map((x) => [x.id, x.state, x.nextRunAt, x.description, x.title, x.prompt, x.runs.length]));
  if (pane.schedulesKey === key) return;
  pane.schedulesKey = key;
  pane.schedulesEl.hidden = !list.length;
  if (!list.length) { pane.schedulesEl.replaceChildren(); return; }
  pane.schedulesEl.replaceChildren(
    h('div', { class: 'track-head' }, h('strong', null, plural(list.length, 'schedule', 'schedules'))),
    h('ul', { class: 'track-rows', role: 'list' }, list.map((x) => {
      const last = x.runs[x.runs.length - 1];
      return h('li', { class: `schedule-row state-${x.state}`, dataset: { scheduleId: x.id } },
        h('span', { class: 'what' }, h('strong', null, x.title || x.prompt.split('\n')[0]), ' ', h('span', { class: 'muted' }, fires(x))),
        h('span', { class: 'when' }, x.state === 'paused' ? 'paused' : `next ${localTime(x.nextRunAt)}`),
        last ? h('span', { class: last.error ? 'error-text' : 'muted', title: last.error || '' }, `last ${ago(last.firedAt)} ago${last.error ? ', failed' : ''}`) : null,
        x.newAgent ? h('span', { class: 'badge' }, 'new agent') : null,
        h('button', { type: 'button', class: 'small', onclick: () => conn.request({ type: x.state === 'paused' ? 'resume_schedule' : 'pause_schedule', scheduleId: x.id }).catch(failed('Schedule')) },
          x.state === 'paused' ? 'Resume' : 'Pause'),
        h('button', { type: 'button', class: 'icon schedule-delete', 'aria-label': `Delete schedule ${x.id}`, title: 'Delete',
          onclick: async () => {
            if (await confirmDialog({ title: `Delete “${x.title || x.id}”?`, body: `It stops: ${fires(x)}.`, confirm: 'Delete' })) {
              conn.request({ type: ClientType.DeleteSchedule, scheduleId: x.id }).catch(failed('Delete'));
            }
          } }, '×'));
    })));
}

/**
 * Schedules a prompt to `a`: once in N minutes, every N minutes, or by cron in a time zone.
 * @param {AgentInfo} a
 */
async function scheduleDialog(a) {
  await modal('Schedule', (close) => {
    const error = h('div', { class: 'error-text', role: 'alert' });
    const prompt = h('textarea', { name: 'prompt', rows: '3', required: true, 'aria-label': 'Prompt' });
    const title = h('input', { name: 'title', 'aria-label': 'Title' });
    const kind = h('select', { name: 'kind', 'aria-label': 'When' },
      h('option', { value: 'in' }, 'once, in … minutes'),
      h('option', { value: 'every' }, 'every … minutes'),
      h('option', { value: 'cron' }, 'by cron'));
    const minutes = h('input', { name: 'minutes', type: 'number', min: '1', value: '60', 'aria-label': 'Minutes' });
    const cron = h('input', { name: 'cron', placeholder: '0 9 * * 1-5', 'aria-label': 'Cron expression' });
    const zone = h('input', { name: 'timeZone', value: Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC', 'aria-label': 'Time zone' });
    /** @param {Event} e */
    const submit = async (e) => {
      e.preventDefault();
      error.textContent = '';
      const when = kind.value === 'cron' ? { cron: cron.value.trim(), timeZone: zone.value.trim() || 'UTC' }
        : { [kind.value === 'in' ? 'inSeconds' : 'everySeconds']: Math.round(Number(minutes.value) * 60) };
      /** @type {Extract<ClientMessage, {type: 'create_schedule'}>} */
      const msg = { type: ClientType.CreateSchedule, agentId: a.id, prompt: prompt.value, when };
      if (title.value.trim()) msg.title = title.value.trim();
      try {
        const m = await conn.request(msg);
        // The answer fills in; a `schedule_update` that came first (it may have fired) wins.
        if (!S.schedules.has(m.payload.schedule.id)) S.schedules.set(m.payload.schedule.id, m.payload.schedule);
        close();
        render({ sidebar: false });
      } catch (err) { error.textContent = errorMessage(err); }
    };
    const field = (/** @type {string} */ text, /** @type {HTMLElement} */ el) => h('label', { class: 'field' }, h('span', null, text), el);
    return h('form', { class: 'schedule-form', onsubmit: submit },
      h('h2', null, `Schedule a prompt to “${label(a)}”`),
      field('Prompt (a followup each time: it never interrupts a turn)', prompt),
      field('Title', title),
      h('div', { class: 'row' }, field('When', kind), field('Minutes', minutes)),
      h('div', { class: 'row' }, field('Cron (for “by cron”)', cron), field('Time zone', zone)),
      error,
      h('div', { class: 'dialog-actions' }, h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button', { type: 'submit', class: 'primary' }, 'Schedule')));
  }, { className: 'wide' });
}

/**
 * @param {AgentInfo} a
 */
async function archiveFinished(a) {
  try {
    const m = await conn.request({ type: ClientType.ArchiveIdleChildren, agentId: a.id });
    const { archived, skipped } = m.payload;
    const parts = [`Archived ${plural(archived.length, 'subagent', 'subagents')}.`];
    if (skipped.length) {
      parts.push(`Skipped ${skipped.map((/** @type {{agentId: string, status: string, activity?: ActivityReport | null}} */ s) => `${label(S.agents.get(s.agentId) || { id: s.agentId, type: 'agent' })} (${activityLines(s.activity).map((l) => l.text).join(', ') || s.status})`).join('; ')}.`);
    }
    toast(parts.join(' '));
  } catch (e) { failed('Archive finished')(e); }
}

// ---- composer -----------------------------------------------------------------------------

/**
 * @param {Pane} pane
 * @param {Delivery} delivery
 */
async function sendMessage(pane, delivery) {
  const text = pane.input.value;
  if (!text.trim()) return;
  pane.composerError.textContent = '';
  try {
    const m = await conn.request({ type: ClientType.SendMessage, agentId: pane.id, text, delivery });
    // Only now is the text safe with the daemon; until then it stays in the box.
    if (pane.input.value === text) pane.input.value = '';
    delete S.drafts[pane.id];
    store.set('drover.drafts', S.drafts);
    (S.queued[pane.id] ||= []).push({ messageId: m.payload.messageId, text, delivery, at: Date.now() });
    store.set('drover.queued', S.queued);
    renderQueued(pane);
  } catch (e) {
    pane.composerError.textContent = isOffline(e) ? 'Not sent: the daemon is offline. Your text is kept; send again once connected.' : `Not sent: ${errorMessage(e)}`;
  }
}

/**
 * Messages leave the queue once their turn starts (their `user_message` is recorded).
 * @param {string} id
 * @param {Item[]} items
 */
function settleQueued(id, items) {
  const q = S.queued[id];
  if (!q || !q.length) return;
  const started = new Set();
  // Injected context rides in the next prompt's `context`: a prompt that carries some took
  // every inject queued before it.
  let injected = false;
  for (const it of items) {
    if ((it.kind === 'user_message' || it.kind === 'turn_started') && it.data?.messageId) started.add(it.data.messageId);
    if (it.kind === 'user_message' && it.data?.context?.length) injected = true;
  }
  const rest = q.filter((m) => !started.has(m.messageId) && !(injected && m.delivery === 'inject'));
  if (rest.length === q.length) return;
  S.queued[id] = rest;
  store.set('drover.queued', S.queued);
  const pane = S.panes.get(id);
  if (pane) renderQueued(pane);
}

/**
 * @param {Pane} pane
 */
function renderQueued(pane) {
  const q = S.queued[pane.id] || [];
  // While the agent's start failed, nothing queued reaches it: said as such.
  const waiting = Boolean(S.agents.get(pane.id)?.startFailure);
  pane.queuedEl.hidden = !q.length;
  pane.queuedEl.classList.toggle('undelivered', waiting);
  pane.queuedEl.replaceChildren(
    ...(waiting && q.length ? [h('li', { class: 'queued-head' }, `Not delivered yet: ${plural(q.length, 'message waits', 'messages wait')} for the agent to start.`)] : []),
    ...q.map((m) => h('li', { class: 'queued-item', dataset: { messageId: m.messageId } },
      h('span', { class: 'badge' }, waiting ? 'not delivered' : m.delivery === 'inject' ? 'context' : 'queued'), ' ', m.text)));
}

// ---- changes ------------------------------------------------------------------------------

/** The open changes dialog: its workspace, and how to read git again. @type {{workspaceId: string, load: () => void} | null} */
let openChanges = null;

/**
 * @param {WorkspaceInfo} w
 */
function showChanges(w) {
  modal(`Changes in ${w.name}`, (close) => {
    const body = h('div', { class: 'changes-body' }, 'Reading git…');
    const load = async () => {
      try {
        const m = await conn.request({ type: ClientType.WorkspaceChanges, workspaceId: w.id });
        const c = m.payload.changes;
        body.replaceChildren(
          h('p', { class: 'muted' }, `${plural(c.files.length, 'file', 'files')} changed against ${c.base}${c.truncated ? ' (diff cut: too large)' : ''}`),
          h('ul', { class: 'files' }, /** @type {import('./protocol.gen.js').ChangedFileInfo[]} */ (c.files).map((f) => h('li', null,
            h('details', null, h('summary', null, h('span', { class: `badge st-${f.status}` }, f.status), ' ', f.path, ' ',
              f.added == null ? null : h('span', { class: 'add' }, `+${f.added}`), ' ', f.removed == null ? null : h('span', { class: 'del' }, `−${f.removed}`)),
            h('pre', { class: 'code diff-body' }, (f.diff || '').split('\n').map((l) => h('span', { class: l.startsWith('+') ? 'add' : l.startsWith('-') ? 'del' : l.startsWith('@@') ? 'hunk' : 'ctx' }, `${l}\n`))))))));
      } catch (e) { body.replaceChildren(h('p', { class: 'error-text' }, errorMessage(e))); }
    };
    load();
    openChanges = { workspaceId: w.id, load };
    return h('div', null, h('h2', null, `Changes in ${w.name}`), body,
      h('div', { class: 'dialog-actions' }, h('button', { type: 'button', onclick: load }, 'Refresh'), h('button', { type: 'button', autofocus: true, onclick: () => close() }, 'Close')));
  }, { className: 'wide' }).then(() => { openChanges = null; });
}

// ---- new agent ----------------------------------------------------------------------------

/**
 * @param {string | null} [workspaceId]
 */
async function newAgentDialog(workspaceId = null) {
  let known = S.providers;
  if (!known) {
    try { known = S.providers = /** @type {ProviderInfo[]} */ ((await conn.request({ type: ClientType.ListProviders })).payload.providers); } catch (e) { failed('Providers')(e); return; }
  }
  const providers = known;
  const firstAvailable = providers.find((p) => p.available);
  // Listed as the sidebar lists them: by project, each checkout before its worktrees.
  const project = (/** @type {WorkspaceInfo} */ w) => `${w.host ? `${w.host}:` : ''}${w.worktree?.source || w.path}`;
  const base = (/** @type {string} */ p) => p.replace(/\/+$/, '').split('/').pop() || p;
  const isWorktree = (/** @type {WorkspaceInfo} */ w) => w.kind === WorkspaceKind.Worktree;
  const wss = [...S.workspaces.values()].filter((w) => !w.archivedAt)
    .sort((x, y) => byText(base(project(x)), base(project(y))) || Number(isWorktree(x)) - Number(isWorktree(y)) || byText(x.name, y.name));
  // Unless a workspace's own + says where: the checkout of the project of the agent in front
  // (or that agent's own directory), else the first checkout listed. A worktree is another
  // agent's branch: a new agent goes there only when picked.
  const frontWs = S.workspaces.get(S.agents.get(S.layout.active ?? '')?.workspaceId ?? '');
  const checkoutOf = (/** @type {WorkspaceInfo | undefined} */ w) => !w ? undefined : !isWorktree(w) ? w : wss.find((x) => !isWorktree(x) && project(x) === project(w));
  const initial = workspaceId ?? (checkoutOf(frontWs) ?? wss.find((w) => !isWorktree(w)) ?? wss[0])?.id ?? null;
  await modal('New agent', (close) => {
    const error = h('div', { class: 'error-text', role: 'alert' });
    const hint = h('div', { class: 'muted hint' });
    const provider = h('select', { name: 'provider', required: true, onchange: () => showHint() },
      providers.map((p) => h('option', { value: p.name, disabled: !p.available, selected: p === firstAvailable }, p.available ? p.label : `${p.label} (not installed)`)));
    const showHint = () => {
      const unavailable = providers.filter((p) => !p.available);
      hint.replaceChildren(unavailable.length ? h('details', null,
        h('summary', null, `${plural(unavailable.length, 'provider is', 'providers are')} not installed: how to add them`),
        unavailable.map((p) => h('div', null, `${p.label}: ${p.detail}`))) : '');
    };
    showHint();
    const where = h('select', { name: 'workspace' }, wss.map((w) => h('option', { value: w.id, selected: w.id === initial }, `${w.name} — ${w.host ? `${w.host}:` : ''}${w.path}`)), h('option', { value: '', selected: !wss.length }, 'Another directory…'));
    const dir = h('input', { name: 'cwd', placeholder: '/absolute/path', 'aria-label': 'Directory' });
    // Where “another directory” is: this machine, or a host (`--host` on the command line).
    const host = h('select', { name: 'host', 'aria-label': 'Machine' }, h('option', { value: '' }, 'this machine'),
      [...S.hosts.values()].map((x) => h('option', { value: x.name, disabled: x.state !== HostState.Reachable }, x.state === HostState.Reachable ? x.name : `${x.name} (${x.state})`)));
    const worktree = h('input', { type: 'checkbox', name: 'worktree' });
    const wtName = h('input', { name: 'wtName', placeholder: 'name (optional)', 'aria-label': 'Worktree name' });
    const wtBase = h('input', { name: 'wtBase', placeholder: 'base (default HEAD)', 'aria-label': 'Worktree base' });
    const title = h('input', { name: 'title', 'aria-label': 'Title' });
    const mode = h('input', { name: 'mode', placeholder: 'default', 'aria-label': 'Mode' });
    const model = h('input', { name: 'model', placeholder: 'provider default', 'aria-label': 'Model' });
    const effort = h('input', { name: 'effort', placeholder: 'provider default', 'aria-label': 'Reasoning effort', title: 'Such as low, medium, high, where the agent offers it' });
    const prompt = h('textarea', { name: 'prompt', rows: '4', 'aria-label': 'First prompt', placeholder: 'Ctrl+Enter creates the agent' });
    const autoArchive = h('input', { type: 'checkbox', name: 'autoArchive' });
    const policy = h('select', { name: 'permissionPolicy', 'aria-label': 'Permissions' }, h('option', { value: 'ask' }, 'ask me'), h('option', { value: 'allow' }, 'allow everything'));
    const budgetTokens = h('input', { name: 'budgetTokens', type: 'number', min: '1', step: '1', placeholder: 'no limit', 'aria-label': 'Budget in tokens' });
    const budgetCost = h('input', { name: 'budgetCost', type: 'number', min: '0', step: 'any', placeholder: 'no limit', 'aria-label': 'Budget in cost' });
    const budgetHard = h('input', { type: 'checkbox', name: 'budgetHard' });
    /** @param {Event} e */
    const submit = async (e) => {
      e.preventDefault();
      error.textContent = '';
      /** @type {Extract<ClientMessage, {type: 'create_agent'}>} */
      const msg = { type: ClientType.CreateAgent, provider: provider.value };
      const ws = where.value ? S.workspaces.get(where.value) : undefined;
      if (worktree.checked) {
        msg.cwd = ws ? (ws.worktree?.source || ws.path) : dir.value.trim();
        msg.worktree = { name: wtName.value.trim() || null, base: wtBase.value.trim() || null };
      } else if (ws) msg.workspaceId = ws.id;
      else msg.cwd = dir.value.trim();
      // A workspace's agent goes to the workspace's host by itself; a directory names one.
      if (ws?.host) msg.host = ws.host;
      else if (!ws && host.value) msg.host = host.value;
      /** @type {Array<['title' | 'mode' | 'model' | 'effort' | 'prompt', HTMLInputElement | HTMLTextAreaElement]>} */
      const texts = [['title', title], ['mode', mode], ['model', model], ['effort', effort], ['prompt', prompt]];
      for (const [k, el] of texts) if (el.value.trim()) msg[k] = el.value.trim();
      msg.autoArchive = autoArchive.checked;
      msg.permissionPolicy = /** @type {PermissionPolicy} */ (policy.value);
      // A budget for the agent and its subagents: at 100 % no new turn starts in its tree.
      if (budgetTokens.value || budgetCost.value) {
        msg.budget = { hard: budgetHard.checked };
        if (budgetTokens.value) msg.budget.tokens = Number(budgetTokens.value);
        if (budgetCost.value) msg.budget.cost = Number(budgetCost.value);
      }
      try {
        const m = await conn.request(msg);
        close();
        learn(m.payload.agent);
        openAgent(m.payload.agent.id);
      } catch (err) { error.textContent = errorMessage(err); }
    };
    const field = (/** @type {string} */ text, /** @type {HTMLElement} */ el) => h('label', { class: 'field' }, h('span', null, text), el);
    return h('form', { class: 'new-agent', onsubmit: submit },
      h('h2', null, 'New agent'),
      field('Provider', provider), hint,
      field('Workspace', where), field('Directory (for “another directory”)', dir),
      S.hosts.size ? field('On (for “another directory”)', host) : null,
      h('fieldset', null, h('legend', null, h('label', null, worktree, ' in a new git worktree')), wtName, wtBase),
      field('Title', title), h('div', { class: 'row' }, field('Mode', mode), field('Model', model), field('Effort', effort)),
      field('First prompt', prompt),
      h('div', { class: 'row' }, h('label', null, autoArchive, ' archive when the first turn ends'), field('Permissions', policy)),
      // Folded: most agents have none, and the dialog fits a laptop's screen.
      h('details', { class: 'budget-fields' }, h('summary', null, 'Budget for it and its subagents'),
        h('div', { class: 'row' }, field('Tokens', budgetTokens), field('Cost', budgetCost),
          h('label', { title: 'At 100 % the turns running in its tree are cancelled too' }, budgetHard, ' hard'))),
      error,
      h('div', { class: 'dialog-actions' }, h('button', { type: 'button', onclick: () => close() }, 'Cancel'), h('button', { type: 'submit', class: 'primary' }, 'Create')));
  }, { className: 'wide' });
}

// ---- page wiring --------------------------------------------------------------------------

function wire() {
  byId('filter').addEventListener('input', (e) => { S.filter = /** @type {HTMLInputElement} */ (e.target).value; render(); });
  const chips = /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll('.quick .chip'));
  for (const chip of chips) {
    chip.addEventListener('click', () => {
      S.quick = S.quick === chip.dataset.quick ? null : (chip.dataset.quick ?? null);
      for (const c of chips) c.setAttribute('aria-pressed', String(c.dataset.quick === S.quick));
      render();
    });
  }
  const archived = /** @type {HTMLInputElement} */ (byId('show-archived'));
  archived.addEventListener('change', () => {
    S.showArchived = archived.checked;
    if (S.showArchived) loadArchived();
    render();
  });
  byId('new-agent').addEventListener('click', () => newAgentDialog(null));
  const drawer = byId('drawer-toggle');
  drawer.addEventListener('click', () => {
    const open = document.body.classList.toggle('drawer-open');
    drawer.setAttribute('aria-expanded', String(open));
  });
  // Outside the open drawer is its backdrop: a tap there closes it, as Escape does.
  byId('backdrop').addEventListener('click', closeDrawer);
  const notify = byId('notify');
  const showNotify = () => { notify.setAttribute('aria-pressed', String(S.notify)); notify.textContent = S.notify ? 'Notifications on' : 'Notify me'; };
  showNotify();
  notify.addEventListener('click', async () => {
    if (!S.notify && typeof Notification !== 'undefined' && Notification.permission !== 'granted') {
      if ((await Notification.requestPermission()) !== 'granted') { toast('The browser refused notifications.', 'error'); return; }
    }
    S.notify = !S.notify;
    store.set('drover.notify', S.notify);
    showNotify();
  });
  byId('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const raw = /** @type {HTMLInputElement} */ (byId('token-input')).value.trim();
    const m = /token=([^&\s]+)/.exec(raw);
    const token = m ? decodeURIComponent(m[1]) : raw;
    if (!token) return;
    store.set('drover.token', token);
    conn.token = token;
    conn.retry();
  });
  document.addEventListener('visibilitychange', () => render({ sidebar: false }));
  document.addEventListener('keydown', (e) => {
    const target = /** @type {Element} */ (e.target);
    if (e.key === 'Escape' && document.body.classList.contains('drawer-open') && !target.closest('dialog')) {
      closeDrawer();
      drawer.focus();
      return;
    }
    if (target.closest('input, textarea, select, dialog')) return;
    if (e.key === '/') { e.preventDefault(); byId('filter').focus(); }
    if (e.key === 'n' && !e.ctrlKey && !e.metaKey) { e.preventDefault(); newAgentDialog(null); }
  });
}

wire();
renderConnection();
conn.connect();
