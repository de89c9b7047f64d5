// Images: golden images and templates, imported from a URL or uploaded from a file.
import { t } from '../texts.js';
import * as api from '../api.js';
import { ListPage, Fieldset, Alert, Phase, Progress, useList, useForm, bytes, parseQuantity, nameColumn, ageColumn, namePattern } from '../ui.jsx';
import { Running } from './uploads.jsx';

function osLabels(o) {
  const l = o.metadata?.labels || {};
  return Object.entries(l).filter(([k]) => /(^|[./])os([./-]|$)/.test(k)).map(([k, v]) => `${k.split('/').pop()}=${v}`).join(', ');
}

function imageBody(name, storageClass, source) {
  const spec = { source };
  if (storageClass) spec.storageClassName = storageClass;
  return { apiVersion: 'hypercloud.tmaxanc.com/v1alpha1', kind: 'VirtualMachineImage', metadata: { name }, spec };
}

// importSource is the image's source of the import form: a URL, a container registry, the
// bundled store, or another S3 store.
function importSource(f) {
  const secret = f.secret ? { secretRef: f.secret } : {};
  switch (f.kind) {
    case 'registry':
      return { registry: { url: f.url.startsWith('docker://') ? f.url : `docker://${f.url}`, ...secret } };
    case 'objectStore':
      return { objectStore: { bucketName: f.bucket, objectName: f.object } };
    case 's3':
      return { s3: { endpoint: f.url, bucketName: f.bucket, objectName: f.object, ...secret } };
  }
  return { http: f.url };
}

const columns = [
  nameColumn,
  { head: t.cols.kind, cell: (it) => it.kind },
  { head: t.cols.phase, cell: (it, o) => <Phase o={o} /> },
  { head: t.cols.progress, cell: (it, o) => <Progress o={o} /> },
  { head: t.cols.size, cell: (it, o) => bytes(parseQuantity(o.status?.virtualSize)) },
  { head: t.cols.source, cell: (it, o) => o.status?.sourceType || Object.keys(o.spec?.source || {}).find((k) => k !== 'checksum') },
  { head: t.cols.os, cell: (it, o) => osLabels(o) },
  ageColumn,
];

export function Images({ ns, uploads }) {
  const list = useList(ns, 'images');
  const hint = list.actions['create VirtualMachineImage'];
  const imp = useForm({ name: '', kind: 'http', url: '', bucket: '', object: '', secret: '', sc: '' }, async (f) => {
    await api.create(ns, 'images', imageBody(f.name, f.sc, importSource(f)));
    return t.created('VirtualMachineImage', f.name);
  });
  const up = useForm({ name: '', sc: '', file: null }, async (f) => {
    await api.create(ns, 'uploads', imageBody(f.name, f.sc, { upload: {} }));
    uploads.start({ ns, kind: 'VirtualMachineImage', name: f.name, file: f.file });
    return t.created('VirtualMachineImage', f.name);
  });
  return (
    <ListPage ns={ns} resource="images" title={t.nav.images} id="images" list={list} columns={columns}>
      <Running ns={ns} uploads={uploads} />
      <form onSubmit={imp.submit} id="import-form">
        <Fieldset legend={t.importTitle} hint={hint}>
          <label>{t.nameLabel}<input {...imp.field('name')} required pattern={namePattern} /></label>
          <label>{t.sourceKindLabel}
            <select name="kind" value={imp.f.kind} onChange={(e) => imp.setF({ ...imp.f, kind: e.target.value })}>
              {Object.entries(t.sourceKinds).map(([k, v]) => <option value={k}>{v}</option>)}
            </select>
          </label>
          {imp.f.kind !== 'objectStore' && <label>{t.sourceURL[imp.f.kind]}<input {...imp.field('url')} required /></label>}
          {(imp.f.kind === 's3' || imp.f.kind === 'objectStore') && <>
            <label>{t.bucketLabel}<input {...imp.field('bucket')} required /></label>
            <label>{t.objectLabel}<input {...imp.field('object')} required /></label>
          </>}
          {(imp.f.kind === 's3' || imp.f.kind === 'registry') && <label>{t.secretLabel}<input {...imp.field('secret')} /></label>}
          <label>{t.storageClassLabel}<input {...imp.field('sc')} /></label>
          <button type="submit">{t.importButton}</button>
          <Alert {...imp.result} />
        </Fieldset>
      </form>
      <form onSubmit={up.submit} id="upload-form">
        <Fieldset legend={t.uploadTitle} hint={hint}>
          <label>{t.nameLabel}<input {...up.field('name')} required pattern={namePattern} /></label>
          <label>{t.fileLabel}<input name="file" type="file" onChange={(e) => up.setF({ ...up.f, file: e.target.files[0] })} required /></label>
          <label>{t.storageClassLabel}<input {...up.field('sc')} /></label>
          <button type="submit">{t.uploadButton}</button>
          <Alert {...up.result} />
        </Fieldset>
      </form>
    </ListPage>
  );
}
