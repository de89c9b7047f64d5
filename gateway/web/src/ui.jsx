// The pieces every page is made of: a live list with its refusals and actions, buttons that
// say why they are disabled, forms, and the figures' formats.
import { useState, useEffect, useCallback } from 'preact/hooks';
import { t } from './texts.js';
import * as api from './api.js';

export function bytes(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return '';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

export function parseQuantity(q) {
  if (!q) return undefined;
  const m = /^([0-9.]+)([KMGTPE]i?)?$/.exec(String(q));
  if (!m) return undefined;
  const mult = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15 };
  return parseFloat(m[1]) * (mult[m[2]] || 1);
}

export function age(ts) {
  if (!ts) return '';
  const s = Math.max(0, (Date.now() - Date.parse(ts)) / 1000);
  if (s < 120) return `${Math.floor(s)}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

export function phaseOf(o) {
  return o.status?.phase || 'Pending';
}

// Phase is an object's phase, and the reason of one not Ready.
export function Phase({ o }) {
  const why = o.status?.conditions?.find((c) => c.type === 'Ready')?.message;
  return <>{phaseOf(o)}{why && phaseOf(o) !== 'Ready' && <span class="why">{why}</span>}</>;
}

export function Progress({ o }) {
  const tr = o.status?.transfer;
  const parts = [];
  if (o.status?.progress) parts.push(o.status.progress);
  if (tr?.bytesPerSecond) parts.push(`${bytes(tr.bytesPerSecond)}/s`);
  return <span>{parts.join(' · ')}</span>;
}

// useList lists ns's resource and lists it again on every change the watch reports.
export function useList(ns, resource) {
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

export function Alert({ error, ok }) {
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
export function Act({ hint, onClick, children, id }) {
  const denied = hint && !hint.allowed;
  const rid = id && `${id}-why`;
  return (
    <span class="act">
      <button type="button" id={id} disabled={denied} title={denied ? hint.reason : ''} aria-describedby={denied ? rid : undefined} onClick={onClick}>{children}</button>
      {denied && <span class="why" id={rid}>{hint.reason}</span>}
    </span>
  );
}

// Fieldset is a form's body, disabled with the reason when the caller may not make its kind.
export function Fieldset({ legend, hint, children }) {
  const denied = hint && !hint.allowed;
  return (
    <fieldset disabled={denied}>
      <legend>{legend}</legend>
      {denied && <p class="why" role="note">{t.notAllowed}{hint.reason}</p>}
      {children}
    </fieldset>
  );
}

// useForm keeps a form's fields and its outcome; submit runs make(fields) and says what it made.
export function useForm(initial, make) {
  const [f, setF] = useState(initial);
  const [result, setResult] = useState({});
  // Each input changes the form as it is then, not as this render saw it: two inputs before
  // the next render both count.
  const field = (name) => ({ name, value: f[name], onInput: (e) => { const v = e.target.value; setF((cur) => ({ ...cur, [name]: v })); } });
  const submit = async (e) => {
    e.preventDefault();
    try {
      setResult({ ok: await make(f) });
    } catch (err) {
      setResult({ error: err });
    }
  };
  return { f, setF, field, submit, result };
}

// ListPage is a live list of ns's resource: its columns, each item's delete (with the hint's
// reason when disabled), the list's refusals, and the page's forms below.
export function ListPage({ ns, resource, title, id, list, columns, extra, children }) {
  const { items, error, live, message } = list;
  const [result, setResult] = useState({});
  const del = async (it) => {
    const name = it.object.metadata.name;
    if (!confirm(t.confirmDelete(it.kind, name))) return;
    try {
      await api.remove(ns, resource, name, it.kind);
      setResult({ ok: t.deleting(it.kind, name) });
    } catch (err) {
      setResult({ error: err });
    }
  };
  const span = columns.length + 1;
  return (
    <section aria-labelledby={`${id}-h`}>
      <h2 id={`${id}-h`}>{title} <span class="live">{live === 'live' ? t.live : live && t.reconnecting}</span></h2>
      <Alert error={error} />
      {message && <p class="note">{message}</p>}
      <Alert {...result} />
      <table id={id}>
        <thead><tr>{columns.map((c) => <th>{c.head}</th>)}<th>{t.cols.actions}</th></tr></thead>
        <tbody>
          {items === null && <tr><td colspan={span}>{t.loading}</td></tr>}
          {items?.length === 0 && !error && <tr><td colspan={span}>{t.none}</td></tr>}
          {items?.map((it) => {
            const o = it.object;
            return (
              <tr key={it.kind + o.metadata.name} data-name={o.metadata.name} data-phase={phaseOf(o)}>
                {columns.map((c) => <td>{c.cell(it, o)}</td>)}
                <td>
                  {extra?.(it, o)}
                  <Act id={`delete-${o.metadata.name}`} hint={it.actions?.delete} onClick={() => del(it)}>{t.delete}</Act>
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {children}
    </section>
  );
}

// name is the common first column.
export const nameColumn = { head: t.cols.name, cell: (it, o) => o.metadata.name };
export const ageColumn = { head: t.cols.age, cell: (it, o) => age(o.metadata.creationTimestamp) };

export const namePattern = '[a-z0-9]([a-z0-9.\\-]*[a-z0-9])?';
