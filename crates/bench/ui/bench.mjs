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
        // The page's own handling of each message until the first sidebar: when, how long, what.
        window.__ws.handled = [];
        const proto = Object.getOwnPropertyDescriptor(Socket.prototype, 'onmessage');
        Object.defineProperty(this, 'onmessage', {
          get: () => proto.get.call(this),
          set: (fn) => proto.set.call(this, (e) => {
            const at = performance.now();
            fn(e);
            const took = performance.now() - at;
            if (!window.droverTiming?.renderedAt && took >= 2) window.__ws.handled.push([Math.round(at), Math.round(took), e.data.slice(9, 30)]);
          }),
        });
        this.addEventListener('message', (e) => {
          if (!window.__ws.stateAt && e.data.startsWith('{"type":"session_state"')) {
            window.__ws.stateAt = performance.now();
            window.__ws.bytes = e.data.length;
          }
        });
      }
    };
    window.__long = [];
    window.__boot = [];
    window.__frames = [];
    const raf = window.requestAnimationFrame.bind(window);
    window.requestAnimationFrame = (cb) => raf((t) => {
      const at = performance.now();
      const before = !window.droverTiming?.renderedAt;
      cb(t);
      if (before) window.__frames.push([Math.round(at), Math.round(performance.now() - at)]);
    });
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        window.__long.push(e.duration);
        if (!window.droverTiming?.renderedAt) window.__boot.push([Math.round(e.startTime), Math.round(e.duration)]);
      }
    })
      .observe({ type: 'longtask', buffered: true });
  });
  // With DROVER_UI_BENCH_PROFILE set, where the page's time went up to the first sidebar: the
  // functions with the most time of their own, from a CPU profile.
  const profiler = process.env.DROVER_UI_BENCH_PROFILE ? await context.newCDPSession(page) : null;
  if (profiler) {
    await profiler.send('Profiler.enable');
    await profiler.send('Profiler.setSamplingInterval', { interval: 200 });
    await profiler.send('Profiler.start');
  }
  // With DROVER_UI_BENCH_TRACE=FILE, a Chromium trace of the way to the first sidebar.
  const tracer = process.env.DROVER_UI_BENCH_TRACE ? await browser.newBrowserCDPSession() : null;
  const traced = [];
  if (tracer) {
    tracer.on('Tracing.dataCollected', (e) => traced.push(...e.value));
    await tracer.send('Tracing.start', { traceConfig: { includedCategories: ['devtools.timeline', 'disabled-by-default-devtools.timeline', 'v8', 'blink', 'toplevel', 'cc', 'gpu', 'viz', 'benchmark'] }, transferMode: 'ReportEvents' });
  }
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
  const phases = await page.evaluate(() => ({ ...window.__ws, dcl: performance.getEntriesByType('navigation')[0]?.domContentLoadedEventEnd, longTasks: window.__boot, frames: window.__frames }));
  const sidebarMs = timing.renderedAt;
  if (tracer) {
    const done = new Promise((r) => tracer.once('Tracing.tracingComplete', r));
    await tracer.send('Tracing.end');
    await done;
    const { writeFileSync } = await import('node:fs');
    writeFileSync(process.env.DROVER_UI_BENCH_TRACE, JSON.stringify({ traceEvents: traced }));
  }
  if (profiler) {
    const { profile } = await profiler.send('Profiler.stop');
    const self = new Map();
    const byId = new Map(profile.nodes.map((n) => [n.id, n]));
    const gaps = profile.timeDeltas;
    profile.samples.forEach((id, i) => {
      const f = byId.get(id).callFrame;
      const key = `${f.functionName || '(anonymous)'} ${f.url.split('/').pop()}:${f.lineNumber + 1}`;
      self.set(key, (self.get(key) || 0) + (gaps[i] || 0) / 1000);
    });
    for (const [k, ms] of [...self].sort((x, y) => y[1] - x[1]).slice(0, 20)) {
      process.stderr.write(`profile: ${ms.toFixed(1)} ms ${k}\n`);
    }
  }
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
  // With DROVER_UI_BENCH_HEAP_DIFF set, what grew over the watch: the heap's objects by
  // constructor (or kind), bytes at the end less bytes at the start, the largest first.
  const census = process.env.DROVER_UI_BENCH_HEAP_DIFF ? async () => {
    const chunks = [];
    const take = (e) => chunks.push(e.chunk);
    cdp.on('HeapProfiler.addHeapSnapshotChunk', take);
    await cdp.send('HeapProfiler.takeHeapSnapshot', { reportProgress: false });
    cdp.off('HeapProfiler.addHeapSnapshotChunk', take);
    const snap = JSON.parse(chunks.join(''));
    const fields = snap.snapshot.meta.node_fields;
    const types = snap.snapshot.meta.node_types[0];
    const [type, name, size] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f));
    const by = new Map();
    for (let i = 0; i < snap.nodes.length; i += fields.length) {
      const kind = types[snap.nodes[i + type]];
      const key = kind === 'object' || kind === 'closure' ? `${kind} ${snap.strings[snap.nodes[i + name]]}` : kind;
      const had = by.get(key) || [0, 0];
      by.set(key, [had[0] + snap.nodes[i + size], had[1] + 1]);
    }
    return by;
  } : null;
  const before = census && await census();
  const samples = [await heap()];
  const every = Math.max(1000, Math.floor(A.memoryMs / 6));
  for (let t = 0; t < A.memoryMs; t += every) {
    await page.waitForTimeout(every);
    samples.push(await heap());
  }
  if (census) {
    const after = await census();
    const grew = [...after].map(([k, [b, n]]) => [k, b - (before.get(k)?.[0] ?? 0), n - (before.get(k)?.[1] ?? 0)])
      .sort((x, y) => y[1] - x[1]).slice(0, 15);
    for (const [k, b, n] of grew) process.stderr.write(`heap grew: ${b} bytes, ${n} objects: ${k}\n`);
  }
  const dom = await page.evaluate(() => document.getElementsByTagName('*').length);
  process.stdout.write(`${JSON.stringify({ sidebarMs, driverMs, phases, parsedAt: timing.stateAt, traffic, rows, keystrokes, ...stream, samples, dom })}\n`);
} finally {
  await browser.close();
}
