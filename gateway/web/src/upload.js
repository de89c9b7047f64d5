// A resumable upload of one file to one image, through the gateway to diskpipe's upload
// proxy. The file is sent in pieces (each a multiple of the proxy's part size), each piece
// read from the disk by the browser as it is sent, never the whole file in memory. The file's
// digest (sha256, or the image checksum's algorithm) is computed here as it is sent and given
// with the last piece; the proxy completes the upload only if its own digest is the same.
// After each piece the hash's state is kept in localStorage with the offset it covers, so a
// reload, a closed tab or a cut network goes on from the last byte the server acknowledged.
import { createSHA256, createSHA512 } from 'hash-wasm';
import { url, headers, ApiError, call } from './api.js';
import { t } from './texts.js';

const hashChunk = 8 << 20;
// pieceBytes is about what one request sends: a few of the proxy's parts.
const pieceBytes = 256 << 20;

const hashers = { sha256: createSHA256, sha512: createSHA512 };

export function recordKey(ns, kind, name) {
  return `diskpipe.upload.${ns}/${kind}/${name}`;
}

export function fingerprint(file) {
  return { name: file.name, size: file.size, lastModified: file.lastModified };
}

function sameFile(a, b) {
  return a && b && a.name === b.name && a.size === b.size && a.lastModified === b.lastModified;
}

function b64(bytes) {
  let s = '';
  for (let i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]);
  return btoa(s);
}

function unb64(s) {
  return Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
}

// records are the unfinished uploads this browser knows of, in namespace ns.
export function records(ns) {
  const out = [];
  for (let i = 0; i < localStorage.length; i++) {
    const k = localStorage.key(i);
    if (!k.startsWith(`diskpipe.upload.${ns}/`)) continue;
    try {
      out.push({ key: k, ...JSON.parse(localStorage.getItem(k)) });
    } catch {
      localStorage.removeItem(k);
    }
  }
  return out;
}

export class Upload {
  // onProgress gets {sent, total, rate, phase, message}.
  constructor({ ns, kind, name, file, algorithm = 'sha256', onProgress }) {
    Object.assign(this, { ns, kind, name, file, algorithm, onProgress });
    this.key = recordKey(ns, kind, name);
    this.stopped = false;
    this.xhr = null;
    this.samples = [];
  }

  path() {
    return `projects/${this.ns}/uploads/${this.name}`;
  }

  progress(sent, phase, message) {
    const now = performance.now();
    this.samples.push([now, sent]);
    while (this.samples.length > 2 && now - this.samples[0][0] > 5000) this.samples.shift();
    const [t0, b0] = this.samples[0];
    const rate = now > t0 ? ((sent - b0) * 1000) / (now - t0) : 0;
    this.onProgress?.({ sent, total: this.file.size, rate, phase, message });
  }

  save(offset, hasher) {
    localStorage.setItem(this.key, JSON.stringify({
      kind: this.kind, name: this.name, file: fingerprint(this.file), algorithm: this.algorithm, offset, hash: b64(hasher.save()),
    }));
  }

  // state asks the gateway where the upload stands.
  async state() {
    const env = await call('GET', this.path(), { query: { kind: this.kind } });
    return env.data;
  }

  // hashRange hashes the file's bytes [from, to) into hasher.
  async hashRange(hasher, from, to, onBytes) {
    for (let p = from; p < to && !this.stopped; p += hashChunk) {
      const end = Math.min(to, p + hashChunk);
      hasher.update(new Uint8Array(await this.file.slice(p, end).arrayBuffer()));
      onBytes?.(end);
    }
  }

