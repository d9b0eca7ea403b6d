// The browser half of drover-bench-ui: in headless Chromium, the time from navigation to the
// sidebar drawn; then, once it printed `storm` (the Rust half starts the storm of status
// changes), the filter's keystroke to paint, then, with one streaming agent's tab open, the
// longest main-thread task and the longest gap between frames during the streaming window, and
// the JS heap (after a forced GC) sampled while the streaming goes on. Prints the figures as
// one JSON line, last.
import { createRequire } from 'node:module';

const require = createRequire(`${process.env.DROVER_UI_NODE_MODULES}/`);
const { chromium } = require('playwright-core');
const A = JSON.parse(process.env.DROVER_UI_ARGS);

const browser = await chromium.launch({
  executablePath: process.env.DROVER_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.on('pageerror', (e) => process.stderr.write(`pageerror: ${e.message}\n`));
  page.setDefaultTimeout(60000);
  // Long tasks and frame gaps from the first script on.
  await page.addInitScript(() => {
    // When the page's socket opened and the session_state began to arrive (before its parse):
    // the page's own listeners are set after these, so these run first.
    window.__ws = {};
    const Socket = window.WebSocket;
    window.WebSocket = class extends Socket {
      constructor(...args) {
        super(...args);
        window.__ws.createdAt ??= performance.now();
        this.addEventListener('open', () => { window.__ws.openAt ??= performance.now(); });
        this.addEventListener('message', (e) => {
          if (!window.__ws.stateAt && e.data.startsWith('{"type":"session_state"')) {
            window.__ws.stateAt = performance.now();
            window.__ws.bytes = e.data.length;
          }
        });
      }
    };
    window.__long = [];
    new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__long.push(e.duration); })
      .observe({ type: 'longtask', buffered: true });
  });
  const t0 = Date.now();
  await page.goto(`${A.url}#token=${encodeURIComponent(A.token || '')}`);
  await page.waitForFunction((n) => window.droverTiming.renderedAt && window.droverTiming.rows >= n, A.rows, { polling: 'raf' });
  // The driver's own view (its round trips with the browser included) ...
  const driverMs = Date.now() - t0;
  // ... and the page's: from the navigation's start to the sidebar drawn, of which its own part
  // is from the session_state's arrival to the sidebar drawn.
  const timing = await page.evaluate(() => window.droverTiming);
  // Where the page's time went: its modules run (the socket made), the socket open, the
  // session_state arrived, parsed and applied, the sidebar drawn.
  const phases = await page.evaluate(() => ({ ...window.__ws, dcl: performance.getEntriesByType('navigation')[0]?.domContentLoadedEventEnd }));
  const sidebarMs = timing.renderedAt;
  // Now the storm of status changes: everything below is measured while it goes on.
  process.stdout.write('storm\n');
  await page.waitForTimeout(2000);
  // What the daemon sends while the agents stream, by type, over 3 s (a socket of its own).
  const traffic = await page.evaluate(async (token) => {
    const counts = {};
    const ws = new WebSocket(`ws://${location.host}/ws`);
    await new Promise((r) => { ws.onopen = r; });
    ws.send(JSON.stringify({ type: 'hello', client: 'bench-counter', protocolVersion: 1, token }));
    ws.onmessage = (e) => { const t = JSON.parse(e.data).type; counts[t] = (counts[t] || 0) + 1; };
    await new Promise((r) => setTimeout(r, 3000));
    ws.close();
    return counts;
  }, A.token || null);

  // The filter, typed as a user does: each keystroke's time from the key's event to the frame
  // after the sidebar drew what it matches (the page's own listener runs first and asks for
  // that frame; ours, asked after it, runs after its drawing, and its timeout after the paint).
  await page.evaluate(() => {
    window.__keys = [];
    document.getElementById('filter').addEventListener('input', (e) => {
      const at = e.timeStamp;
      requestAnimationFrame(() => setTimeout(() => window.__keys.push(performance.now() - at), 0));
    });
  });
  await page.click('#filter');
  for (const word of ['fix', 'auth', 'migration', 'investigate', 'stormer', 'zzz']) {
    await page.keyboard.type(word, { delay: 80 });
    for (let i = 0; i < word.length; i++) await page.keyboard.press('Backspace', { delay: 80 });
  }
  const keystrokes = await page.evaluate(() => window.__keys);

  // The streaming agent's row, found with the filter (with 10,000 agents it may be far down),
  // then the filter cleared.
  await page.fill('#filter', A.open);
  await page.click(`#workspaces li.agent-row[data-agent-id="${A.open}"] button.open`);
  await page.locator(`.agent-pane[data-agent-id="${A.open}"] .kind-agent_message`).first().waitFor();
  await page.fill('#filter', '');
  await page.evaluate(() => {
    window.__long = [];
    window.__gap = 0;
    let last = performance.now();
    const tick = (t) => { window.__gap = Math.max(window.__gap, t - last); last = t; window.__raf = requestAnimationFrame(tick); };
    window.__raf = requestAnimationFrame(tick);
  });
  await page.waitForTimeout(A.streamMs);
  const stream = await page.evaluate(() => {
    cancelAnimationFrame(window.__raf);
    const text = document.querySelector('.agent-pane:not([hidden]) .kind-agent_message:last-of-type')?.textContent ?? '';
    return {
      longest: Math.max(0, ...window.__long), longTasks: window.__long.length, gap: window.__gap, chars: text.length,
      domRows: document.querySelectorAll('#workspaces > li').length,
    };
  });
  const rows = timing.rows;

  const cdp = await context.newCDPSession(page);
  const heap = async () => {
    await cdp.send('HeapProfiler.collectGarbage');
    return (await cdp.send('Runtime.getHeapUsage')).usedSize;
  };
  const samples = [await heap()];
  const every = Math.max(1000, Math.floor(A.memoryMs / 6));
  for (let t = 0; t < A.memoryMs; t += every) {
    await page.waitForTimeout(every);
    samples.push(await heap());
  }
  const dom = await page.evaluate(() => document.getElementsByTagName('*').length);
  process.stdout.write(`${JSON.stringify({ sidebarMs, driverMs, phases, parsedAt: timing.stateAt, traffic, rows, keystrokes, ...stream, samples, dom })}\n`);
} finally {
  await browser.close();
}
