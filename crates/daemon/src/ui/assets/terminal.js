// Workspace terminals in the web UI: a shell on the daemon's host per tab, in the workspace's
// directory (`create_terminal`), drawn by xterm.js (vendored by scripts/vendor-xterm, loaded
// the first time a terminal is shown). Not an agent's ACP terminals, which are its jobs.
//
// A terminal's output comes by byte offset (`attach_terminal` → `terminal_output`): a page
// that reloads attaches from the start of the daemon's scrollback and the screen is drawn
// again; after a reconnect it attaches from where it stopped. Closing a terminal's tab ends
// its shell and everything it runs (`close_terminal`).
import { ClientType, DaemonType } from './protocol.gen.js';
import { h, plural } from './dom.js';
import { ProtocolError, isOffline } from './conn.js';
/** @typedef {import('./conn.js').Conn} Conn */
/** @typedef {import('./protocol.gen.js').TerminalInfo} TerminalInfo */
/** @typedef {import('./protocol.gen.js').DaemonMessage} DaemonMessage */
/** @typedef {import('./protocol.gen.js').ClientMessage} ClientMessage */

// Not literal imports: the 340 KB library loads only when a terminal is shown (and the type
// checker does not read the minified library).
const XTERM = './xterm.mjs';
const FIT = './xterm-addon-fit.mjs';
/** @type {Promise<{Terminal: any, FitAddon: any}> | null} */
let library = null;
function xterm() {
  library ??= Promise.all([import(XTERM), import(FIT)])
    .then(([x, f]) => ({ Terminal: x.Terminal, FitAddon: f.FitAddon }));
  return library;
}

const LIGHT = {
  background: '#ffffff', foreground: '#1b1f24', cursor: '#1b1f24', cursorAccent: '#ffffff', selectionBackground: '#b6d3f7',
  black: '#24292f', red: '#b01b25', green: '#116329', yellow: '#6b4500', blue: '#0550ae', magenta: '#6639ba', cyan: '#1b6b7a', white: '#57606a',
  brightBlack: '#57606a', brightRed: '#a40e26', brightGreen: '#1a7f37', brightYellow: '#633c01', brightBlue: '#0969da', brightMagenta: '#8250df', brightCyan: '#136061', brightWhite: '#6e7781',
};
const DARK = {
  background: '#0d1117', foreground: '#e6edf3', cursor: '#e6edf3', cursorAccent: '#0d1117', selectionBackground: '#264f78',
  black: '#8d96a0', red: '#ff7b72', green: '#3fb950', yellow: '#d29922', blue: '#58a6ff', magenta: '#bc8cff', cyan: '#39c5cf', white: '#b1bac4',
  brightBlack: '#8d96a0', brightRed: '#ffa198', brightGreen: '#56d364', brightYellow: '#e3b341', brightBlue: '#79c0ff', brightMagenta: '#d2a8ff', brightCyan: '#56d4dd', brightWhite: '#f0f6fc',
};
const dark = window.matchMedia('(prefers-color-scheme: dark)');

/** One terminal shown in the page: its xterm.js, and where its output stands. */
class View {
  /** @param {Terminals} owner @param {string} id */
  constructor(owner, id) {
    this.owner = owner;
    this.id = id;
    this.el = h('div', { class: 'term-view', dataset: { terminalId: id } });
    /** The offset of the next byte to show; null until the first output. @type {number | null} */
    this.next = null;
    /** @type {string | null} */
    this.session = null;
    this.disposed = false;
    this.ended = false;
    /** @type {any} */
    this.term = null;
    /** xterm.js's fit addon (untyped, as `term`). @type {any} */
    this.fit = null;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    this.resizing = undefined;
    this.observer = new ResizeObserver(() => this.fitNow());
  }

  async start() {
    const { Terminal, FitAddon } = await xterm();
    if (this.disposed) return;
    this.term = new Terminal({
      cursorBlink: true, fontSize: 13, scrollback: 5000,
      fontFamily: 'ui-monospace, SFMono-Regular, Menlo, monospace',
      theme: dark.matches ? DARK : LIGHT,
    });
    this.fit = new FitAddon();
    this.term.loadAddon(this.fit);
    this.term.open(this.el);
    this.term.textarea?.setAttribute('aria-label', `Terminal ${this.id} input (Shift+Escape leaves it)`);
    // The shell takes Tab: Shift+Escape is the way out for the keyboard, to its tab.
    this.term.attachCustomKeyEventHandler((/** @type {KeyboardEvent} */ e) => {
      if (e.key !== 'Escape' || !e.shiftKey) return true;
      if (e.type === 'keydown') /** @type {HTMLElement | null} */ (this.el.closest('section.terminals')?.querySelector('.term-tab.active .term-open'))?.focus();
      return false;
    });
    this.term.onData((/** @type {string} */ data) => {
      if (this.ended) return;
      this.owner.conn.request({ type: ClientType.TerminalInput, terminalId: this.id, data }).catch(this.owner.failed('Typing'));
    });
    this.term.onResize((/** @type {{cols: number, rows: number}} */ { cols, rows }) => {
      clearTimeout(this.resizing);
      this.resizing = setTimeout(() => {
        if (!this.ended) this.owner.conn.request({ type: ClientType.ResizeTerminal, terminalId: this.id, cols, rows }).catch(() => {});
      }, 150);
    });
    this.observer.observe(this.el);
    this.fitNow();
    this.attach();
  }