  // send PUTs bytes [from, to) of the file, with digest on the last piece; it answers the
  // proxy's state, or throws.
  send(from, to, digest) {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      this.xhr = xhr;
      xhr.open('PUT', url(this.path(), { kind: this.kind }));
      for (const [k, v] of Object.entries(headers())) xhr.setRequestHeader(k, v);
      xhr.setRequestHeader('Content-Range', `bytes ${from}-${to - 1}/${this.file.size}`);
      if (digest) xhr.setRequestHeader('Upload-Digest', digest);
      xhr.upload.onprogress = (e) => this.progress(from + e.loaded, 'sending');
      xhr.onload = () => {
        let env = {};
        try {
          env = JSON.parse(xhr.responseText);
        } catch {
          env = { message: `the gateway answered ${xhr.status}` };
        }
        if (xhr.status >= 200 && xhr.status < 300) resolve(env.data);
        else reject(new ApiError(xhr.status, env.message, env.reason, xhr.getResponseHeader('X-Deny-Reason'), env.traceID));
      };
      xhr.onerror = () => reject(new ApiError(0, 'the connection was lost', 'ServiceUnavailable'));
      xhr.onabort = () => reject(new ApiError(0, 'cancelled', 'Cancelled'));
      xhr.send(this.file.slice(from, to));
    });
  }

  // run uploads the file from the offset the server has to its end, going on after
  // failures a later try may mend (a cut connection, a busy proxy); a refusal ends it.
  async run() {
    const total = this.file.size;
    const create = hashers[this.algorithm];
    if (!create) throw new Error(`the browser cannot compute ${this.algorithm}`);
    const hasher = await create();
    let st = await this.state();
    let hashed = -1; // the offset the hasher's state covers
    let delay = 1;
    for (;;) {
      if (this.stopped) throw new ApiError(0, 'cancelled', 'Cancelled');
      if (st.complete) {
        localStorage.removeItem(this.key);
        this.progress(total, 'done');
        return st;
      }
      if (st.total && st.total !== total) {
        throw new ApiError(409, t.upload.otherSize(st.total, total), 'Conflict');
      }
      const offset = st.offset;
      const part = st.partSize || 16 << 20;
      if (hashed !== offset) {
        // The hash must cover exactly what the server holds: from this browser's record of
        // it, or else read again from the file (a local read, much faster than the network).
        const rec = JSON.parse(localStorage.getItem(this.key) || 'null');
        hasher.init();
        if (rec && rec.offset === offset && rec.algorithm === this.algorithm && sameFile(rec.file, fingerprint(this.file))) {
          hasher.load(unb64(rec.hash));
        } else {
          await this.hashRange(hasher, 0, offset, (p) => this.progress(0, 'hashing', `${p}`));
        }
        hashed = offset;
        this.save(offset, hasher);
      }
      // A piece ends at a multiple of the part size (counted from the upload's start), or at
      // the end. With every byte stored but the upload not completed (the proxy stopped
      // between the two), the last byte is sent again with the digest: the proxy completes it.
      const from = offset < total ? offset : total - 1;
      const end = offset < total ? Math.min(total, (Math.floor(offset / part) + Math.max(1, Math.floor(pieceBytes / part))) * part) : total;
      const before = hasher.save();
      const last = end === total;
      let digest;
      const hashing = offset < total ? this.hashRange(hasher, offset, end) : Promise.resolve();
      try {
        if (last) {
          await hashing;
          digest = `${this.algorithm}:${hasher.digest('hex')}`;
        }
        if (this.stopped) throw new ApiError(0, 'cancelled', 'Cancelled');
        const [, got] = await Promise.all([hashing, this.send(from, end, digest)]);
        st = got;
        delay = 1;
        if (st.complete) {
          localStorage.removeItem(this.key);
          this.progress(total, 'done', digest);
          return { ...st, digest };
        }
        if (st.offset === end) {
          hashed = end;
          this.save(end, hasher);
        } else {
          hasher.load(before);
          hashed = offset;
        }
      } catch (e) {
        this.xhr?.abort(); // a failed read of the file leaves no request sending beside the next
        await hashing.catch(() => {});
        hasher.load(before);
        hashed = offset;
        if (this.stopped) throw e;
        // Refusals a retry cannot mend, and failures of the browser itself (a file it cannot
        // read: no status), end the upload; the others wait and ask again.
        if (!(e instanceof ApiError) || [400, 401, 403, 404, 413, 422, 501].includes(e.status)) throw e;
        for (let s = delay; s > 0 && !this.stopped; s--) {
          this.progress(offset, 'retrying', s);
          await new Promise((r) => setTimeout(r, 1000));
        }
        delay = Math.min(30, delay * 2);
        try {
          st = await this.state();
        } catch (e2) {
          if ([401, 403, 404, 501].includes(e2.status)) throw e2;
          st = { ...st, offset };
        }
      }
    }
  }

  stop() {
    this.stopped = true;
    this.xhr?.abort();
  }
}
