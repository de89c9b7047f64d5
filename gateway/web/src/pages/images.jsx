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
  const imp = useForm({ name: '', url: '', sc: '' }, async (f) => {
    await api.create(ns, 'images', imageBody(f.name, f.sc, { http: f.url }));
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
          <label>{t.urlLabel}<input {...imp.field('url')} type="url" required /></label>
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
