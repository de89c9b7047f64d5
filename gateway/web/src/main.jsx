// The console: sign-in, then the images, disks, snapshots, exports and uploads of one
// namespace, each list kept live by the gateway's watch. Routes are the page's hash
// (#/images), so the page works under any path a proxy serves it at.
import { render } from 'preact';
import { useState, useEffect } from 'preact/hooks';
import { t } from './texts.js';
import * as api from './api.js';
import { Alert } from './ui.jsx';
import { Images } from './pages/images.jsx';
import { Disks } from './pages/disks.jsx';
import { Snapshots } from './pages/snapshots.jsx';
import { Exports } from './pages/exports.jsx';
import { Uploads, useUploads } from './pages/uploads.jsx';
import './style.css';

function useHash() {
  const [hash, setHash] = useState(location.hash || '#/images');
  useEffect(() => {
    const on = () => setHash(location.hash || '#/images');
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return hash;
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

function App() {
  const [who, setWho] = useState(null);
  const [checked, setChecked] = useState(false);
  const hash = useHash();
  const uploads = useUploads();
  const [ns, setNs] = useState(api.session().ns);
  const [cluster, setCluster] = useState(sessionStorage.getItem('diskpipe.cluster') || 'host');
  useEffect(() => {
    // With no token of the page's, a console that frames the pages may have signed the
    // user in (its server adding their token): ask. A page of its own shows the sign-in.
    const console = !api.session().token;
    if (console && window.parent === window) { setChecked(true); return; }
    api.whoami().then((w) => setWho({ ...w.data, console }), () => api.clearSession()).finally(() => setChecked(true));
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
        {who.clusters?.length > 1 && (
          <label class="cluster">{t.clusterLabel}{' '}
            <select id="cluster" value={cluster} onChange={(e) => { api.setCluster(e.target.value); setCluster(e.target.value); }}>
              {who.clusters.map((c) => <option value={c}>{c}</option>)}
            </select>
          </label>
        )}
        <span class="who">{t.signedInAs(who.username)} · {ns}</span>
        {!who.console && <button type="button" onClick={() => { api.clearSession(); setWho(null); }}>{t.signOut}</button>}
      </header>
      <main key={cluster}>
        {page === 'images' && <Images ns={ns} uploads={uploads} />}
        {page === 'disks' && <Disks ns={ns} />}
        {page === 'snapshots' && <Snapshots ns={ns} />}
        {page === 'exports' && <Exports ns={ns} />}
        {page === 'uploads' && <Uploads ns={ns} uploads={uploads} />}
      </main>
    </div>
  );
}

render(<App />, document.getElementById('app'));
