// The card an agent's pane shows while its last start failed (`AgentInfo.startFailure`): "Sign in
// to …" with one way per sign-in method when what it needs is a sign-in, else "Could not start"
// with the agent's own words, when it tries again, and Retry. It only builds the card; the
// requests (`sign_in`, `restart_agent`) are the caller's.
import { h } from './dom.js';
import { errorMessage } from './conn.js';
/** @typedef {import('./protocol.gen.js').AgentInfo} AgentInfo */
/** @typedef {import('./protocol.gen.js').AuthMethod} AuthMethod */
/**
 * What a sign-in sends: a method, with the values of its variables for an `env_var` one.
 * @typedef {(methodId: string, vars: Record<string, string> | null) => Promise<unknown>} SignIn
 */
/** @typedef {(methodId: string, vars: Record<string, string> | null, button: HTMLButtonElement) => Promise<void>} Run */

/**
 * The card for `a`, or null when its last start did not fail. `provider` is the provider's
 * label; `signIn(methodId, vars)` and `restart()` return promises.
 * @param {AgentInfo} a
 * @param {{provider: string, signIn: SignIn, restart: () => Promise<unknown>}} actions
 */
export function startCard(a, { provider, signIn, restart }) {
  const failure = a.startFailure;
  if (!failure) return null;
  return failure.signIn ? signInCard(a, failure.signIn, { provider, signIn })
    : failedCard(a, { restart });
}

/**
 * The key a rendered card stands for: the same key, the same card (and what is typed in it, and
 * what a Retry said). The countdown is not in it: `startWhen` updates that text in place.
 * @param {AgentInfo} a
 */
export function startCardKey(a) {
  const f = a.startFailure;
  if (!f) return '';
  return JSON.stringify([f.at, f.signIn, a.error, a.status, a.runtime?.state, a.runtime?.retryAt]);
}

/**
 * When a failed agent starts again: the line under its words, updated as the seconds pass.
 * @param {AgentInfo} a
 */
export function startWhen(a) {
  const secs = retryIn(a);
  return starting(a) ? 'Starting again…'
    : secs !== null ? `It tries again by itself in ${secs} s (${new Date(a.runtime?.retryAt ?? '').toLocaleTimeString()}).`
      : 'It does not try again by itself: fix what it says, then Retry.';
}

/**
 * Whole seconds until the next automatic try, or null when there is none.
 * @param {AgentInfo} a
 * @returns {number | null}
 */
export function retryIn(a) {
  const at = a.runtime?.retryAt;
  if (!at) return null;
  return Math.max(0, Math.ceil((Date.parse(at) - Date.now()) / 1000));
}

/** @param {AgentInfo} a */
function starting(a) {
  return a.status === 'initializing' || a.runtime?.state === 'starting' || a.runtime?.state === 'queued';
}

/**
 * @param {AgentInfo} a
 * @param {AuthMethod[]} methods
 * @param {{provider: string, signIn: SignIn}} actions
 */
function signInCard(a, methods, { provider, signIn }) {
  // A sign-in just sent restarts the agent: the card built meanwhile says so.
  const status = h('p', { class: 'start-status', role: 'status' }, starting(a) ? 'Starting again…' : '');
  const error = h('p', { class: 'error-text', role: 'alert' });
  /** @type {Run} */
  const run = async (methodId, vars, button) => {
    error.textContent = '';
    status.textContent = 'Signing in…';
    button.disabled = true;
    try {
      await signIn(methodId, vars);
      status.textContent = 'Signed in: the agent starts again.';
    } catch (e) {
      status.textContent = '';
      error.textContent = errorMessage(e);
    } finally {
      button.disabled = false;
    }
  };
  const ways = methods.map((m) => h('li', { class: `sign-in-method method-${m.type}`, dataset: { methodId: m.id } },
    h('div', { class: 'method-name' }, h('strong', null, m.name || m.id), m.description ? h('span', { class: 'muted' }, ` — ${m.description}`) : null),
    way(a, m, run)));
  return h('section', { class: 'start-card sign-in', 'aria-label': `Sign in to ${provider}` },
    h('div', { class: 'start-head' }, h('h2', null, `Sign in to ${provider}`),
      h('span', { class: 'muted' }, 'What you send is kept and runs once it is signed in.')),
    // The agent's own words: a refused key says so here.
    a.error ? h('p', { class: 'start-words' }, a.error) : null,
    h('ul', { class: 'sign-in-methods', role: 'list' }, ways),
    status, error);
}

/**
 * How to use one method: a form for a key, the command for a terminal login, or a button.
 * @param {AgentInfo} a
 * @param {AuthMethod} m
 * @param {Run} run
 */
function way(a, m, run) {
  if (m.type === 'env_var') {
    const inputs = (m.vars || []).map((v) => h('input', {
      // A secret is never shown: not as typed, not once sent (the field clears).
      type: v.secret === false ? 'text' : 'password', name: v.name, required: !v.optional,
      autocomplete: 'off', spellcheck: 'false', 'aria-label': v.label || v.name, placeholder: v.label || v.name,
    }));
    const button = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
    const link = safeLink(m.link);
    return h('form', {
      class: 'sign-in-form',
      onsubmit: (e) => {
        e.preventDefault();
        /** @type {Record<string, string>} */
        const vars = {};
        for (const input of inputs) if (input.value) vars[input.name] = input.value;
        for (const input of inputs) input.value = '';
        run(m.id, vars, button);
      },
    },
    inputs, button,
    link ? h('a', { href: link, target: '_blank', rel: 'noopener noreferrer' }, 'Where to get a key') : null);
  }
  if (m.type === 'terminal') {
    return h('div', { class: 'sign-in-terminal' },
      h('span', { class: 'muted' }, 'in a terminal on the daemon’s machine: '),
      h('code', { class: 'sign-in-command' }, `drover login ${a.type} --method ${m.id}`));
  }
  /** @type {HTMLButtonElement} */
  const button = h('button', { type: 'button', class: 'primary', onclick: () => run(m.id, null, button) }, `Sign in with ${m.name || m.id}`);
  return button;
}

/**
 * Only a web address is a link; anything else an agent sends (`javascript:`…) is not.
 * @param {string | null | undefined} link
 */
function safeLink(link) {
  if (!link) return null;
  try {
    const url = new URL(link);
    return url.protocol === 'https:' || url.protocol === 'http:' ? url.href : null;
  } catch { return null; }
}

/**
 * @param {AgentInfo} a
 * @param {{restart: () => Promise<unknown>}} actions
 */
function failedCard(a, { restart }) {
  const error = h('p', { class: 'error-text', role: 'alert' });
  const when = startWhen(a);
  /** @type {HTMLButtonElement} */
  const button = h('button', {
    type: 'button', class: 'primary start-retry', disabled: starting(a),
    onclick: async () => {
      error.textContent = '';
      button.disabled = true;
      try { await restart(); } catch (e) { error.textContent = errorMessage(e); button.disabled = false; }
    },
  }, 'Retry');
  return h('section', { class: 'start-card failed', 'aria-label': 'Could not start' },
    h('h2', null, 'Could not start'),
    h('pre', { class: 'code start-words' }, a.error || 'The agent did not start.'),
    h('div', { class: 'row' }, h('span', { class: 'start-when' }, when), button),
    h('p', { class: 'muted' }, 'What you send it is kept and runs once it starts.'),
    error);
}
