// Uploads: this tab's uploads, and the namespace's unfinished ones, each resumed by choosing its
// file again.
import { useState, useEffect, useRef, useCallback } from 'preact/hooks';
import { t } from '../texts.js';
import * as api from '../api.js';
import { Upload, records, recordKey } from '../upload.js';
import { Alert, useList, phaseOf, bytes } from '../ui.jsx';

// useUploads runs this tab's uploads and keeps their progress.
export function useUploads() {
  const [state, setState] = useState({});
  const running = useRef({});
  const start = useCallback(({ ns, kind, name, file, algorithm }) => {
    const key = recordKey(ns, kind, name);
    const up = new Upload({
      ns, kind, name, file, algorithm,
      onProgress: (p) => setState((s) => ({ ...s, [key]: { ...s[key], ...p, name, kind, file: file.name } })),
    });
    running.current[key] = up;
    setState((s) => ({ ...s, [key]: { name, kind, file: file.name, sent: 0, total: file.size, phase: 'starting' } }));
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
export function Running({ ns, uploads }) {
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
            <button type="button" onClick={() => uploads.cancel(key, ns, u.name, u.kind)}>{t.upload.cancel}</button>
          )}
          <Alert error={u.error} />
        </li>
      ))}
    </ul>
  );
}

export function Uploads({ ns, uploads }) {
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
        <strong>{name}</strong>{stored !== null && ` (${t.upload.stored(bytes(stored), rec ? bytes(rec.file.size) : '?')})`}: {rec ? t.upload.resumePick(rec.file.name) : t.upload.noRecord}{' '}
        <input type="file" name={`resume-${name}`} onChange={pick} />
      </label>
      {error && <p class="error" role="alert">{error}</p>}
    </li>
  );
}

