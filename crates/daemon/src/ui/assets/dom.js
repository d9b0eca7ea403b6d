// Small DOM helpers. Text always goes in as text nodes: nothing from the daemon or an agent is
// ever parsed as HTML.

/** h('button', {class: 'x', onclick: f, 'aria-label': 'Close'}, 'text', child…) */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.className = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k === 'value') el.value = v;
      else if (k === 'checked' || k === 'disabled' || k === 'selected') el[k] = Boolean(v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** `n thing`/`n things`. */
export function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

/**
 * A modal dialog (native <dialog>: the page behind is inert, so focus stays inside, and Escape
 * closes it). `build(close)` returns the body; resolves with what `close` was given, or null.
 */
export function modal(label, build, { className = '' } = {}) {
  return new Promise((resolve) => {
    const dialog = h('dialog', { class: `dialog ${className}`, 'aria-label': label, 'aria-modal': 'true' });
    let done = false;
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
      if (e.key !== 'Tab') return;
      const items = [...dialog.querySelectorAll('button, input, select, textarea, summary, [href], [tabindex]:not([tabindex="-1"])')]
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
    const first = dialog.querySelector('[autofocus]') || dialog.querySelector('button, input, select, textarea');
    if (first) first.focus();
  });
}

/** A yes/no dialog; resolves true on confirm. */
export function confirmDialog({ title, body, confirm, danger = true }) {
  return modal(title, (close) => h('form', { method: 'dialog', onsubmit: (e) => { e.preventDefault(); close(true); } },
    h('h2', null, title),
    body ? h('div', { class: 'dialog-body' }, body) : null,
    h('div', { class: 'dialog-actions' },
      h('button', { type: 'button', onclick: () => close(false) }, 'Cancel'),
      h('button', { type: 'submit', class: danger ? 'danger' : 'primary', autofocus: true }, confirm)))).then(Boolean);
}

/** Relative time, short: `5s`, `3m`, `2h`, `4d`. */
export function ago(iso) {
  if (!iso) return '';
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}
