// The gateway's API, as the pages call it: every request carries the signed-in token in the
// X-Diskpipe-Token header (so it passes the apiserver's service proxy, which takes
// Authorization for itself), and every answer is the gateway's envelope. Inside a console
// that signs its users in itself (KubeSphere's, whose server turns its session cookie into
// the user's token on the way to the gateway) there is no token of the page's: requests go
// with the console's cookie, same-origin only.

export const prefix = 'kapis/virtualization.kubesphere.io/v1beta1';
export const tokenHeader = 'X-Diskpipe-Token';

// base is where the page was served from: the gateway's root, or a proxy's path to it.
const base = new URL('.', document.baseURI);

// segment is what each part of a route's path is: a word of the API, or a Kubernetes name.
// Anything else (a '..', a '%2e', a '?', from a link's ?namespace= or an object's name) would
// point the request at another path of the page's origin, with the cookie of a console in
// front: it is refused.
const segment = /^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/;

// url is a route's address, in the signed-in cluster (?cluster=; none: the host).
export function url(path, query) {
  if (!path.split('/').every((p) => segment.test(p) && !p.includes('..'))) {
    throw new ApiError(400, `"${path}" is not a path of the gateway's API`, 'BadRequest');
  }
  const u = new URL(`${prefix}/${path}`, base);
  const cluster = sessionStorage.getItem('diskpipe.cluster');
  for (const [k, v] of Object.entries({ cluster: cluster === 'host' ? '' : cluster, ...(query || {}) })) {
    if (v !== undefined && v !== null && v !== '') u.searchParams.set(k, v);
  }
  return u.toString();
}

export function setCluster(name) {
  sessionStorage.setItem('diskpipe.cluster', name);
}

// ApiError is a refusal or failure: the gateway's message, the API's reason, and for a 403
// the right the caller lacks (X-Deny-Reason).
export class ApiError extends Error {
  constructor(status, message, reason, deny, trace) {
    super(message);
    this.status = status;
    this.reason = reason;
    this.deny = deny;
    this.trace = trace;
  }
}

// A console that frames the pages may name the project: ?namespace=.
const asked = new URLSearchParams(location.search).get('namespace');
if (asked && /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(asked)) sessionStorage.setItem('diskpipe.namespace', asked);

export function session() {
  return { token: sessionStorage.getItem('diskpipe.token') || '', ns: sessionStorage.getItem('diskpipe.namespace') || 'default' };
}

export function saveSession(token, ns) {
  sessionStorage.setItem('diskpipe.token', token);
  sessionStorage.setItem('diskpipe.namespace', ns);
}

export function clearSession() {
  sessionStorage.removeItem('diskpipe.token');
}

// headers are a request's: the page's token, when it has one.
export function headers(extra) {
  const token = session().token;
  return { ...(token ? { [tokenHeader]: token } : {}), ...(extra || {}) };
}

// call sends one request and answers the envelope, or throws an ApiError.
export async function call(method, path, { query, body, signal } = {}) {
  let res;
  try {
    res = await fetch(url(path, query), {
      method,
      headers: headers(body ? { 'Content-Type': 'application/json' } : {}),
      body: body ? JSON.stringify(body) : undefined,
      signal,
      credentials: 'same-origin',
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, String(e.message || e), 'ServiceUnavailable');
  }
  let env = {};
  try {
    env = await res.json();
  } catch {
    env = { message: `the gateway answered ${res.status} with no envelope` };
  }
  if (!res.ok) throw new ApiError(res.status, env.message, env.reason, res.headers.get('X-Deny-Reason'), env.traceID);
  return env;
}

export const list = (ns, resource, query) => call('GET', `projects/${ns}/${resource}`, { query });
export const create = (ns, resource, body) => call('POST', `projects/${ns}/${resource}`, { body });
export const remove = (ns, resource, name, kind) => call('DELETE', `projects/${ns}/${resource}/${name}`, { query: { kind } });
export const whoami = () => call('GET', 'whoami');

// watch calls onChange for each change to ns's resource, as the gateway streams them
// (server-sent events, read with fetch so the token goes in a header), and onState with
// 'live' or 'reconnecting'; it reconnects until stop() is called.
export function watch(ns, resource, onChange, onState) {
  const ctl = new AbortController();
  let stopped = false;
  const run = async () => {
    while (!stopped) {
      try {
        const res = await fetch(url(`projects/${ns}/${resource}`, { watch: 'true' }), { headers: headers(), signal: ctl.signal, credentials: 'same-origin' });
        if (!res.ok) throw new Error(`watch answered ${res.status}`);
        onState('live');
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            if (/^event: change$/m.test(block)) onChange();
          }
        }
      } catch (e) {
        if (stopped) return;
      }
      onState('reconnecting');
      await new Promise((r) => setTimeout(r, 3000));
    }
  };
  run();
  return () => {
    stopped = true;
    ctl.abort();
  };
}