  fitNow() {
    if (!this.fit || !this.el.isConnected || !this.el.offsetWidth) return;
    try { this.fit.fit(); } catch { /* not laid out yet */ }
  }

  theme() { if (this.term) this.term.options.theme = dark.matches ? DARK : LIGHT; }

  /** Attaches this session, from where the screen stands (the scrollback's start at first). */
  attach() {
    if (!this.term || this.ended || this.owner.conn.state !== 'online') return;
    this.session = this.owner.sessionId;
    /** @type {Extract<ClientMessage, {type: 'attach_terminal'}>} */
    const msg = { type: ClientType.AttachTerminal, terminalId: this.id };
    if (this.next != null) msg.offset = this.next;
    this.owner.conn.request(msg).catch((e) => {
      if (e instanceof ProtocolError && e.code === 'unknown_terminal') this.exit({ status: 'ended' });
      else if (!isOffline(e)) this.owner.failed('Attaching the terminal')(e);
    });
  }

  /** @param {{offset: number, data: string, nextOffset: number}} p */
  output(p) {
    if (!this.term) return;
    // Bytes already shown (an attachment of before a reconnect) are not shown twice.
    if (this.next != null && p.offset < this.next) return;
    this.term.write(p.data);
    this.next = p.nextOffset;
    this.el.dataset.offset = String(p.nextOffset);
  }

  /** @param {{status: string}} p */
  exit(p) {
    if (this.ended) return;
    this.ended = true;
    this.el.dataset.ended = 'true';
    this.term?.write(`\r\n\x1b[2m[${p.status}]\x1b[0m\r\n`);
  }

  focus() { this.term?.focus(); }

  dispose() {
    this.disposed = true;
    this.observer.disconnect();
    clearTimeout(this.resizing);
    this.term?.dispose();
    this.el.remove();
  }
}

/** The daemon's workspace terminals as this page knows them, and their views. */
export class Terminals {
  /**
   * @param {{conn: Conn, failed: (what: string) => (e: unknown) => void, changed: () => void, store: {get: <T>(key: string, fallback: T) => T, set: (key: string, value: unknown) => void}}} deps
   */
  constructor({ conn, failed, changed, store }) {
    this.conn = conn;
    this.failed = failed;
    this.changed = changed;
    this.store = store;
    /** @type {Map<string, TerminalInfo>} every running terminal by id */
    this.all = new Map();
    /** @type {Map<string, View>} */
    this.views = new Map();
    /** @type {string | null} */
    this.sessionId = null;
    // Per workspace: whether its panel is open and which terminal is in front.
    this.prefs = store.get('drover.terminals', /** @type {Record<string, {open: boolean, active: string | null}>} */ ({}));
    dark.addEventListener('change', () => { for (const v of this.views.values()) v.theme(); });
  }

  savePrefs() { this.store.set('drover.terminals', this.prefs); }

  /**
   * After every `session_state`: the list read again, the shown terminals attached again.
   * @param {string | null} sessionId
   */
  synced(sessionId) {
    this.sessionId = sessionId;
    this.conn.request({ type: ClientType.ListTerminals }).then((m) => {
      this.all = new Map(/** @type {TerminalInfo[]} */ (m.payload.terminals).map((t) => [t.id, t]));
      for (const [id, view] of this.views) {
        if (!this.all.has(id)) view.exit({ status: 'ended' });
        else if (view.session !== sessionId) view.attach();
      }
      this.changed();
    }).catch(() => {});
  }

  /**
   * The daemon's terminal messages; whether `msg` was one.
   * @param {DaemonMessage} msg
   */
  onMessage(msg) {
    switch (msg.type) {
      case DaemonType.TerminalUpdate: {
        const p = msg.payload;
        if (p.terminal) this.all.set(p.terminalId, p.terminal);
        else { this.all.delete(p.terminalId); this.views.get(p.terminalId)?.exit({ status: 'ended' }); }
        this.changed();
        return true;
      }
      case DaemonType.TerminalOutput:
        this.views.get(msg.payload.terminalId)?.output(msg.payload);
        return true;
      case DaemonType.TerminalExit:
        this.views.get(msg.payload.terminalId)?.exit(msg.payload);
        return true;
      default:
        return false;
    }
  }

