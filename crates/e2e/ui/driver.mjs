// The browser side of the web UI's tests (crates/e2e/tests/e2e/ui.rs): one scenario per rule,
// run in the system's headless Chromium through playwright-core. The Rust test starts the
// daemon, makes the agents, runs `node driver.mjs <scenario>` with DROVER_UI_ARGS (JSON), and
// checks the daemon's side afterwards. `@wait <step>` on stdout asks the Rust side to act
// (restart the daemon, archive over the protocol) and answer a line on stdin.
import { createRequire } from 'node:module';
import { mkdirSync, readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

const require = createRequire(`${process.env.DROVER_UI_NODE_MODULES}/`);
const { chromium } = require('playwright-core');

const A = JSON.parse(process.env.DROVER_UI_ARGS);
const WAIT = 20000;
mkdirSync(A.shots, { recursive: true });

const lines = createInterface({ input: process.stdin });
const answers = [];
let waiting = null;
lines.on('line', (l) => { if (waiting) { const w = waiting; waiting = null; w(l); } else answers.push(l); });
/** Asks the Rust side to do `name` and waits for its answer. */
function step(name) {
  process.stdout.write(`@wait ${name}\n`);
  return answers.length ? Promise.resolve(answers.shift()) : new Promise((r) => { waiting = r; });
}

const browser = await chromium.launch({
  executablePath: process.env.DROVER_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  // launch() gives every run a fresh temporary profile (its own --user-data-dir).
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

const errors = [];
const pages = [];
async function open({ token = A.token, viewport = { width: 1280, height: 800 }, mobile = false, fragment = '', init = null } = {}) {
  const context = await browser.newContext({ viewport, isMobile: mobile, hasTouch: mobile, deviceScaleFactor: 1 });
  // A script run in the page before its own (e.g. a browser clock not in step with the daemon's).
  if (init) await context.addInitScript(init);
  const page = await context.newPage();
  pages.push(page);
  page.setDefaultTimeout(WAIT);
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error' && !/WebSocket|ERR_CONNECTION_REFUSED|Failed to load resource/.test(m.text())) errors.push(`console: ${m.text()}`); });
  await page.goto(A.url + (token ? `#token=${encodeURIComponent(token)}` : '') + fragment);
  return page;
}

async function ready(page) {
  await page.locator('#app').waitFor({ state: 'visible' });
  await page.waitForFunction(() => document.querySelector('#connection')?.hidden && document.querySelectorAll('#workspaces li').length > 0);
}

const row = (id) => `#workspaces li.agent-row[data-agent-id="${id}"] button.open`;
const tab = (id) => `#tabs .tab[data-agent-id="${id}"]`;
const pane = (id) => `.agent-pane[data-agent-id="${id}"]`;
const trackRow = (parent, child) => `${pane(parent)} .track-row[data-agent-id="${child}"]`;

/** axe-core, the accessibility engine, run in the page on every screen a test shows. */
const axeSource = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const inaccessible = [];

async function shot(page, name) {
  await page.screenshot({ path: `${A.shots}/${name}.png`, fullPage: false });
  await accessible(page, name);
  // The same screen in the dark scheme the page follows from the system.
  await page.emulateMedia({ colorScheme: 'dark' });
  await accessible(page, `${name} (dark)`);
  await page.emulateMedia({ colorScheme: null });
}

/** Records the serious and critical violations axe-core finds on the screen as it is now. */
async function accessible(page, where) {
  // Evaluated, not added as a script tag: the page's Content-Security-Policy allows no inline
  // script, and the engine is the test's, not the product's.
  if (!await page.evaluate(() => Boolean(window.axe))) await page.evaluate(axeSource);
  const found = await page.evaluate(async () => {
    const result = await window.axe.run(document, { resultTypes: ['violations'] });
    return result.violations
      .filter((v) => v.impact === 'serious' || v.impact === 'critical')
      .map((v) => `${v.id} (${v.impact}): ${v.help}; ${v.nodes.slice(0, 3).map((n) => `${n.target.join(' ')} [${(n.any[0] || n.all[0] || n.none[0])?.message ?? ''}]`).join(', ')}`);
  });
  for (const f of found) inaccessible.push(`${where}: ${f}`);
}

async function gone(page, selector) {
  await page.locator(selector).first().waitFor({ state: 'detached' });
}

function fail(message) { throw new Error(message); }

/** Every target a finger can reach on screen is at least 44 px high. */
async function fingerSized(page, where) {
  const small = await page.evaluate(() => [...document.querySelectorAll('#app button, #app select, #app summary, #app input:not([type=checkbox]):not([type=radio]), #app label')]
    .filter((e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0 && r.right > 1 && r.left < innerWidth; })
    .filter((e) => e.getBoundingClientRect().height < 44)
    .map((e) => `${e.tagName.toLowerCase()}.${e.className}: ${(e.innerText || e.getAttribute('aria-label') || '').slice(0, 20)} ${Math.round(e.getBoundingClientRect().height)}px`));
  if (small.length) fail(`${where}: targets under 44 px: ${small.join('; ')}`);
}

async function openAgent(page, id) {
  await page.click(row(id));
  await page.locator(`${pane(id)} .timeline`).waitFor({ state: 'visible' });
}

const scheduleRow = (agent, id) => `${pane(agent)} .schedule-row[data-schedule-id="${id}"]`;

const scenarios = {
  // Another host's agent is listed under its project, marked with its host; it opens and
  // shows its history like a local one; a lost host says so where its agents are.
  async hosts() {
    const page = await open();
    await ready(page);
    // The sidebar is one flat list: a project's head row comes before its workspaces and agents.
    await page.locator(row(A.remote)).waitFor();
    const project = page.locator('#workspaces li.project-head', { has: page.locator('.host-badge') });
    await project.locator('.host-badge', { hasText: '@b' }).waitFor();
    const before = await page.evaluate((id) => {
      const rows = [...document.querySelectorAll('#workspaces > li')];
      const at = rows.findIndex((r) => r instanceof HTMLElement && r.dataset.agentId === id);
      return rows.slice(0, at).filter((r) => r.classList.contains('project-head')).pop()?.querySelector('.host-badge')?.textContent;
    }, A.remote);
    if (before !== '@b') fail(`the remote agent's row is under a project marked ${before}`);
    await openAgent(page, A.remote);
    await page.waitForFunction(([sel, t]) => document.querySelector(sel)?.innerText.includes(t), [`${pane(A.remote)} .timeline`, 'hello from b']);
    await page.locator(`${pane(A.remote)} .host-badge`, { hasText: '@b' }).waitFor();
    await shot(page, 'hosts-reachable');
    // A subagent on b of an agent here: in its parent's track, marked with its host.
    await openAgent(page, A.parent);
    const kid = page.locator(`${pane(A.parent)} .track-row[data-agent-id="${A.kid}"]`);
    await kid.locator('.host-badge', { hasText: '@b' }).waitFor();
    await shot(page, 'hosts-subagent');
    await openAgent(page, A.remote);
    await step('cut');
    const down = project.locator('.host-badge.down');
    await down.waitFor();
    const said = await down.innerText();
    if (!said.includes('@b · unreachable')) fail(`the host badge says ${said}`);
    // First "the link ended"; then the next try's own words, once it was refused.
    await page.waitForFunction(() => document.querySelector('#workspaces .host-badge.down')?.title.includes('Connection refused'));
    // Its agents stay listed, and the open one says where it is.
    await page.locator(row(A.remote)).waitFor();
    await page.locator(`${pane(A.remote)} .host-badge.down`).waitFor();
    await shot(page, 'hosts-unreachable');
    await openAgent(page, A.parent);
    await kid.locator('.host-badge.down').waitFor();
    await step('heal');
    // "Archive finished" takes the finished subagent on b too.
    await kid.locator('.host-badge:not(.down)').waitFor();
    await page.click(`${pane(A.parent)} .track button:has-text("Archive finished")`);
    await page.locator('.toast', { hasText: 'Archived 1 subagent' }).waitFor();
    await gone(page, `${pane(A.parent)} .track-row[data-agent-id="${A.kid}"]`);
  },
  // Schedules in an agent's pane: made from the header, listed with their next run, paused
  // and resumed, deleted after a confirm, on a second browser too.
  async schedules() {
    const one = await open();
    const two = await open();
    for (const p of [one, two]) { await ready(p); await openAgent(p, A.agent); }
    await one.click(`${pane(A.agent)} .more > summary`);
    await one.click(`${pane(A.agent)} button.schedule-new`);
    const dialog = one.locator('dialog');
    await dialog.waitFor({ state: 'visible' });
    await dialog.locator('textarea[name=prompt]').fill('say tick');
    await dialog.locator('input[name=title]').fill('hourly check');
    await dialog.locator('select[name=kind]').selectOption('every');
    await dialog.locator('input[name=minutes]').fill('60');
    await shot(one, 'schedule-new');
    await dialog.locator('button[type=submit]').click();
    await gone(one, 'dialog');
    const id = await step('created');
    for (const p of [one, two]) {
      const r = p.locator(scheduleRow(A.agent, id));
      await r.waitFor();
      const text = await r.innerText();
      if (!text.includes('hourly check') || !text.includes('every 1h') || !text.includes('next ')) fail(`the schedule row says: ${text}`);
    }
    await shot(one, 'schedules');
    await one.click(`${scheduleRow(A.agent, id)} button:has-text("Pause")`);
    await two.locator(`${scheduleRow(A.agent, id)}.state-paused`).waitFor();
    await step('paused');
    await two.click(`${scheduleRow(A.agent, id)} button:has-text("Resume")`);
    await one.locator(`${scheduleRow(A.agent, id)}.state-active`).waitFor();
    await one.click(`${scheduleRow(A.agent, id)} button.schedule-delete`);
    await dialog.waitFor({ state: 'visible' });
    await one.click('dialog button.danger');
    for (const p of [one, two]) await gone(p, scheduleRow(A.agent, id));
    // A one-off says its time as its next run is shown: in the browser's time zone and words,
    // not the daemon's UTC.
    await one.click(`${pane(A.agent)} .more > summary`);
    await one.click(`${pane(A.agent)} button.schedule-new`);
    await dialog.waitFor({ state: 'visible' });
    await dialog.locator('textarea[name=prompt]').fill('say later');
    await dialog.locator('input[name=title]').fill('one-off');
    await dialog.locator('select[name=kind]').selectOption('in');
    await dialog.locator('input[name=minutes]').fill('90');
    await dialog.locator('button[type=submit]').click();
    await gone(one, 'dialog');
    const once = one.locator(`${pane(A.agent)} .schedule-row`, { hasText: 'one-off' });
    await once.waitFor();
    const next = (await once.locator('.when').innerText()).replace(/^next /, '');
    const fires = await once.locator('.what .muted').innerText();
    if (!next || fires !== `once at ${next}`) fail(`the one-off's row says ${JSON.stringify(fires)}, next ${JSON.stringify(next)}`);
    await once.locator('button.schedule-delete').click();
    await dialog.waitFor({ state: 'visible' });
    await one.click('dialog button.danger');
    await gone(one, `${pane(A.agent)} .schedule-row`);
  },

  // The settings a live agent offers (ACP config options) are selects in its header: a change
  // in one browser reaches the agent and shows in the other.
  async settings() {
    const one = await open();
    const two = await open();
    for (const p of [one, two]) { await ready(p); await openAgent(p, A.agent); }
    const effort = (p) => p.locator(`${pane(A.agent)} select.setting[aria-label="Reasoning effort"]`);
    await effort(one).waitFor();
    if (await effort(one).inputValue() !== 'high') fail(`effort shows ${await effort(one).inputValue()}`);
    // The mode is one of the agent's options now: no second, older mode control.
    if (await one.locator(`${pane(A.agent)} select[aria-label="Mode"]`).count() !== 1) fail('two mode controls');
    // At 1,280 px the header is one row, however long the title and however many settings.
    const top = await one.locator(`${pane(A.agent)} .head-row`).first().evaluate((row) => {
      const tops = [...row.children].map((c) => Math.round(c.getBoundingClientRect().top + c.getBoundingClientRect().height / 2));
      return { spread: Math.max(...tops) - Math.min(...tops), height: row.getBoundingClientRect().height };
    });
    if (top.spread > 4 || top.height > 48) fail(`the header wraps: ${JSON.stringify(top)}`);
    await shot(one, 'agent-settings');
    // White on the filled buttons reads at WCAG AA (4.5:1) in the dark scheme too.
    await one.emulateMedia({ colorScheme: 'dark' });
    const ratios = await one.evaluate(() => {
      const rgb = (c) => c.match(/[\d.]+/g).slice(0, 3).map(Number);
      const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }; return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
      return [...document.querySelectorAll('button.primary, button.danger')].filter((b) => b.offsetParent).map((b) => {
        const s = getComputedStyle(b);
        const [x, y] = [lum(rgb(s.color)), lum(rgb(s.backgroundColor))];
        return { text: b.innerText, ratio: (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05) };
      });
    });
    const low = ratios.filter((r) => r.ratio < 4.5);
    if (!ratios.length || low.length) fail(`contrast in the dark scheme: ${JSON.stringify(ratios)}`);
    await shot(one, 'agent-settings-dark');
    await one.emulateMedia({ colorScheme: 'light' });
    await effort(one).selectOption('low');
    await two.waitForFunction((sel) => document.querySelector(sel)?.value === 'low',
      `${pane(A.agent)} select.setting[aria-label="Reasoning effort"]`);
  },

  // The agent's own subagents are in its track, read-only, counted in the track's head; one
  // that goes idle shows so without a reload.
  // A session_state of over a megabyte, sent in 64 KiB fragments: every row has its whole title.
  async bigState() {
    const page = await open();
    await ready(page);
    for (const a of A.agents) {
      await page.locator(row(a.id)).waitFor();
      const text = (await page.locator(row(a.id)).textContent()) ?? '';
      if (!text.includes(a.start) || !text.includes(a.end)) fail(`agent ${a.id}'s row holds ${text.length} characters, ending ${text.slice(-40)}`);
    }
  },
  async ownSubagents() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    const own = page.locator(`${pane(A.agent)} .track-row.own-subagent`);
    await own.first().waitFor();
    const text = await own.first().innerText();
    if (!text.includes('Reviewer') || !text.includes('running')) fail(`the track row says: ${text}`);
    if (await own.first().locator('button').count() !== 0) fail('an own subagent has buttons');
    const head = await page.locator(`${pane(A.agent)} .track .track-toggle`).innerText();
    if (!head.includes('1 subagent') || !head.includes('1 running')) fail(`the track head says: ${head}`);
    await shot(page, 'own-subagents');
    await step('done');
    await page.locator(`${pane(A.agent)} .track-row.own-subagent[data-state="idle"]`).waitFor();
  },

  // The filter and the quick filters find subagents (under their root); a parent's track
  // lists its archived subagents on request and brings one back; unarchiving a parent offers
  // to bring back the subagents its archive took.
  async filters() {
    const page = await open();
    await ready(page);
    const rows = async () => (await page.locator('#workspaces li.agent-row').evaluateAll((els) => els.map((e) => e.dataset.agentId))).sort();
    const expect = async (want, what) => {
      const sorted = [...want].sort();
      await page.waitForFunction((w) => JSON.stringify([...document.querySelectorAll('#workspaces li.agent-row')].map((e) => e.dataset.agentId).sort()) === w, JSON.stringify(sorted))
        .catch(async () => fail(`${what}: rows ${JSON.stringify(await rows())}, want ${JSON.stringify(sorted)}`));
    };
    await page.fill('#filter', 'worker');
    await expect([A.lead, A.worker], 'filter "worker"');
    if (!await page.locator(`#workspaces li.agent-row.sub[data-agent-id="${A.worker}"]`).count()) fail('the subagent is not under its root');
    await page.fill('#filter', '');
    await page.click('.quick .chip[data-quick="needs"]');
    // A permission waiting under lead, and a failed turn: both need the user.
    await expect([A.lead, A.worker, A.broken], 'needs me');
    await shot(page, 'quick-filter-needs');
    await page.click('.quick .chip[data-quick="errors"]');
    await expect([A.broken], 'errors');
    await page.click('.quick .chip[data-quick="errors"]');
    await expect([A.lead, A.quiet, A.broken, A.lead2], 'no filter');

    // The archived subagent, from its parent's track.
    await openAgent(page, A.lead);
    await page.click(`${pane(A.lead)} .track-archived`);
    const gone = page.locator(`${pane(A.lead)} .track-row.archived[data-agent-id="${A.archivedSub}"]`);
    await gone.waitFor();
    await shot(page, 'track-archived');
    await gone.locator('button:has-text("Unarchive")').click();
    await page.locator(`${pane(A.lead)} .track-row:not(.archived)[data-agent-id="${A.archivedSub}"]`).waitFor();

    // An archived parent, brought back with its subagent.
    await page.check('#show-archived');
    const archivedRow = page.locator(`#workspaces li.agent-row.archived[data-agent-id="${A.archivedLead}"]`);
    await archivedRow.waitFor();
    await archivedRow.locator('button:has-text("Unarchive")').click();
    await page.locator('.toast button:has-text("Bring back too")').click();
    await step('unarchived');
  },

  // A page without a (valid) token explains how to get one; with one in the fragment it logs
  // in and takes the token out of the address bar.
  async login() {
    const bare = await open({ token: null });
    await bare.locator('#login').waitFor({ state: 'visible' });
    const text = await bare.locator('#login').innerText();
    if (!text.includes('drover ui --print')) fail(`the login screen does not say how to get a token: ${text}`);
    await shot(bare, 'login');
    const wrong = await open({ token: 'not-the-token' });
    await wrong.locator('#login').waitFor({ state: 'visible' });
    const page = await open();
    await ready(page);
    const url = page.url();
    if (url.includes('token')) fail(`the token stayed in the address bar: ${url}`);
    const stored = await page.evaluate(() => localStorage.getItem('drover.token'));
    if (JSON.parse(stored) !== A.token) fail('the token was not kept in localStorage');
    // The token form logs a bare page in too.
    await bare.fill('#token-input', `${A.url}#token=${A.token}`);
    await bare.click('#token-form button[type=submit]');
    await ready(bare);
  },

  async rootTabClose() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.idle);
    await shot(page, 'agent-pane');
    await page.click(`${tab(A.idle)} .tab-close`);
    await gone(page, tab(A.idle));
    await gone(page, row(A.idle));
    // A running root asks first; Cancel leaves it alone.
    await openAgent(page, A.running);
    await page.click(`${tab(A.running)} .tab-close`);
    const dialog = page.locator('dialog.stop-archive');
    await dialog.waitFor({ state: 'visible' });
    if (!(await dialog.innerText()).includes('1 turn is running')) fail(`the dialog does not list the turn: ${await dialog.innerText()}`);
    await page.keyboard.press('Escape');
    await gone(page, 'dialog');
    await page.locator(tab(A.running)).waitFor();
    await step('still-unarchived');
    await page.click(`${tab(A.running)} .tab-close`);
    await dialog.waitFor({ state: 'visible' });
    await page.click('dialog.stop-archive button.danger');
    await gone(page, tab(A.running));
  },

  async subagentTabClose() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.parent);
    const head = page.locator(`${pane(A.parent)} .track-toggle`);
    await head.waitFor();
    if ((await head.innerText()).trim() !== '1 subagent') fail(`track header: ${await head.innerText()}`);
    await shot(page, 'track');
    await page.click(`${trackRow(A.parent, A.child)} button.open`);
    await page.locator(`${pane(A.child)} .timeline`).waitFor({ state: 'visible' });
    await page.click(`${tab(A.child)} .tab-close`);
    await gone(page, tab(A.child));
    await step('child-not-archived');
    // Still in the parent's track (the parent's tab is in front again); it reopens from there.
    await page.locator(trackRow(A.parent, A.child)).waitFor();
    await page.click(`${trackRow(A.parent, A.child)} button.open`);
    await page.locator(tab(A.child)).waitFor();
    const layout = await page.evaluate(() => JSON.parse(localStorage.getItem('drover.layout')));
    if (!layout.tabs.includes(A.child)) fail(`the layout does not hold the reopened tab: ${JSON.stringify(layout)}`);
  },

  async trackArchive() {
    const one = await open();
    const two = await open();
    for (const p of [one, two]) { await ready(p); await openAgent(p, A.parent); await p.locator(trackRow(A.parent, A.child)).waitFor(); }
    await one.click(`${trackRow(A.parent, A.child)} button.archive-x`);
    const dialog = one.locator('dialog');
    await dialog.waitFor({ state: 'visible' });
    await shot(one, 'track-archive-confirm');
    await one.click('dialog button.danger');
    await gone(one, trackRow(A.parent, A.child));
    await gone(two, trackRow(A.parent, A.child));
  },

  async detach() {
    const one = await open();
    const two = await open();
    for (const p of [one, two]) { await ready(p); await openAgent(p, A.parent); await p.locator(trackRow(A.parent, A.child)).waitFor(); }
    if (await one.locator(row(A.child)).count()) fail('a subagent is listed as a root before detach');
    await one.click(`${trackRow(A.parent, A.child)} button:has-text("Detach")`);
    for (const p of [one, two]) {
      await gone(p, trackRow(A.parent, A.child));
      await p.locator(row(A.child)).waitFor();
    }
  },

  async stopAndArchive() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.parent);
    await page.locator(`${pane(A.parent)} .track-toggle:has-text("1 running")`).waitFor();
    await page.click(`${tab(A.parent)} .tab-close`);
    const dialog = page.locator('dialog.stop-archive');
    await dialog.waitFor({ state: 'visible' });
    const text = await dialog.innerText();
    for (const want of ['1 turn is running', '1 subagent is running', 'sub-worker']) {
      if (!text.includes(want)) fail(`the stop-and-archive dialog lacks "${want}": ${text}`);
    }
    await shot(page, 'stop-and-archive');
    // Focus stays in the dialog: Tab cycles among its buttons.
    for (let i = 0; i < 3; i++) {
      await page.keyboard.press('Tab');
      const inside = await page.evaluate(() => Boolean(document.activeElement?.closest('dialog')));
      if (!inside) fail('focus left the dialog');
    }
    await page.click('dialog.stop-archive button.danger');
    await gone(page, tab(A.parent));
  },

  async cascade() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.parent);
    await page.locator(`${pane(A.parent)} .track-toggle:has-text("2 subagents")`).waitFor();
    await page.click(`${trackRow(A.parent, A.child)} button.open`);
    await page.locator(tab(A.child)).waitFor();
    await page.click(tab(A.parent) + ' .tab-open');
    await step('archive-parent');
    await gone(page, tab(A.parent));
    await gone(page, tab(A.child));
    await gone(page, '.track-row');
    await gone(page, row(A.parent));
    await shot(page, 'after-cascade');
  },

  async permission() {
    const one = await open();
    const two = await open();
    for (const p of [one, two]) {
      await ready(p);
      await openAgent(p, A.agent);
      await p.locator(`${pane(A.agent)} .permission.pending button`).first().waitFor();
    }
    await shot(one, 'permission');
    await one.click(`${pane(A.agent)} .permission.pending button:has-text("Allow once")`);
    for (const p of [one, two]) {
      await p.locator(`${pane(A.agent)} .permission.answered`).waitFor();
      await p.locator(`${pane(A.agent)} .kind-agent_message:has-text("permission granted")`).waitFor();
      if (await p.locator(`${pane(A.agent)} .permission.pending`).count()) fail('a card still waits');
    }
  },

  async followupAndSteer() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    const input = page.locator(`${pane(A.agent)} textarea`);
    await input.fill('say followed up');
    await input.press('Enter');
    await page.locator(`${pane(A.agent)} .queued-item:has-text("say followed up")`).waitFor();
    await shot(page, 'queued');
    await step('followup-queued');
    await page.check(`${pane(A.agent)} input[value=steer]`);
    await input.fill('say steered');
    await input.press('Enter');
    await page.locator(`${pane(A.agent)} .turn-end.turn_canceled`).waitFor();
    await page.locator(`${pane(A.agent)} .kind-agent_message:has-text("steered")`).waitFor();
    await page.locator(`${pane(A.agent)} .kind-agent_message:has-text("followed up")`).waitFor();
    await gone(page, `${pane(A.agent)} .queued-item`);
    await shot(page, 'after-steer');
  },

  async reconnect() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    const input = page.locator(`${pane(A.agent)} textarea`);
    await input.fill('typed while the daemon restarts');
    await step('stop-daemon');
    await page.locator('#connection.offline').waitFor({ state: 'visible' });
    await shot(page, 'offline');
    await step('start-daemon');
    await page.waitForFunction(() => document.querySelector('#connection').hidden, null, { timeout: 30000 });
    if ((await input.inputValue()) !== 'typed while the daemon restarts') fail('the draft was lost across the reconnect');
    // The pane is live again: a message sent now is answered.
    await input.fill('say back again');
    await input.press('Enter');
    await page.locator(`${pane(A.agent)} .kind-agent_message:has-text("back again")`).waitFor();
  },

  async phone() {
    const page = await open({ viewport: { width: 390, height: 844 }, mobile: true });
    await page.locator('#app').waitFor({ state: 'visible' });
    const box = await page.locator('#sidebar').boundingBox();
    if (box && box.x + box.width > 1) fail(`the sidebar is on screen at 390 px: ${JSON.stringify(box)}`);
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    if (width > 390) fail(`the page scrolls sideways at 390 px (${width} px wide)`);
    // The first screen lists what needs the user, a finger's height each.
    const need = page.locator(`.landing li[data-agent-id="${A.agent}"] button`);
    await need.waitFor();
    const text = await need.innerText();
    if (!text.includes('asks for a permission')) fail(`the landing says: ${text}`);
    const needBox = await need.boundingBox();
    if (!needBox || needBox.height < 44) fail(`the landing's row is ${JSON.stringify(needBox)}`);
    await shot(page, 'phone-landing');
    await page.tap('#drawer-toggle');
    await page.waitForFunction(() => document.querySelectorAll('#workspaces li.agent-row').length > 0);
    await page.waitForTimeout(250); // the drawer's slide-in transition, for the screenshot
    await shot(page, 'phone-drawer');
    await fingerSized(page, 'the drawer');
    await page.tap(row(A.agent));
    await page.locator(`${pane(A.agent)} .permission.pending button`).first().waitFor();
    // Opening an agent closes the drawer (once its slide-out transition ends).
    await page.waitForFunction(() => document.querySelector('#sidebar').getBoundingClientRect().right <= 1);
    await shot(page, 'phone-permission');
    await fingerSized(page, 'the permission');
    await page.tap(`${pane(A.agent)} .permission.pending button:has-text("Allow once")`);
    await page.locator(`${pane(A.agent)} .permission.answered`).waitFor();
  },

  async changes() {
    const page = await open();
    await ready(page);
    await page.click(`#workspaces li.workspace[data-workspace-id="${A.workspace}"] button[title=Changes]`);
    const dialog = page.locator('dialog');
    await dialog.locator('.files li').first().waitFor();
    const text = await dialog.innerText();
    for (const want of ['README.md', 'notes.txt', 'untracked']) if (!text.includes(want)) fail(`the changes view lacks ${want}: ${text}`);
    await dialog.locator('.files summary').first().click();
    await shot(page, 'changes');
    await page.keyboard.press('Escape');
    await gone(page, 'dialog');
  },

  async attention() {
    const page = await open();
    await ready(page);
    await page.waitForFunction(() => document.title === '(2) drover');
    await openAgent(page, A.seen);
    await page.waitForFunction(() => document.title === '(1) drover');
    await step('opened');
  },

  async paging() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    const older = page.locator(`${pane(A.agent)} button.older`);
    await older.waitFor({ state: 'visible' });
    if (await page.locator(`${pane(A.agent)} .kind-user_message`).count()) fail('the first page already holds the prompt');
    // Scrolling to the top pages the rest in.
    await page.locator(`${pane(A.agent)} .timeline`).evaluate((el) => { el.scrollTop = 0; });
    await page.locator(`${pane(A.agent)} .kind-user_message`).waitFor();
    await older.waitFor({ state: 'hidden' });
    const count = await page.locator(`${pane(A.agent)} .item`).count();
    if (count !== A.items) fail(`${count} items shown, ${A.items} stored`);
  },

  async timelineKinds() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    const p = pane(A.agent);
    await page.locator(`${p} .kind-plan li`).nth(1).waitFor();
    // The agent's text is text: no element, no handler, no script link came out of it.
    const hostile = await page.evaluate((sel) => ({
      img: document.querySelectorAll(`${sel} .timeline img`).length,
      js: document.querySelectorAll(`${sel} .timeline a[href^="javascript"]`).length,
      pwned: window.pwned ?? null,
      text: document.querySelector(`${sel} .kind-agent_message`)?.textContent ?? '',
    }), p);
    if (hostile.img || hostile.js || hostile.pwned !== null) fail(`the agent's text became markup: ${JSON.stringify(hostile)}`);
    if (!hostile.text.includes('<img src=x onerror=')) fail(`the text was not shown as text: ${hostile.text}`);
    await page.locator(`${p} .kind-agent_message strong:has-text("bold")`).waitFor();
    await page.locator(`${p} .kind-agent_message code:has-text("code")`).waitFor();
    const good = page.locator(`${p} .kind-agent_message a[href="https://example.com/"]`);
    if ((await good.getAttribute('rel')) !== 'noopener noreferrer') fail('a link opens with a referrer');
    // Thoughts and tool calls start collapsed and expand on a click.
    const thought = page.locator(`${p} .kind-agent_thought details`);
    if (await thought.getAttribute('open') !== null) fail('the thought is expanded');
    const tool = page.locator(`${p} .kind-tool_call details`);
    if (await tool.getAttribute('open') !== null) fail('the tool call is expanded');
    await tool.locator('summary').click();
    await tool.locator('.tool-body').waitFor({ state: 'visible' });
    await page.locator(`${p} .kind-tool_call .tool-status.status-completed`).waitFor();
    if ((await page.locator(`${p} .kind-plan input[type=checkbox]`).count()) !== 2) fail('the plan is not a checklist of two');
    await shot(page, 'timeline-kinds');
  },

  // A command run from the pane is a job: its row shows it running, its output follows by
  // offset to the end, and a job another client started shows up and is killed from here.
  async jobs() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    await page.click(`${pane(A.agent)} .more > summary`);
    await page.click(`${pane(A.agent)} button.run-job`);
    const dialog = page.locator('dialog.start-job');
    await dialog.waitFor({ state: 'visible' });
    await dialog.locator('input[name=command]').fill(A.command);
    await shot(page, 'start-job');
    await dialog.locator('button[type=submit]').click();
    await gone(page, 'dialog');
    const first = `${pane(A.agent)} .job-row[data-job-id]`;
    await page.locator(first).first().waitFor();
    await page.locator(`${first} button.open`).first().click();
    const output = page.locator('dialog pre.job-output');
    await output.waitFor({ state: 'visible' });
    await page.locator('dialog pre.job-output[data-eof=true]').waitFor({ timeout: 30000 });
    const text = await output.innerText();
    const want = A.lines.map((l) => `${l}\n`).join('');
    if (text !== want && text !== want.trimEnd()) fail(`the output was not every line once: ${JSON.stringify(text)}`);
    await page.locator('dialog .job-state:has-text("exit 0")').waitFor();
    if (await page.locator('dialog button:has-text("Kill")').isVisible()) fail('an ended job can still be killed');
    await shot(page, 'job-output');
    await page.click('dialog button:has-text("Close")');
    await gone(page, 'dialog');
    // The Rust side starts another job over the protocol and answers with its id.
    const otherId = (await step('started-elsewhere')).trim();
    const other = `${pane(A.agent)} .job-row[data-job-id="${otherId}"]`;
    await page.locator(`${other}[data-status=running]`).waitFor();
    await page.click(`${other} button:has-text("Kill")`);
    await page.locator(`${other}[data-status=killed] .status-text:has-text("killed (request)")`).waitFor();
    await shot(page, 'jobs');
  },

  // The demo provider as a new user meets it: picked by its label in the new-agent dialog,
  // `tour` streams, asks a permission (one click), and makes a subagent and a job.
  async demo() {
    const page = await open();
    await ready(page);
    await page.click('#new-agent');
    const dialog = page.locator('dialog');
    await dialog.waitFor({ state: 'visible' });
    const label = (await dialog.locator('select[name=provider] option[value=demo]').innerText()).trim();
    if (label !== 'demo — scripted, no model') fail(`the demo is offered as ${JSON.stringify(label)}`);
    await dialog.locator('select[name=provider]').selectOption('demo');
    await dialog.locator('input[name=title]').fill('the demo');
    await dialog.locator('textarea[name=prompt]').fill('tour');
    await dialog.locator('button[type=submit]').click();
    await gone(page, 'dialog');
    const p = '.agent-pane:not([hidden])';
    await page.locator(`${p} .kind-agent_message:has-text("a few words at a time")`).waitFor();
    await page.locator(`${p} .permission.pending button:has-text("Allow once")`).waitFor();
    await shot(page, 'demo-permission');
    await page.click(`${p} .permission.pending button:has-text("Allow once")`);
    await page.locator(`${p} .kind-agent_message:has-text("That was the tour")`).waitFor();
    await page.locator(`${p} .track-row[data-agent-id]`).first().waitFor();
    await page.locator(`${p} .job-row[data-job-id]`).first().waitFor();
    await shot(page, 'demo');
    // The replies streamed in a few words at a time read exactly as they do whole, after a
    // reload (bold, code, lists, paragraphs).
    await page.locator(`${p} .kind-agent_message:has-text("drover tells me when each is done.")`).waitFor();
    const replies = () => page.evaluate((sel) => Object.fromEntries([...document.querySelectorAll(`${sel} .kind-agent_message`)]
      .map((e) => [/** @type {HTMLElement} */ (e).dataset.seq, e.innerHTML])), p);
    const streamed = await replies();
    if (Object.keys(streamed).length < 2) fail(`the tour streamed ${JSON.stringify(streamed)}`);
    await page.reload();
    await ready(page);
    await page.locator(`${p} .kind-agent_message:has-text("drover tells me when each is done.")`).waitFor();
    const whole = await replies();
    for (const [seq, html] of Object.entries(streamed)) {
      if (whole[seq] !== html) fail(`reply ${seq} streamed as ${html}\nbut reads whole as ${whole[seq]}`);
    }
  },

  // A reply rendered as it streams, in pieces of any size, is the reply rendered whole: random
  // Markdown (paragraphs, long runs of plain lines, fences, lists, quotes, spans across lines,
  // long fences whose lines look like Markdown, long lists and quotes) cut at random places, in the page's
  // own renderer.
  async markdown() {
    const page = await open();
    await ready(page);
    const r = await page.evaluate(async () => {
      const { renderMarkdown, MarkdownStream } = await import('/ui/markdown.js');
      const pieces = ['a `code` bit', 'a **bold\nacross** lines', '', '```js', '```', '~~~', '- item', '1. one', '2) two',
        '> quote', '# head', '---', 'see https://example.com/z.', '_em_ here', '[a link](https://example.com)', '* star',
        '- [x] task', 'opens `a tick', 'closes it`', '\r', ' '];
      // Lines of code that would be Markdown outside the fence.
      const code = ['# x', '- y', '`z`', '***', '', '  ', '> q', '1. n', '``', '~~', 'a **b', '[l](https://example.com)', '\r', '   ```'];
      const items = ['- item', '* star', '+ plus', '- [x] done', '- [ ] todo', '- a `code` bit', '- **bold**', '- - -'];
      let seed = 7;
      // The high bits: the low ones of this generator repeat every few draws.
      const rnd = (/** @type {number} */ n) => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return (seed >>> 12) % n; };
      /** A code fence of 100 to 400 lines; `~~~` and four-backtick fences hold lines of three backticks. */
      const fence = (/** @type {boolean} */ closed) => {
        const open = ['```', '```rust', '``` js', '~~~', '~~~diff', '````md'][rnd(6)];
        const marker = /** @type {RegExpExecArray} */ (/^[`~]+/.exec(open))[0];
        const body = [];
        for (let i = 0, n = 100 + rnd(301); i < n; i++) {
          const odd = rnd(4) === 0;
          body.push(odd && marker !== '```' && rnd(8) === 0 ? '```' : odd ? code[rnd(code.length)] : `  let line_${i} = ${i};`);
        }
        return [open, ...body, ...(closed ? [rnd(2) ? marker : `  ${marker}  `] : [])];
      };
      /** A list of 100 to 300 items, now and then broken by an item of the other kind or a line that is not one. */
      const list = () => Array.from({ length: 100 + rnd(201) }, (_, i) => (rnd(100) === 0 ? ['1. one', '2) two', 'plain', '', '# head'][rnd(5)] : rnd(3) ? `- item ${i}` : items[rnd(items.length)]));
      /** A quote of 100 to 300 lines, Markdown of their own: runs of plain lines, fences, lists, quotes in it. */
      const quote = () => Array.from({ length: 100 + rnd(201) }, (_, i) => (rnd(40) === 0 ? ['', 'plain', '# head'][rnd(3)]
        : `${['> ', '>', ' > ', '> > '][rnd(8) ? 0 : rnd(4)]}${rnd(3) ? `plain line ${i}` : pieces[rnd(pieces.length)]}`));
      const bad = [];
      /** @type {Record<string, number>} */
      /** By the kind of block a render settled inside; `quoted`: inside a block inside a quote. */
      const cuts = { para: 0, fence: 0, list: 0, quote: 0, quoted: 0 };
      for (let t = 0; t < 600; t++) {
        // Half the texts are mostly long runs of plain lines, which settle in the middle of a paragraph.
        let lines = [];
        for (let i = 0, n = rnd(3) === 0 ? 300 : 1 + rnd(40); i < n; i++) {
          const plain = t % 2 ? rnd(2) === 0 : rnd(60) !== 0;
          lines.push(plain ? `plain line ${i}` : pieces[rnd(pieces.length)]);
        }
        // A third have a long fence somewhere, closed or (at the end) not; a third a long list; a
        // quarter a long quote.
        if (rnd(3) === 0) {
          const at = rnd(lines.length + 1);
          const closed = at < lines.length || rnd(2) === 0;
          lines = [...lines.slice(0, at), ...fence(closed), ...lines.slice(at)];
        }
        if (rnd(3) === 0) {
          const at = rnd(lines.length + 1);
          lines = [...lines.slice(0, at), ...list(), ...lines.slice(at)];
        }
        if (rnd(4) === 0) {
          const at = rnd(lines.length + 1);
          lines = [...lines.slice(0, at), ...quote(), ...lines.slice(at)];
        }
        const text = lines.join('\n') + (rnd(2) ? '\n' : '');
        const whole = document.createElement('div');
        whole.append(renderMarkdown(text));
        const box = document.createElement('div');
        const stream = new MarkdownStream(box);
        for (let i = 0; i < text.length;) {
          const k = 1 + rnd(rnd(5) === 0 ? 400 : 12);
          stream.push(text.slice(i, i + k));
          i += k;
          if (rnd(3) === 0) {
            stream.render();
            if (stream.open) cuts[stream.open.kind] += 1;
            if (stream.open?.kind === 'quote' && stream.open.inner.open) cuts.quoted += 1;
          }
        }
        stream.render();
        if (box.innerHTML !== whole.innerHTML) bad.push({ text, streamed: box.innerHTML, whole: whole.innerHTML });
      }
      // What a long code block costs as it streams: 3,000 lines, 5 a frame.
      const long = Array.from({ length: 3000 }, (_, i) => `    let x${i} = f(${i}); // - ${i} *`);
      const fenced = document.createElement('div');
      fenced.append(renderMarkdown(`\`\`\`rust\n${long.join('\n')}\n`));
      // Rendered alone, then in the page and laid out after each frame as the browser would.
      const fenceMs = [false, true].map((laidOut) => {
        const streamed = document.createElement('div');
        if (laidOut) document.body.append(streamed);
        const stream = new MarkdownStream(streamed);
        const at = performance.now();
        stream.push('```rust\n');
        for (let i = 0; i < long.length; i += 5) {
          stream.push(long.slice(i, i + 5).map((l) => `${l}\n`).join(''));
          stream.render();
          if (laidOut) void streamed.offsetHeight;
        }
        const ms = Math.round(performance.now() - at);
        streamed.remove();
        if (streamed.innerHTML !== fenced.innerHTML) bad.push({ text: 'the 3,000-line fence', streamed: streamed.innerHTML.slice(-300), whole: fenced.innerHTML.slice(-300) });
        return ms;
      });
      return { bad: bad.slice(0, 2), failed: bad.length, cuts, fenceMs };
    });
    process.stdout.write(`a 3,000-line fence streamed 5 lines a frame: ${r.fenceMs[0]} ms to render, ${r.fenceMs[1]} ms laid out in the page\n`);
    if (r.failed) fail(`${r.failed} of 600 texts render differently streamed: ${JSON.stringify(r.bad)}`);
    // The long plain runs, fences, lists and quotes were settled in their middle, not only at blank
    // lines and closing fences.
    for (const [kind, n] of Object.entries(r.cuts)) if (n < 50) fail(`only ${n} renders settled inside a ${kind}: ${JSON.stringify(r.cuts)}`);
  },

  async newAgent() {
    const page = await open();
    await ready(page);
    await page.click('#new-agent');
    const dialog = page.locator('dialog');
    await dialog.waitFor({ state: 'visible' });
    await dialog.locator('select[name=provider]').selectOption('scripted');
    await dialog.locator('input[name=title]').fill('from the browser');
    await dialog.locator('textarea[name=prompt]').fill('say **made** in the browser');
    await dialog.locator('details.budget-fields > summary').click();
    await dialog.locator('input[name=budgetTokens]').fill('5000');
    await dialog.locator('input[name=budgetHard]').check();
    await shot(page, 'new-agent');
    // Ctrl+Enter in the prompt creates it, as the keyboard user expects from a message box.
    await dialog.locator('textarea[name=prompt]').press('Control+Enter');
    await gone(page, 'dialog');
    await page.locator('.agent-pane:not([hidden]) .kind-agent_message strong:has-text("made")').waitFor();
    // Its budget shows in its header (its agent reports no spend: nothing counted yet).
    const budget = await page.locator('.agent-pane:not([hidden]) .spend .budget').innerText();
    if (budget !== 'tree 0/5000 tok (0 %, hard)') fail(`the header's budget says ${budget}`);
    // Rename from the header.
    await page.click('.agent-pane:not([hidden]) .title-edit');
    await page.fill('.agent-pane:not([hidden]) .title-input', 'renamed in the browser');
    await page.keyboard.press('Enter');
    await page.locator('#workspaces .agent-row .title:has-text("renamed in the browser")').waitFor();
    await shot(page, 'sidebar');
  },

  // The top New agent button puts the agent in the project's checkout, not in a worktree that
  // happens to come first, even with a worktree agent in front; a worktree's own + picks it.
  async newAgentWhere() {
    const page = await open();
    await ready(page);
    const picked = async (open) => {
      await open();
      const dialog = page.locator('dialog[open]');
      await dialog.waitFor();
      const value = await dialog.locator('select[name=workspace]').inputValue();
      const options = await dialog.locator('select[name=workspace] option').allInnerTexts();
      await dialog.locator('button:has-text("Cancel")').click();
      await gone(page, 'dialog[open]');
      return { value, options };
    };
    const first = await picked(() => page.click('#new-agent'));
    if (first.value !== A.checkout) fail(`with no agent open, the dialog offers ${first.value} first (${first.options.join(' | ')}), not the checkout ${A.checkout}`);
    if (!first.options[0].startsWith('repo ')) fail(`the workspaces are not listed as the sidebar lists them: ${first.options.join(' | ')}`);
    await openAgent(page, A.worktreeAgent);
    const front = await picked(() => page.click('#new-agent'));
    if (front.value !== A.checkout) fail(`with a worktree agent in front, the dialog offers ${front.value}, not the checkout ${A.checkout}`);
    const own = await picked(() => page.click(`#workspaces button[aria-label="New agent in wt-first"]`));
    if (own.value !== A.worktree) fail(`the worktree's own + offers ${own.value}, not ${A.worktree}`);
  },

  // A turn that has sent nothing for 30 s says so in its pane, and the note goes when the turn
  // ends; a turn waiting for your permission answer is not the agent being quiet. The browser's
  // clock is 10 min ahead of the daemon's here: the silence is counted on the page's clock from
  // when it received the last item, so the note does not come at once. Its counter moves each
  // second, but what a screen reader is told (the live region) is said once.
  async quiet() {
    const page = await open({ init: () => { const real = Date.now; Date.now = () => real() + 600000; } });
    await ready(page);
    await openAgent(page, A.asker);
    await openAgent(page, A.sleeper);
    const opened = Date.now();
    const note = page.locator(`${pane(A.sleeper)} .quiet-note:not([hidden])`);
    await page.waitForTimeout(3000);
    if (await note.count()) fail(`a turn the page heard from 3 s ago is called quiet: ${JSON.stringify(await note.innerText())}`);
    await note.waitFor({ timeout: 45000 });
    if (Date.now() - opened < 28000) fail(`the quiet note came ${Date.now() - opened} ms after the pane opened`);
    const text = await note.innerText();
    if (!/^Nothing from the agent for 3\d s: its turn still runs\./.test(text)) fail(`the quiet note says ${JSON.stringify(text)}`);
    const said = page.locator(`${pane(A.sleeper)} .quiet-said[role="status"]`);
    const told = await said.textContent();
    if (!/^Nothing from the agent for 30 s or more: its turn still runs\./.test(told ?? '')) fail(`the live region says ${JSON.stringify(told)}`);
    await page.waitForTimeout(2100);
    if (await note.innerText() === text) fail(`the counter did not move: ${JSON.stringify(text)}`);
    if (await said.textContent() !== told) fail(`the live region changed with the counter: ${JSON.stringify(await said.textContent())}`);
    await shot(page, 'quiet');
    if (await page.locator(`${pane(A.asker)} .quiet-note:not([hidden])`).count()) fail('a turn waiting for a permission answer was called quiet');
    await page.click(`${pane(A.sleeper)} button:has-text("Stop")`);
    await gone(page, `${pane(A.sleeper)} .quiet-note:not([hidden])`);
    if (await said.textContent() !== '') fail(`the live region still says ${JSON.stringify(await said.textContent())} after the turn ended`);
  },

  // An agent waiting for a sign-in: the sidebar says so; its pane shows one way per method
  // and its kept prompt as not delivered. A wrong key is refused in the card's own words; the
  // right one signs in, the field clears, the card goes on both browsers and the prompt runs.
  async signIn() {
    const page = await open();
    const phone = await open({ viewport: { width: 390, height: 844 }, mobile: true });
    await ready(page);
    const badge = `#workspaces li.agent-row[data-agent-id="${A.agent}"] .reason-auth_required`;
    const said = (await page.locator(badge).innerText()).trim();
    if (said !== 'sign-in needed') fail(`the sidebar row says ${said}`);
    await openAgent(page, A.agent);
    const card = page.locator(`${pane(A.agent)} .start-card.sign-in`);
    await card.waitFor();
    const text = await card.innerText();
    for (const want of [`Sign in to ${A.label}`, `drover login ${A.provider} --method scripted-terminal`, 'Sign in with', 'SCRIPTED_KEY']) {
      if (!text.includes(want)) fail(`the sign-in card lacks “${want}”: ${text}`);
    }
    const queued = page.locator(`${pane(A.agent)} .queued-item:has-text("say first")`);
    if (!(await queued.innerText()).includes('not delivered')) fail(`the kept prompt is not shown as not delivered: ${await queued.innerText()}`);
    await shot(page, 'sign-in');

    await phone.locator('#app').waitFor({ state: 'visible' });
    await phone.tap('#drawer-toggle');
    await phone.tap(row(A.agent));
    await phone.locator(`${pane(A.agent)} .start-card.sign-in`).waitFor();
    await phone.waitForFunction(() => document.querySelector('#sidebar').getBoundingClientRect().right <= 1);
    const width = await phone.evaluate(() => document.documentElement.scrollWidth);
    if (width > 390) fail(`the sign-in card scrolls sideways at 390 px (${width} px wide)`);
    await shot(phone, 'phone-sign-in');
    await step('opened');

    const key = card.locator('input[name=SCRIPTED_KEY]');
    if ((await key.getAttribute('type')) !== 'password') fail('the key is typed in the clear');
    await key.fill('not-the-key');
    await card.locator('form button[type=submit]').click();
    await page.locator(`${pane(A.agent)} .start-card .start-words:has-text("signing in with")`).waitFor();
    await shot(page, 'sign-in-refused');
    await card.locator('input[name=SCRIPTED_KEY]').fill(A.key);
    await card.locator('form button[type=submit]').click();
    const cleared = await page.evaluate(() => [...document.querySelectorAll('.agent-pane input[type=password]')].every((i) => !i.value));
    if (!cleared) fail('the key stayed in its field once sent');
    for (const p of [page, phone]) {
      await gone(p, `${pane(A.agent)} .start-card`);
      await p.locator(`${pane(A.agent)} .kind-agent_message:has-text("first")`).waitFor();
    }
    await gone(page, `${pane(A.agent)} .queued-item`);
    await gone(page, badge);
    await shot(page, 'signed-in');
    for (const p of [page, phone]) {
      const shown = await p.locator('body').innerText();
      const kept = await p.evaluate(() => JSON.stringify(localStorage));
      if (shown.includes(A.key) || kept.includes(A.key)) fail('the key is shown or kept by the page');
    }
  },

  // A method the agent signs in with by itself is one click.
  async signInByAgent() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    await page.click(`${pane(A.agent)} .start-card .method-agent button`);
    await gone(page, `${pane(A.agent)} .start-card`);
    await page.locator(`${pane(A.agent)} .kind-agent_message:has-text("by the agent")`).waitFor();
  },

  // A start that failed: the card says so in the agent's words and when it tries again, the
  // kept prompt is not delivered; Retry, once the cause is fixed, starts it and the prompt runs.
  async failedStart() {
    const page = await open();
    const phone = await open({ viewport: { width: 390, height: 844 }, mobile: true });
    await ready(page);
    await openAgent(page, A.agent);
    const card = page.locator(`${pane(A.agent)} .start-card.failed`);
    await card.waitFor();
    const text = await card.innerText();
    if (!text.includes('Could not start') || !text.includes('cannot start') || !/tries again by itself in \d+ s/.test(text)) {
      fail(`the card does not say what failed and when it tries again: ${text}`);
    }
    const queued = page.locator(`${pane(A.agent)} .queued-item:has-text("say hello")`);
    if (!(await queued.innerText()).includes('not delivered')) fail(`the kept prompt is not shown as not delivered: ${await queued.innerText()}`);
    await shot(page, 'could-not-start');
    await phone.locator('#app').waitFor({ state: 'visible' });
    await phone.tap('#drawer-toggle');
    await phone.tap(row(A.agent));
    await phone.locator(`${pane(A.agent)} .start-card.failed`).waitFor();
    await phone.waitForFunction(() => document.querySelector('#sidebar').getBoundingClientRect().right <= 1);
    const width = await phone.evaluate(() => document.documentElement.scrollWidth);
    if (width > 390) fail(`the card scrolls sideways at 390 px (${width} px wide)`);
    await shot(phone, 'phone-could-not-start');
    await step('fix');
    await card.locator('button.start-retry').click();
    for (const p of [page, phone]) {
      await gone(p, `${pane(A.agent)} .start-card`);
      await p.locator(`${pane(A.agent)} .kind-agent_message:has-text("hello")`).waitFor();
    }
    await gone(page, `${pane(A.agent)} .queued-item`);
  },

  // The page that made an agent with a first prompt shows `running` while the turn streams,
  // as another page does: the create answer (read earlier) never overwrites a newer event.
  async statusWhileStreaming() {
    const one = await open();
    const two = await open();
    for (const p of [one, two]) await ready(p);
    await one.click('#new-agent');
    const dialog = one.locator('dialog');
    await dialog.waitFor({ state: 'visible' });
    await dialog.locator('select[name=provider]').selectOption('scripted');
    await dialog.locator('input[name=title]').fill('streamer');
    await dialog.locator('textarea[name=prompt]').fill(`stream ${A.chunks} ${A.delayMs}`);
    await dialog.locator('button[type=submit]').click();
    await gone(one, 'dialog');
    const id = await one.evaluate(() => JSON.parse(localStorage.getItem('drover.layout')).active);
    await openAgent(two, id);
    for (const p of [one, two]) {
      await p.locator(`${pane(id)} .kind-agent_message:has-text("chunk 3")`).waitFor();
      await p.locator(`${pane(id)} .head-row .status-text.status-running`).waitFor();
      await p.locator(`${tab(id)} .dot.status-running`).waitFor();
      await p.locator(`#workspaces li.agent-row[data-agent-id="${id}"] .dot.status-running`).waitFor();
      const text = await p.locator(`${pane(id)} .kind-agent_message`).last().innerText();
      if (text.includes(`chunk ${A.chunks}`)) fail('the turn ended before the page showed it running');
    }
    await shot(one, 'status-while-streaming');
    for (const p of [one, two]) {
      await p.locator(`${pane(id)} .kind-agent_message:has-text("chunk ${A.chunks}")`).waitFor({ timeout: 60000 });
      await p.locator(`${pane(id)} .head-row .status-text.status-idle`).waitFor();
    }
  },

  // Collapsing the subagents track or the jobs list leaves their heads, and never "null".
  async collapse() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.parent);
    const p = pane(A.parent);
    await page.locator(`${p} .track-row`).first().waitFor();
    await page.locator(`${p} .job-row`).first().waitFor();
    await page.click(`${p} .track .track-toggle`);
    await page.click(`${p} .jobs .track-toggle`);
    await gone(page, `${p} .track-row`);
    await gone(page, `${p} .job-row`);
    const text = await page.locator(`${p} .bottom`).innerText();
    if (/\bnull\b/.test(text)) fail(`a collapsed panel says null: ${JSON.stringify(text)}`);
    if ((await page.locator(`${p} .track .track-toggle`).getAttribute('aria-expanded')) !== 'false') fail('the track toggle does not say it is collapsed');
    await shot(page, 'collapsed-panels');
    // Expanding brings the rows back.
    await page.click(`${p} .track .track-toggle`);
    await page.locator(`${p} .track-row`).first().waitFor();
  },

  // Stop drops the queue: the composer's queued list follows the daemon's inbox (after a
  // reload too), and the dropped text is offered back to the message box.
  async stopDropsQueued() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    const p = pane(A.agent);
    const input = page.locator(`${p} textarea`);
    await input.fill('say never ran');
    await input.press('Enter');
    await page.locator(`${p} .queued-item:has-text("say never ran")`).waitFor();
    await step('queued');
    await page.click(`${p} button.stop`);
    await gone(page, `${p} .queued-item`);
    const note = page.locator(`${p} .dropped-note`);
    await note.waitFor({ state: 'visible' });
    if (!(await note.innerText()).includes('say never ran')) fail(`the dropped note lacks the text: ${await note.innerText()}`);
    await shot(page, 'dropped-after-stop');
    await page.reload();
    await ready(page);
    await page.locator(`${p} .timeline`).waitFor({ state: 'visible' });
    await page.locator(`${p} .dropped-note`).waitFor({ state: 'visible' });
    await page.waitForTimeout(1500);
    if (await page.locator(`${p} .queued-item`).count()) fail('a dropped message shows as queued after a reload');
    await page.click(`${p} .dropped-note button:has-text("Put back")`);
    if ((await page.locator(`${p} textarea`).inputValue()) !== 'say never ran') fail('the dropped text did not come back to the box');
    await page.locator(`${p} .dropped-note`).waitFor({ state: 'hidden' });
  },

  // A root's tab archives and looks it; a subagent's only closes the view. An archive from a
  // tab or the track is undone from its toast.
  async archiveUndo() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.parent);
    await page.click(`${trackRow(A.parent, A.child)} button.open`);
    await page.locator(tab(A.child)).waitFor();
    const root = page.locator(`${tab(A.parent)} .tab-close`);
    const sub = page.locator(`${tab(A.child)} .tab-close`);
    const [rootLabel, subLabel] = [await root.getAttribute('aria-label'), await sub.getAttribute('aria-label')];
    if (!rootLabel.startsWith('Archive ')) fail(`the root tab's button says ${rootLabel}`);
    if (!subLabel.startsWith('Close the tab of ')) fail(`the subagent tab's button says ${subLabel}`);
    if ((await root.innerText()) === (await sub.innerText())) fail('the two tab buttons look the same');
    if (!(await sub.getAttribute('title')).includes('keeps running')) fail(`the subagent's button does not say it keeps running: ${await sub.getAttribute('title')}`);
    await shot(page, 'tab-buttons');
    // Delete on a root's tab archives it, but asks first when its box holds unsent text.
    await page.click(`${tab(A.parent)} .tab-open`);
    await page.fill(`${pane(A.parent)} textarea`, 'not sent yet');
    await page.focus(`${tab(A.parent)} .tab-open`);
    await page.keyboard.press('Delete');
    const ask = page.locator('dialog');
    await ask.waitFor({ state: 'visible' });
    if (!(await ask.innerText()).includes('not sent')) fail(`the Delete key's question: ${await ask.innerText()}`);
    await page.keyboard.press('Escape');
    await gone(page, 'dialog');
    await page.locator(tab(A.parent)).waitFor();
    await page.fill(`${pane(A.parent)} textarea`, '');
    // The track's × asks, then offers an undo.
    await page.click(`${tab(A.parent)} .tab-open`);
    await page.click(`${trackRow(A.parent, A.child)} button.archive-x`);
    await page.click('dialog button.danger');
    await gone(page, trackRow(A.parent, A.child));
    await page.click('#toasts .toast:has-text("Archived") button:has-text("Unarchive")');
    await page.locator(trackRow(A.parent, A.child)).waitFor();
    // The root's tab archives at once (it is idle), with the same undo.
    await root.click();
    const undo = page.locator('#toasts .toast:has-text("Archived") button:has-text("Unarchive")');
    await undo.waitFor();
    await gone(page, tab(A.parent));
    await gone(page, row(A.parent));
    await shot(page, 'archive-undo-toast');
    await step('archived');
    await undo.click();
    await page.locator(row(A.parent)).waitFor();
    await step('unarchived');
  },

  // Another client archives the agent this page is typing to: the pane says so, keeps the
  // text, and Unarchive brings it back to send.
  async archivedWhileTyping() {
    const one = await open();
    const two = await open();
    for (const p of [one, two]) { await ready(p); await openAgent(p, A.agent); }
    const p = pane(A.agent);
    await one.locator(`${p} textarea`).fill('say half written');
    await one.locator(`${p} textarea`).dispatchEvent('input');
    await two.click(`${p} button.danger:has-text("Archive")`);
    await two.click('dialog button.danger');
    await gone(two, tab(A.agent));
    const note = one.locator(`${p} .archived-note`);
    await note.waitFor({ state: 'visible' });
    if (!(await note.innerText()).includes('archived elsewhere')) fail(`the pane does not say it: ${await note.innerText()}`);
    await one.locator(tab(A.agent)).waitFor();
    if ((await one.locator(`${p} textarea`).inputValue()) !== 'say half written') fail('the draft was lost');
    await shot(one, 'archived-while-typing');
    await step('archived');
    await note.locator('button:has-text("Unarchive")').click();
    await note.waitFor({ state: 'hidden' });
    await one.locator(`${p} textarea`).press('Enter');
    await one.locator(`${p} .kind-agent_message:has-text("half written")`).waitFor();
  },

  // On a phone the open drawer has a backdrop: a tap outside or Escape closes it.
  async phoneDrawer() {
    const page = await open({ viewport: { width: 390, height: 844 }, mobile: true });
    await page.locator('#app').waitFor({ state: 'visible' });
    const closed = () => page.waitForFunction(() => !document.body.classList.contains('drawer-open')
      && document.querySelector('#sidebar').getBoundingClientRect().right <= 1
      && getComputedStyle(document.querySelector('#backdrop')).display === 'none');
    await page.tap('#drawer-toggle');
    await page.locator('#backdrop').waitFor({ state: 'visible' });
    await page.waitForTimeout(250); // the slide-in, for the screenshot
    await shot(page, 'phone-drawer-backdrop');
    await page.touchscreen.tap(375, 400);
    await closed();
    if ((await page.getAttribute('#drawer-toggle', 'aria-expanded')) !== 'false') fail('the toggle still says the drawer is open');
    await page.tap('#drawer-toggle');
    await page.locator('#backdrop').waitFor({ state: 'visible' });
    await page.keyboard.press('Escape');
    await closed();
    // The open agent's tab button takes a finger.
    await page.tap('#drawer-toggle');
    await page.tap(row(A.agent));
    await closed();
    const box = await page.locator(`${tab(A.agent)} .tab-close`).boundingBox();
    if (box.width < 44 || box.height < 44) fail(`the tab's button is ${box.width}×${box.height} px`);
    await shot(page, 'phone-tab');
    // Dialogs fit the screen: the new-agent dialog, whole, with nothing to scroll sideways.
    await page.tap('#drawer-toggle');
    await page.tap('#new-agent');
    const dialog = page.locator('dialog[open]');
    await dialog.waitFor();
    const fit = await dialog.evaluate((d) => {
      const r = d.getBoundingClientRect();
      const wide = [...d.querySelectorAll('*')].filter((e) => e.getBoundingClientRect().right > innerWidth + 1).map((e) => e.tagName);
      return { left: r.left, right: r.right, scroll: d.scrollWidth - d.clientWidth, wide };
    });
    if (fit.left < 0 || fit.right > 390 || fit.scroll > 0 || fit.wide.length) fail(`the new-agent dialog does not fit 390 px: ${JSON.stringify(fit)}`);
    await shot(page, 'phone-new-agent');
    await page.keyboard.press('Escape');
  },

  // The page tells the daemon which agent is in front, and nothing while it is hidden: no
  // notification goes out about what the user is looking at.
  async watching() {
    const page = await open();
    await ready(page);
    const acknowledged = (id) => page.waitForFunction((want) => document.body.dataset.watching === want, id);
    await openAgent(page, A.one);
    await acknowledged(A.one);
    await step('front-one');
    await openAgent(page, A.two);
    await acknowledged(A.two);
    await step('front-two');
    // Headless pages are always visible: the page is told it is hidden, as a browser would.
    await page.evaluate(() => {
      Object.defineProperty(document, 'hidden', { value: true, configurable: true });
      Object.defineProperty(document, 'visibilityState', { value: 'hidden', configurable: true });
      document.dispatchEvent(new Event('visibilitychange'));
    });
    await acknowledged('');
    await step('hidden');
    // A notification's link opens its agent's tab, in front.
    const linked = await open({ fragment: `&agent=${A.one}` });
    await ready(linked);
    await linked.locator(`${tab(A.one)}.active`).waitFor();
    if (linked.url().includes('agent=') || linked.url().includes('token')) fail(`the link stayed in the address bar: ${linked.url()}`);
    // Another link followed in the open page (only its fragment changes) opens that agent.
    await linked.evaluate((id) => { location.hash = `agent=${id}`; }, A.two);
    await linked.locator(`${tab(A.two)}.active`).waitFor();
    if (linked.url().includes('agent=')) fail(`the link stayed in the address bar: ${linked.url()}`);
  },

  // A subagent's permission request shows on its root's sidebar row, with a count; one click
  // opens the subagent at the request.
  async subagentAttention() {
    const page = await open();
    await ready(page);
    const badge = page.locator(`#workspaces li.agent-row[data-agent-id="${A.parent}"] button.sub-attention`);
    await badge.waitFor();
    if ((await badge.innerText()).trim() !== '! 1 sub') fail(`the rollup says ${await badge.innerText()}`);
    await shot(page, 'subagent-attention-rollup');
    await badge.click();
    await page.locator(`${pane(A.child)} .permission.pending button:has-text("Allow once")`).waitFor();
    await page.click(`${pane(A.child)} .permission.pending button:has-text("Allow once")`);
    await gone(page, `#workspaces li.agent-row[data-agent-id="${A.parent}"] button.sub-attention`);
  },

  // A workspace terminal: opened from the agent's pane, a command typed and its output read
  // on the screen; after a reload it is still listed and shows what it showed; closing its
  // tab ends it. At 390 px its targets take a finger.
  async terminals() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.agent);
    const panel = `${pane(A.agent)} section.terminals`;
    await page.click(`${panel} button.new-terminal`);
    const screen = `${panel} .term-view[data-terminal-id] .xterm-rows`;
    await page.locator(screen).waitFor({ state: 'visible' });
    const shows = (text) => page.waitForFunction(([sel, t]) => document.querySelector(sel)?.textContent.includes(t), [screen, text]);
    await page.click(`${panel} .term-view`);
    await page.keyboard.type('echo answer=$((6*7)) in $(basename "$PWD")');
    await page.keyboard.press('Enter');
    await shows(`answer=42 in ${A.dir}`);
    // Colours are drawn: xterm.js styles its cells itself (the CSP lets it).
    await page.keyboard.type("printf '\\033[31mred=%s\\033[0m\\n' $((1+1))");
    await page.keyboard.press('Enter');
    await shows('red=2');
    const red = await page.locator(`${screen} span`, { hasText: 'red=2' }).last().evaluate((e) => getComputedStyle(e).color);
    if (red !== 'rgb(176, 27, 37)') fail(`red text is drawn in ${red}`);
    await shot(page, 'terminal');
    // The terminal follows the page into the dark scheme (a screenshot to look at).
    await page.emulateMedia({ colorScheme: 'dark' });
    await page.screenshot({ path: `${A.shots}/terminal-dark.png` });
    await page.emulateMedia({ colorScheme: null });
    const id = await page.locator(`${panel} .term-view`).getAttribute('data-terminal-id');
    // The Rust side answers with the terminal the daemon lists for the workspace.
    const listed = (await step('typed')).trim();
    if (listed !== id) fail(`the daemon lists ${listed}, the page shows ${id}`);
    // A reload: the terminal is listed and its screen drawn again from the daemon's scrollback.
    await page.reload();
    await ready(page);
    await page.locator(`${panel} .term-tab[data-terminal-id="${id}"]`).waitFor();
    await page.locator(screen).waitFor({ state: 'visible' });
    await shows(`answer=42 in ${A.dir}`);
    // Typing still reaches it.
    await page.click(`${panel} .term-view`);
    await page.keyboard.type('echo again=$((20+1))');
    await page.keyboard.press('Enter');
    await shows('again=21');
    // The shell takes Tab; Shift+Escape leaves the terminal for its tab.
    await page.keyboard.press('Shift+Escape');
    if (!await page.evaluate((t) => document.activeElement?.closest('.term-tab')?.getAttribute('data-terminal-id') === t, id)) fail('Shift+Escape did not leave the terminal');
    // On a phone the panel's targets take a finger, and the screen fits.
    await page.setViewportSize({ width: 390, height: 800 });
    // The sidebar slides away into its drawer (0.15 s).
    await page.waitForFunction(() => document.querySelector('#sidebar').getBoundingClientRect().right <= 0);
    await fingerSized(page, 'terminals at 390 px');
    const wide = await page.locator(`${panel} .term-view`).evaluate((e) => e.getBoundingClientRect().right);
    if (wide > 390) fail(`the terminal is ${wide} px wide at 390`);
    await shot(page, 'terminal-phone');
    await page.setViewportSize({ width: 1280, height: 800 });
    // Closing its tab ends it.
    await page.click(`${panel} .term-tab[data-terminal-id="${id}"] .term-close`);
    await gone(page, `${panel} .term-tab[data-terminal-id="${id}"]`);
    await step('closed');
  },

  // An agent with a budget shows what it spent and its tree's spend against the budget in its
  // header: in the warning colour past 80 %, the danger one once spent, as its subagent spends.
  async budget() {
    const page = await open();
    await ready(page);
    await openAgent(page, A.root);
    // The header is drawn again as spend arrives, so the text, class and colour are read from
    // the badge as it is at one instant (a replaced element has no computed style).
    const badge = `${pane(A.root)} .spend .budget`;
    const read = () => page.evaluate(([sel]) => {
      const e = document.querySelector(sel);
      return e && { text: e.textContent, classes: e.getAttribute('class'), color: getComputedStyle(e).color };
    }, [badge]);
    const colour = (name) => page.evaluate((n) => {
      const probe = document.createElement('span');
      probe.style.color = `var(${n})`;
      document.body.append(probe);
      const c = getComputedStyle(probe).color;
      probe.remove();
      return c;
    }, name);
    const shows = async (text, level, name) => {
      await page.waitForFunction(([sel, t]) => document.querySelector(sel)?.textContent.includes(t), [badge, text]);
      const [is, want] = [await read(), await colour(name)];
      if (!is?.text.includes(text)) return shows(text, level, name);
      if (!is.classes.includes(`budget-${level}`)) fail(`not ${level}: ${is.classes}`);
      if (is.color !== want) fail(`the badge is ${is.color}, not ${name} (${want})`);
    };
    const own = await page.locator(`${pane(A.root)} .spend`).first().innerText();
    if (!own.includes('spent 1000 tok · 0.0010 USD')) fail(`the header says ${own}`);
    await shows('tree 2000/2400 tok (83 %)', 'warn', '--warn');
    await shot(page, 'budget-warning');
    await step('warned');
    await shows('tree 3000/2400 tok (125 %)', 'over', '--danger');
    await shot(page, 'budget-spent');
    // A subagent shows its own spend; the budget is its root's.
    const track = page.locator(`${pane(A.root)} .track-toggle`);
    if (await page.locator(`${trackRow(A.root, A.child)} button.open`).count() === 0) await track.click();
    await page.click(`${trackRow(A.root, A.child)} button.open`);
    await page.locator(`${pane(A.child)} .timeline`).waitFor({ state: 'visible' });
    const child = await page.locator(`${pane(A.child)} .spend`).first().innerText();
    if (!child.includes('spent 2000 tok · 0.0020 USD') || child.includes('tree')) fail(`the subagent's header says ${child}`);
  },

  // The first screen says which agents spent their budget (every send refused) and which are
  // past 80 % of it: the reason is `budget_warning` for both.
  async budgetSpentLanding() {
    const page = await open({ viewport: { width: 390, height: 844 }, mobile: true });
    await ready(page);
    const why = async (id) => {
      const need = page.locator(`.landing li[data-agent-id="${id}"] .why`);
      await need.waitFor();
      return need.innerText();
    };
    const spent = await why(A.spent);
    if (spent !== 'spent its budget: nothing new starts until it is raised') fail(`the spent agent's row says: ${spent}`);
    const warned = await why(A.warned);
    if (warned !== 'spent over 80 % of its budget') fail(`the warned agent's row says: ${warned}`);
    await shot(page, 'budget-spent-landing');
  },
};

const name = process.argv[2];
try {
  if (!scenarios[name]) fail(`no scenario ${name}`);
  await scenarios[name]();
  if (errors.length) fail(errors.join('\n'));
  if (inaccessible.length) fail(`accessibility (axe-core), serious or critical:\n${inaccessible.join('\n')}`);
  process.stdout.write('@done\n');
} catch (e) {
  // What the page showed, for the failure message and as a screenshot beside the others.
  let shown = '';
  for (const [i, p] of pages.entries()) {
    try {
      await p.screenshot({ path: `${A.shots}/failed-${name}-${i}.png` });
      shown += `\n--- page ${i} (${A.shots}/failed-${name}-${i}.png):\n${(await p.locator('body').innerText()).slice(0, 3000)}`;
    } catch { /* the page is gone */ }
  }
  process.stderr.write(`scenario ${name} failed: ${e.stack || e}\n${errors.join('\n')}${shown}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
  lines.close();
}
