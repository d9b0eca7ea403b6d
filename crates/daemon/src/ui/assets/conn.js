// The connection to the daemon: one WebSocket to /ws on this origin, `hello` with the token,
// requests paired with answers by `requestId`, and reconnection with backoff.

import { PROTOCOL_VERSION, ClientType, DaemonType, ErrorCode } from './protocol.gen.js';
/** @typedef {import('./protocol.gen.js').ClientMessage} ClientMessage */
/** @typedef {import('./protocol.gen.js').ClientRequest} ClientRequest */
/** @typedef {import('./protocol.gen.js').DaemonMessage} DaemonMessage */
/** @typedef {'connecting' | 'online' | 'offline' | 'unauthorized'} ConnState */
/**
 * What comes with a state: `welcome`'s payload when online, when the next try is when offline.
 * @typedef {{sessionId?: string, retryInMs?: number}} StateInfo
 */

/** Backoff between reconnection attempts: doubles from the first, capped at the last. */
const BACKOFF_MS = [250, 5000];
/** A request without an answer in this long fails (the socket may be half-dead). */
const REQUEST_TIMEOUT_MS = 60000;

export class ProtocolError extends Error {
  /** @param {{code: string, message?: string | null, details?: unknown}} payload a `request_error`'s */
  constructor(payload) {
    super(payload.message || payload.code);
    this.code = payload.code;
    this.details = payload.details ?? null;
  }
}

/**
 * What a caught error says: a ProtocolError's message, or the page's own error's.
 * @param {unknown} e
 * @returns {string}
 */
export function errorMessage(e) {
  return e instanceof Error ? e.message : String(e);
}

/**
 * Whether a caught error is a request refused because the daemon is offline.
 * @param {unknown} e
 */
export function isOffline(e) {
  return e instanceof ProtocolError && e.code === 'offline';
}

export class Conn {
  /**
   * `onMessage(msg)` gets every daemon message; `onState(state, info)` gets `connecting`,
   * `online`, `offline` (with `retryInMs`) and `unauthorized`.
   * @param {{token: string | null, onMessage: (msg: DaemonMessage) => void, onState: (state: ConnState, info: StateInfo) => void}} options
   */
  constructor({ token, onMessage, onState }) {
    this.token = token;
    this.onMessage = onMessage;
    this.onState = onState;
    /**
     * The requests without an answer yet, by `requestId`; an answer's shape depends on its
     * request (see `request`).
     * @type {Map<string, {resolve: (msg: any) => void, reject: (e: ProtocolError) => void, timer: ReturnType<typeof setTimeout>}>}
     */
    this.pending = new Map();
    this.next = 0;
    this.attempt = 0;
    /** @type {WebSocket | null} */
    this.ws = null;
    /** @type {ConnState} */
    this.state = 'connecting';
    this.includeArchived = false;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    this.timer = undefined;
  }

  connect() {
    clearTimeout(this.timer);
    const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/ws`;
    const ws = new WebSocket(url);
    this.ws = ws;
    this.setState('connecting');
    ws.onopen = () => this.hello();
    ws.onmessage = (e) => {
      let msg;
      try { msg = JSON.parse(e.data); } catch { return; }
      this.receive(msg);
    };
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.failPending('offline');
      if (e.code === 1008 || this.state === 'unauthorized') {
        this.setState('unauthorized');
        return;
      }
      const [first, cap] = BACKOFF_MS;
      const delay = Math.min(cap, first * 2 ** this.attempt) * (0.75 + Math.random() * 0.5);
      this.attempt += 1;
      this.setState('offline', { retryInMs: delay });
      this.timer = setTimeout(() => this.connect(), delay);
    };
  }

  /** Says `hello` (again: after `resync_required` it re-reads the whole state). */
  hello() {
    this.send({
      type: ClientType.Hello, client: 'drover-web', version: '0.1.0', protocolVersion: PROTOCOL_VERSION,
      capabilities: [], token: this.token || null, includeArchived: this.includeArchived,
    });
  }

  /** Reconnects now (after a new token, or when the user asks). */
  retry() {
    this.attempt = 0;
    if (this.ws) { const ws = this.ws; this.ws = null; ws.close(); }
    this.connect();
  }

  /**
   * @param {ConnState} state
   * @param {StateInfo} [info]
   */
  setState(state, info = {}) {
    this.state = state;
    this.onState(state, info);
  }

  /**
   * One message off the socket: answers settle their request, then everything goes to
   * `onMessage`.
   * @param {DaemonMessage} msg
   */
  receive(msg) {
    if (msg.type === DaemonType.Welcome) {
      this.attempt = 0;
      this.setState('online', msg.payload);
    }
    if (msg.type === DaemonType.RequestError && msg.payload.code === ErrorCode.Unauthorized) {
      this.setState('unauthorized');
    }
    const payload = msg.payload || {};
    const id = 'requestId' in payload ? payload.requestId : null;
    const p = id != null ? this.pending.get(id) : undefined;
    if (id != null && p) {
      this.pending.delete(id);
      clearTimeout(p.timer);
      if (msg.type === DaemonType.RequestError) p.reject(new ProtocolError(msg.payload));
      else p.resolve(msg);
    }
    this.onMessage(msg);
  }

  /** @param {ClientRequest} msg */
  send(msg) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(msg));
    return true;
  }

  /**
   * Sends a request; resolves with its answer, rejects with a ProtocolError.
   * @param {ClientMessage} msg
   * @returns {Promise<any>} the answer (its shape depends on the request: see `DaemonMessage`)
   */
  request(msg) {
    const requestId = `w${++this.next}`;
    return new Promise((resolve, reject) => {
      if (this.state !== 'online' || !this.send({ ...msg, requestId })) {
        reject(new ProtocolError({ code: 'offline', message: 'not connected to the daemon' }));
        return;
      }
      const timer = setTimeout(() => {
        this.pending.delete(requestId);
        reject(new ProtocolError({ code: 'timeout', message: `no answer to ${msg.type} in time` }));
      }, REQUEST_TIMEOUT_MS);
      this.pending.set(requestId, { resolve, reject, timer });
    });
  }

  /** @param {string} code */
  failPending(code) {
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(new ProtocolError({ code, message: 'the connection to the daemon closed' }));
    }
    this.pending.clear();
  }
}