  /** @param {string} workspaceId */
  of(workspaceId) { return [...this.all.values()].filter((t) => t.workspaceId === workspaceId); }

  /** @param {string} workspaceId */
  prefsOf(workspaceId) { return this.prefs[workspaceId] || { open: false, active: null }; }

  /** @param {string} workspaceId */
  async create(workspaceId) {
    try {
      const m = await this.conn.request({ type: ClientType.CreateTerminal, workspaceId, cols: 100, rows: 24 });
      const t = m.payload.terminal;
      if (!this.all.has(t.id)) this.all.set(t.id, t);
      this.prefs[workspaceId] = { open: true, active: t.id };
      this.savePrefs();
      this.changed();
    } catch (e) { this.failed('New terminal')(e); }
  }

  /** @param {TerminalInfo} t */
  async close(t) {
    try {
      await this.conn.request({ type: ClientType.CloseTerminal, terminalId: t.id });
      this.all.delete(t.id);
      this.changed();
    } catch (e) { this.failed('Closing the terminal')(e); }
  }

  /** @param {string} id */
  view(id) {
    let v = this.views.get(id);
    if (!v) {
      v = new View(this, id);
      this.views.set(id, v);
      v.start().catch(this.failed('Opening the terminal'));
    }
    return v;
  }

  /** Views of terminals that ended and are not shown any more go. */
  prune() {
    for (const [id, v] of this.views) {
      if (!this.all.has(id) && !v.el.isConnected) { v.dispose(); this.views.delete(id); }
    }
  }

  /**
   * The Terminals panel of a pane showing a workspace: its head (a count that opens and
   * collapses it, New terminal), then a tab per terminal and the front one's screen.
   * @returns {{el: HTMLElement, render: (workspaceId: string | null, usable: boolean) => void}}
   */
  panel() {
    const el = h('section', { class: 'terminals', 'aria-label': 'Terminals' });
    const body = h('div', { class: 'term-body' });
    /** @type {string | null} */
    let key = null;
    /**
     * @param {string | null} workspaceId
     * @param {boolean} usable
     */
    const render = (workspaceId, usable) => {
      if (!workspaceId || !usable) { el.hidden = true; key = null; return; }
      el.hidden = false;
      const list = this.of(workspaceId);
      const prefs = this.prefsOf(workspaceId);
      const active = list.find((t) => t.id === prefs.active) || list[list.length - 1] || null;
      const open = prefs.open && list.length > 0;
      const k = JSON.stringify([workspaceId, list.map((t) => t.id), open, active?.id, this.conn.state]);
      if (k !== key) {
        key = k;
        const toggle = () => { this.prefs[workspaceId] = { ...prefs, open: !open }; this.savePrefs(); this.changed(); };
        const head = h('div', { class: 'track-head' },
          list.length
            ? h('button', { type: 'button', class: 'track-toggle', 'aria-expanded': String(open), onclick: toggle }, plural(list.length, 'terminal', 'terminals'))
            : h('span', { class: 'term-none' }, 'Terminals'),
          h('button', { type: 'button', class: 'small new-terminal', disabled: this.conn.state !== 'online', title: 'A shell in this workspace’s directory, on the daemon’s machine', onclick: () => this.create(workspaceId) }, 'New terminal'));
        const tabs = open ? h('ul', { class: 'term-tabs', role: 'list', 'aria-label': 'Open terminals' }, list.map((t) => h('li', { class: `term-tab${t.id === active?.id ? ' active' : ''}`, dataset: { terminalId: t.id } },
          h('button', {
            type: 'button', class: 'term-open', 'aria-current': t.id === active?.id ? 'true' : null, title: `${t.shell} in ${t.cwd}`,
            onclick: () => { this.prefs[workspaceId] = { open: true, active: t.id }; this.savePrefs(); this.changed(); this.views.get(t.id)?.focus(); },
          }, `${t.id} · ${t.shell.split('/').pop()}`),
          h('button', { type: 'button', class: 'term-close', 'aria-label': `Close ${t.id}: ends its shell`, title: 'Close: ends the shell and everything it runs', onclick: () => this.close(t) }, '×')))) : null;
        const note = open ? h('p', { class: 'muted term-note' }, 'Closing a terminal’s tab ends its shell and everything it runs. Shift+Escape leaves the terminal.') : null;
        el.replaceChildren(head, tabs || '', open ? body : '', note || '');
      }
      if (open && active) {
        const v = this.view(active.id);
        if (v.el.parentNode !== body || body.childNodes.length !== 1) body.replaceChildren(v.el);
        v.fitNow();
      }
      this.prune();
    };
    return { el, render };
  }
}
