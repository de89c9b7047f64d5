// The console: sign-in, images, disks and uploads of one namespace, each list kept live by
// the gateway's watch. Routes are the page's hash (#/images), so the page works under any
// path a proxy serves it at.
import { render } from 'preact';
import { useState, useEffect, useRef, useCallback } from 'preact/hooks';
import { t } from './texts.js';
import * as api from './api.js';
import { Upload, records, recordKey, fingerprint } from './upload.js';
import './style.css';

const imageKinds = { VirtualMachineImage: 'hypercloud.tmaxanc.com/v1alpha1', ImageTemplate: 'virtualmachine.kubesphere.io/v1alpha1' };

function bytes(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return '';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function age(ts) {
  if (!ts) return '';
  const s = Math.max(0, (Date.now() - Date.parse(ts)) / 1000);
  if (s < 120) return `${Math.floor(s)}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

function useHash() {
  const [hash, setHash] = useState(location.hash || '#/images');
  useEffect(() => {
    const on = () => setHash(location.hash || '#/images');
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return hash;
}

// useList lists ns's resource and lists it again on every change the watch reports.
function useList(ns, resource) {
  const [state, setState] = useState({ items: null, error: null, actions: {}, message: '' });
  const [live, setLive] = useState('');
  const load = useCallback(async () => {
    try {
      const env = await api.list(ns, resource);
      setState({ items: env.data, error: null, actions: env.actions || {}, message: env.message });
    } catch (e) {
      setState((s) => ({ ...s, items: s.items || [], error: e }));
    }
  }, [ns, resource]);
  useEffect(() => {
    load();
    let timer;
    const stop = api.watch(ns, resource, () => {
      clearTimeout(timer);
      timer = setTimeout(load, 250);
    }, (st) => {
      setLive(st);
      if (st === 'live') load();
    });
    return () => { stop(); clearTimeout(timer); };
  }, [ns, resource, load]);
  return { ...state, live, reload: load };
}

function Alert({ error, ok }) {
  if (ok) return <p class="ok" role="status">{ok}</p>;
  if (!error) return null;
  return (
    <div class="error" role="alert">
      <strong>{error.reason || 'Error'}</strong>: {error.message}
      {error.deny && <div class="deny">{t.notAllowed}{error.deny}</div>}
    </div>
  );
}

// Act is a button for an action the gateway's hints say the caller may or may not take;
// one they may not is disabled and says why, beside it and to a screen reader.
function Act({ hint, onClick, children, id }) {
  const denied = hint && !hint.allowed;
  const rid = id && `${id}-why`;
  return (
    <span class="act">
      <button type="button" id={id} disabled={denied} title={denied ? hint.reason : ''} aria-describedby={denied ? rid : undefined} onClick={onClick}>{children}</button>
      {denied && <span class="why" id={rid}>{hint.reason}</span>}
    </span>
  );
}

function Login({ onIn }) {
  const [token, setToken] = useState('');
  const [ns, setNs] = useState(sessionStorage.getItem('diskpipe.namespace') || '');
  const [error, setError] = useState(null);
  const submit = async (e) => {
    e.preventDefault();
    api.saveSession(token.trim(), ns.trim() || 'default');
    try {
      const who = await api.whoami();
      onIn(who.data);
    } catch (err) {
      api.clearSession();
      setError(err);
    }
  };
  return (
    <main class="login">
      <h1>{t.title}</h1>
      <form onSubmit={submit}>
        <label for="token">{t.tokenLabel}</label>
        <textarea id="token" rows="4" value={token} onInput={(e) => setToken(e.target.value)} required autocomplete="off" spellcheck={false} />
        <label for="namespace">{t.namespaceLabel}</label>
        <input id="namespace" value={ns} placeholder="default" onInput={(e) => setNs(e.target.value)} />
        <p class="help">{t.tokenHelp}</p>
        <button type="submit" id="sign-in">{t.signIn}</button>
        <Alert error={error} />
      </form>
    </main>
  );
}

function phaseOf(o) {
  return o.status?.phase || 'Pending';
}

function Progress({ o }) {
  const tr = o.status?.transfer;
  const parts = [];
  if (o.status?.progress) parts.push(o.status.progress);
  if (tr?.bytesPerSecond) parts.push(`${bytes(tr.bytesPerSecond)}/s`);
  return <span>{parts.join(' · ')}</span>;
}

function osLabels(o) {
  const l = o.metadata?.labels || {};
  return Object.entries(l).filter(([k]) => /(^|[./])os([./-]|$)/.test(k)).map(([k, v]) => `${k.split('/').pop()}=${v}`).join(', ');
}

function Images({ ns, uploads }) {
  const { items, error, actions, live, message } = useList(ns, 'images');
  const [result, setResult] = useState({});
  const del = async (it) => {
    if (!confirm(t.confirmDelete(it.kind, it.object.metadata.name))) return;
    try {
      await api.remove(ns, 'images', it.object.metadata.name, it.kind);
      setResult({ ok: t.deleting(it.kind, it.object.metadata.name) });
    } catch (e) {
      setResult({ error: e });
    }
  };
  return (
    <section aria-labelledby="images-h">
      <h2 id="images-h">{t.nav.images} <span class="live">{live === 'live' ? t.live : live && t.reconnecting}</span></h2>
      <Alert error={error} />
      {message && <p class="note">{message}</p>}
      <Alert {...result} />
      <table id="images">
        <thead><tr><th>{t.cols.name}</th><th>{t.cols.kind}</th><th>{t.cols.phase}</th><th>{t.cols.progress}</th><th>{t.cols.size}</th><th>{t.cols.source}</th><th>{t.cols.os}</th><th>{t.cols.age}</th><th>{t.cols.actions}</th></tr></thead>
        <tbody>
          {items === null && <tr><td colspan="9">{t.loading}</td></tr>}
          {items?.length === 0 && !error && <tr><td colspan="9">{t.none}</td></tr>}
          {items?.map((it) => {
            const o = it.object;
            const why = o.status?.conditions?.find((c) => c.type === 'Ready')?.message;
            return (
              <tr key={it.kind + o.metadata.name} data-name={o.metadata.name} data-phase={phaseOf(o)}>
                <td>{o.metadata.name}</td><td>{it.kind}</td><td class="phase">{phaseOf(o)}{why && phaseOf(o) !== 'Ready' && <span class="why">{why}</span>}</td><td><Progress o={o} /></td>
                <td>{bytes(parseQuantity(o.status?.virtualSize))}</td><td>{o.status?.sourceType || Object.keys(o.spec?.source || {}).find((k) => k !== 'checksum')}</td>
                <td>{osLabels(o)}</td><td>{age(o.metadata.creationTimestamp)}</td>
                <td><Act id={`delete-${o.metadata.name}`} hint={it.actions?.delete} onClick={() => del(it)}>{t.delete}</Act></td>
              </tr>
            );
          })}
        </tbody>
      </table>
      <Running ns={ns} uploads={uploads} />
      <ImportForm ns={ns} hint={actions['create VirtualMachineImage']} />
      <UploadForm ns={ns} hint={actions['create VirtualMachineImage']} uploads={uploads} />
    </section>
  );
}

function parseQuantity(q) {
  if (!q) return undefined;
  const m = /^([0-9.]+)([KMGTPE]i?)?$/.exec(String(q));
  if (!m) return undefined;
  const mult = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15 };
  return parseFloat(m[1]) * (mult[m[2]] || 1);
}

function imageBody(name, storageClass, source) {
  const spec = { source };
  if (storageClass) spec.storageClassName = storageClass;
  return { apiVersion: imageKinds.VirtualMachineImage, kind: 'VirtualMachineImage', metadata: { name }, spec };
}

function Fieldset({ legend, hint, children }) {
  const denied = hint && !hint.allowed;
  return (
    <fieldset disabled={denied}>
      <legend>{legend}</legend>
      {denied && <p class="why" role="note">{t.notAllowed}{hint.reason}</p>}
      {children}
    </fieldset>
  );
}

function ImportForm({ ns, hint }) {
  const [f, setF] = useState({ name: '', url: '', sc: '' });
  const [result, setResult] = useState({});
  const submit = async (e) => {
    e.preventDefault();
    try {
      await api.create(ns, 'images', imageBody(f.name, f.sc, { http: f.url }));
      setResult({ ok: t.created('VirtualMachineImage', f.name) });
    } catch (err) {
      setResult({ error: err });
    }
  };
  return (
    <form onSubmit={submit} id="import-form">
      <Fieldset legend={t.importTitle} hint={hint}>
        <label>{t.nameLabel}<input name="name" value={f.name} onInput={(e) => setF({ ...f, name: e.target.value })} required pattern="[a-z0-9]([a-z0-9.\-]*[a-z0-9])?" /></label>
        <label>{t.urlLabel}<input name="url" type="url" value={f.url} onInput={(e) => setF({ ...f, url: e.target.value })} required /></label>
        <label>{t.storageClassLabel}<input name="storageClass" value={f.sc} onInput={(e) => setF({ ...f, sc: e.target.value })} /></label>
        <button type="submit">{t.importButton}</button>
        <Alert {...result} />
      </Fieldset>
    </form>
  );
}

function UploadForm({ ns, hint, uploads }) {
  const [f, setF] = useState({ name: '', sc: '', file: null });
  const [result, setResult] = useState({});
  const submit = async (e) => {
    e.preventDefault();
    try {
      await api.create(ns, 'uploads', imageBody(f.name, f.sc, { upload: {} }));
      uploads.start({ ns, kind: 'VirtualMachineImage', name: f.name, file: f.file });
      setResult({ ok: t.created('VirtualMachineImage', f.name) });
    } catch (err) {
      setResult({ error: err });
    }
  };
  return (
    <form onSubmit={submit} id="upload-form">
      <Fieldset legend={t.uploadTitle} hint={hint}>
        <label>{t.nameLabel}<input name="name" value={f.name} onInput={(e) => setF({ ...f, name: e.target.value })} required pattern="[a-z0-9]([a-z0-9.\-]*[a-z0-9])?" /></label>
        <label>{t.fileLabel}<input name="file" type="file" onChange={(e) => setF({ ...f, file: e.target.files[0] })} required /></label>
        <label>{t.storageClassLabel}<input name="storageClass" value={f.sc} onInput={(e) => setF({ ...f, sc: e.target.value })} /></label>
        <button type="submit">{t.uploadButton}</button>
        <Alert {...result} />
      </Fieldset>
    </form>
  );
}

function Disks({ ns }) {
  const { items, error, actions, live, message } = useList(ns, 'disks');
  const images = useList(ns, 'images');
  const [f, setF] = useState({ name: '', image: '', size: '' });
  const [result, setResult] = useState({});
  const submit = async (e) => {
    e.preventDefault();
    const source = f.image ? { image: { name: f.image, kind: 'VirtualMachineImage' } } : { blank: {} };
    const body = {
      apiVersion: 'diskvolume.kubesphere.io/v1alpha1', kind: 'DiskVolume', metadata: { name: f.name },
      spec: { source, accessModes: ['ReadWriteOnce'], resources: { requests: { storage: f.size } } },
    };
    try {
      await api.create(ns, 'disks', body);
      setResult({ ok: t.created('DiskVolume', f.name) });
    } catch (err) {
      setResult({ error: err });
    }
  };
  const del = async (it) => {
    if (!confirm(t.confirmDelete(it.kind, it.object.metadata.name))) return;
    try {
      await api.remove(ns, 'disks', it.object.metadata.name, it.kind);
      setResult({ ok: t.deleting(it.kind, it.object.metadata.name) });
    } catch (err) {
      setResult({ error: err });
    }
  };
  const source = (o) => o.spec?.virtualMachineImageName || o.spec?.source?.image?.name || (o.spec?.source?.snap && `snapshot ${o.spec.source.snap.name}`) || (o.spec?.source?.blank && 'blank') || '';
  return (
    <section aria-labelledby="disks-h">
      <h2 id="disks-h">{t.nav.disks} <span class="live">{live === 'live' ? t.live : live && t.reconnecting}</span></h2>
      <Alert error={error} />
      {message && <p class="note">{message}</p>}
      <Alert {...result} />
      <table id="disks">
        <thead><tr><th>{t.cols.name}</th><th>{t.cols.kind}</th><th>{t.cols.phase}</th><th>{t.cols.progress}</th><th>{t.cols.image}</th><th>{t.cols.strategy}</th><th>{t.cols.capacity}</th><th>{t.cols.age}</th><th>{t.cols.actions}</th></tr></thead>
        <tbody>
          {items === null && <tr><td colspan="9">{t.loading}</td></tr>}
          {items?.length === 0 && !error && <tr><td colspan="9">{t.none}</td></tr>}
          {items?.map((it) => {
            const o = it.object;
            const why = o.status?.conditions?.find((c) => c.type === 'Ready')?.message;
            return (
              <tr key={it.kind + o.metadata.name} data-name={o.metadata.name} data-phase={phaseOf(o)}>
                <td>{o.metadata.name}</td><td>{it.kind}</td><td class="phase">{phaseOf(o)}{why && phaseOf(o) !== 'Ready' && <span class="why">{why}</span>}</td><td><Progress o={o} /></td>
                <td>{source(o)}</td><td title={why}>{o.status?.cloneStrategy}</td><td>{o.status?.capacity}</td><td>{age(o.metadata.creationTimestamp)}</td>
                <td><Act id={`delete-${o.metadata.name}`} hint={it.actions?.delete} onClick={() => del(it)}>{t.delete}</Act></td>
              </tr>
            );
          })}
        </tbody>
      </table>
      <form onSubmit={submit} id="disk-form">
        <Fieldset legend={t.diskTitle} hint={actions['create DiskVolume']}>
          <label>{t.nameLabel}<input name="name" value={f.name} onInput={(e) => setF({ ...f, name: e.target.value })} required /></label>
          <label>{t.cols.image}
            <select name="image" value={f.image} onChange={(e) => setF({ ...f, image: e.target.value })}>
              <option value="">{t.blank}</option>
              {(images.items || []).filter((i) => i.kind === 'VirtualMachineImage').map((i) => <option value={i.object.metadata.name}>{i.object.metadata.name}</option>)}
            </select>
          </label>
          <label>{t.sizeLabel}<input name="size" value={f.size} onInput={(e) => setF({ ...f, size: e.target.value })} required pattern="[0-9]+(\.[0-9]+)?([KMGTPE]i?)?" /></label>
          <button type="submit">{t.makeDisk}</button>
        </Fieldset>
      </form>
    </section>
  );
}

// useUploads runs this tab's uploads and keeps their progress.
function useUploads() {
  const [state, setState] = useState({});
  const running = useRef({});
  const start = useCallback(({ ns, kind, name, file, algorithm }) => {
    const key = recordKey(ns, kind, name);
    const up = new Upload({
      ns, kind, name, file, algorithm,
      onProgress: (p) => setState((s) => ({ ...s, [key]: { ...s[key], ...p, name, file: file.name } })),
    });
    running.current[key] = up;
    setState((s) => ({ ...s, [key]: { name, file: file.name, sent: 0, total: file.size, phase: 'starting' } }));
    up.run().then(
      (st) => setState((s) => ({ ...s, [key]: { ...s[key], phase: 'done', sent: file.size, digest: st.digest, error: null } })),
      (e) => setState((s) => ({ ...s, [key]: { ...s[key], phase: e.reason === 'Cancelled' ? 'cancelled' : 'failed', error: e } })),
    );
  }, []);
  const cancel = useCallback(async (key, ns, name, kind) => {
    running.current[key]?.stop();
    localStorage.removeItem(key);
    try {
      await api.remove(ns, 'uploads', name, kind);
    } catch (e) {
      setState((s) => ({ ...s, [key]: { ...s[key], error: e } }));
    }
  }, []);
  return { state, start, cancel, running };
}

// Running shows this tab's uploads: progress, rate, where each stands, and cancel.
function Running({ ns, uploads }) {
  if (Object.keys(uploads.state).length === 0) return null;
  return (
    <ul id="uploads-running">
      {Object.entries(uploads.state).map(([key, u]) => (
        <li key={key} data-name={u.name} data-phase={u.phase}>
          <strong>{u.name}</strong> ({u.file}){' '}
          <progress max={u.total} value={u.sent} aria-label={u.name} />{' '}
          <span class="figures">{t.upload.of(bytes(u.sent), bytes(u.total))}{u.rate ? ` · ${t.upload.rate(bytes(u.rate))}` : ''}</span>{' '}
          <span class="uphase">{u.phase === 'retrying' ? t.upload.retrying(u.message) : u.phase === 'hashing' ? t.upload.hashingSent : u.phase === 'done' ? t.upload.done(u.digest) : u.phase}</span>
          {!['done', 'cancelled', 'failed'].includes(u.phase) && (
            <button type="button" onClick={() => uploads.cancel(key, ns, u.name, 'VirtualMachineImage')}>{t.upload.cancel}</button>
          )}
          <Alert error={u.error} />
        </li>
      ))}
    </ul>
  );
}

function Uploads({ ns, uploads }) {
  const server = useList(ns, 'uploads');
  const mine = records(ns);
  const pending = (server.items || []).filter((it) => phaseOf(it.object) === 'Pending');
  return (
    <section aria-labelledby="uploads-h">
      <h2 id="uploads-h">{t.nav.uploads}</h2>
      <Running ns={ns} uploads={uploads} />
      <h3>{t.upload.resumeTitle}</h3>
      <p class="help">{t.upload.resumeHelp}</p>
      <ul id="uploads-unfinished">
        {pending.filter((it) => !uploads.state[recordKey(ns, it.kind, it.object.metadata.name)]).map((it) => {
          const name = it.object.metadata.name;
          const rec = mine.find((r) => r.key === recordKey(ns, it.kind, name));
          return <Resume key={name} ns={ns} it={it} rec={rec} uploads={uploads} />;
        })}
      </ul>
    </section>
  );
}

function Resume({ ns, it, rec, uploads }) {
  const name = it.object.metadata.name;
  const [error, setError] = useState('');
  const [stored, setStored] = useState(null);
  useEffect(() => {
    api.call('GET', `projects/${ns}/uploads/${name}`, { query: { kind: it.kind } }).then((e) => setStored(e.data.offset), () => {});
  }, [ns, name]);
  const pick = (e) => {
    const file = e.target.files[0];
    if (!file) return;
    if (rec && (rec.file.name !== file.name || rec.file.size !== file.size)) {
      setError(t.upload.otherFile(rec.file.name, file.name));
      return;
    }
    const alg = (it.object.spec?.source?.checksum || 'sha256:').split(':')[0];
    uploads.start({ ns, kind: it.kind, name, file, algorithm: alg });
  };
  return (
    <li data-name={name}>
      <label>
        <strong>{name}</strong>{stored !== null && ` (${t.upload.stored(bytes(stored), rec ? bytes(rec.file.size) : '?')})`}: {rec ? t.upload.resumePick(rec.file.name) : t.upload.noRecord}
        <input type="file" name={`resume-${name}`} onChange={pick} />
      </label>
      {error && <p class="error" role="alert">{error}</p>}
    </li>
  );
}

function App() {
  const [who, setWho] = useState(null);
  const [checked, setChecked] = useState(false);
  const hash = useHash();
  const uploads = useUploads();
  const [ns, setNs] = useState(api.session().ns);
  useEffect(() => {
    if (!api.session().token) { setChecked(true); return; }
    api.whoami().then((w) => setWho(w.data), () => api.clearSession()).finally(() => setChecked(true));
  }, []);
  useEffect(() => {
    const busy = (e) => {
      if (Object.values(uploads.state).some((u) => !['done', 'cancelled', 'failed'].includes(u.phase))) e.preventDefault();
    };
    addEventListener('beforeunload', busy);
    return () => removeEventListener('beforeunload', busy);
  }, [uploads.state]);
  if (!checked) return <p>{t.loading}</p>;
  if (!who) return <Login onIn={(w) => { setWho(w); setNs(api.session().ns); }} />;
  const page = hash.split('/')[1] || 'images';
  return (
    <div>
      <header>
        <h1>{t.title}</h1>
        <nav aria-label="pages">
          {Object.entries(t.nav).map(([k, v]) => <a href={`#/${k}`} aria-current={page === k ? 'page' : undefined}>{v}</a>)}
        </nav>
        <span class="who">{t.signedInAs(who.username)} · {ns}</span>
        <button type="button" onClick={() => { api.clearSession(); setWho(null); }}>{t.signOut}</button>
      </header>
      <main>
        {page === 'images' && <Images ns={ns} uploads={uploads} />}
        {page === 'disks' && <Disks ns={ns} />}
        {page === 'uploads' && <Uploads ns={ns} uploads={uploads} />}
      </main>
    </div>
  );
}

render(<App />, document.getElementById('app'));
