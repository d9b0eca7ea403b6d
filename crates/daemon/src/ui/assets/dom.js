// Small DOM helpers. Text always goes in as text nodes: nothing from the daemon or an agent is
// ever parsed as HTML.

/**
 * The page's element with this id, which index.html always has.
 * @param {string} id
 * @returns {HTMLElement}
 */
export function byId(id) {
  const el = document.getElementById(id);
  if (!el) throw new Error(`the page has no #${id}`);
  return el;
}

/**
 * The element under `root` that `selector` finds, which the page's own markup always has.
 * @param {ParentNode} root
 * @param {string} selector
 * @returns {HTMLElement}
 */
export function within(root, selector) {
  const el = root.querySelector(selector);
  if (!(el instanceof HTMLElement)) throw new Error(`nothing matches ${selector}`);
  return el;
}

/**
 * One of `h`'s children: a node or text (numbers too); null, undefined and false are skipped
 * (so `cond && h(…)` works).
 * @typedef {Node | string | number | boolean | null | undefined} Leaf
 */

/**
 * What `h` takes as children: leaves, and lists of them (two deep: a JSDoc type cannot nest
 * itself).
 * @typedef {Leaf | Array<Leaf | Array<Leaf>>} Child
 */

/**
 * An attribute's value: skipped when null, undefined or false; `on…` take a listener, `dataset`
 * an object.
 * @typedef {{[E in keyof HTMLElementEventMap as `on${E}`]?: (e: HTMLElementEventMap[E]) => unknown} & Record<string, unknown>} Attrs
 */

/**
 * h('button', {class: 'x', onclick: f, 'aria-label': 'Close'}, 'text', child…)
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Attrs | null} [attrs]
 * @param {...Child} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), /** @type {EventListener} */ (v));
      else if (k === 'class') el.className = String(v);
      else if (k === 'dataset') Object.assign(el.dataset, v);
      // Properties of the form controls (inputs, selects, options, buttons), not attributes.
      else if (k === 'value') Reflect.set(el, k, v);
      else if (k === 'checked' || k === 'disabled' || k === 'selected') Reflect.set(el, k, Boolean(v));
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

/**
 * @param {Element} el
 * @param {Array<Leaf | Array<Leaf | Array<Leaf>>>} children
 */
function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/**
 * Orders two strings by their characters, case aside (then by case): names and ISO times. Not
 * `localeCompare`, whose first call builds the browser's collator, tens of milliseconds on the
 * page's first drawing.
 * @param {string} x
 * @param {string} y
 * @returns {number}
 */
export function byText(x, y) {
  const a = x.toLowerCase();
  const b = y.toLowerCase();
  if (a !== b) return a < b ? -1 : 1;
  return x < y ? -1 : x > y ? 1 : 0;
}

/**
 * `n thing`/`n things`.
 * @param {number} n
 * @param {string} one
 * @param {string} many
 */
export function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

/**
 * A modal dialog (native <dialog>: the page behind is inert, so focus stays inside, and Escape
 * closes it). `build(close)` returns the body; resolves with what `close` was given, or null.
 */
/**
 * @template T
 * @param {string} label
 * @param {(close: (value?: T | null) => void) => Node} build
 * @param {{className?: string}} [options]
 * @returns {Promise<T | null>}
 */
export function modal(label, build, { className = '' } = {}) {
  return new Promise((resolve) => {
    const dialog = h('dialog', { class: `dialog ${className}`, 'aria-label': label, 'aria-modal': 'true' });
    let done = false;
    /** @param {T | null} [value] */
    const close = (value) => {
      if (done) return;
      done = true;
      dialog.close();
      dialog.remove();
      resolve(value ?? null);
    };
    dialog.addEventListener('cancel', (e) => { e.preventDefault(); close(null); });
    // The page behind a modal dialog is inert, but Tab may still leave for the browser's own
    // controls: keep it cycling through the dialog.
    dialog.addEventListener('keydown', (e) => {
      // Ctrl+Enter (⌘+Enter) submits the dialog's form from anywhere in it, a multi-line
      // field included, as Enter does from a one-line field.
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
        const form = e.target instanceof Element ? e.target.closest('form') : null;
        if (form) { e.preventDefault(); form.requestSubmit(); }
        return;
      }
      if (e.key !== 'Tab') return;
      /** @type {NodeListOf<HTMLElement & {disabled?: boolean}>} */
      const focusable = dialog.querySelectorAll('button, input, select, textarea, summary, [href], [tabindex]:not([tabindex="-1"])');
      const items = [...focusable]
        .filter((el) => !el.disabled && el.offsetParent !== null);
      if (!items.length) return;
      const first = items[0];
      const last = items[items.length - 1];
      if (e.shiftKey && document.activeElement === first) { e.preventDefault(); last.focus(); }
      else if (!e.shiftKey && document.activeElement === last) { e.preventDefault(); first.focus(); }
    });
    dialog.appendChild(build(close));
    document.body.appendChild(dialog);
    dialog.showModal();
    /** @type {HTMLElement | null} */
    const first = dialog.querySelector('[autofocus]') || dialog.querySelector('button, input, select, textarea');
    if (first) first.focus();
  });
}

/**
 * A yes/no dialog; resolves true on confirm.
 * @param {{title: string, body?: Child, confirm: string, danger?: boolean}} question
 * @returns {Promise<boolean>}
 */
export function confirmDialog({ title, body, confirm, danger = true }) {
  return modal(title, (close) => h('form', { method: 'dialog', onsubmit: (e) => { e.preventDefault(); close(true); } },
    h('h2', null, title),
    body ? h('div', { class: 'dialog-body' }, body) : null,
    h('div', { class: 'dialog-actions' },
      h('button', { type: 'button', onclick: () => close(false) }, 'Cancel'),
      h('button', { type: 'submit', class: danger ? 'danger' : 'primary', autofocus: true }, confirm)))).then(Boolean);
}

/**
 * Relative time, short: `5s`, `3m`, `2h`, `4d`.
 * @param {string | null | undefined} iso
 */
export function ago(iso) {
  if (!iso) return '';
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}
