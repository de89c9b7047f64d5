// Exports: a disk converted to qcow2 into the bundled store, and its download link.
import { useState } from 'preact/hooks';
import { t } from '../texts.js';
import * as api from '../api.js';
import { ListPage, Fieldset, Alert, Phase, Progress, useList, useForm, bytes, parseQuantity, nameColumn, ageColumn, namePattern } from '../ui.jsx';
import { DiskSelect } from './disks.jsx';

// Download asks the gateway for the export's link (read as the caller from its Secret), then
// offers it: the browser fetches the object from the store itself.
function Download({ ns, o }) {
  const [link, setLink] = useState(null);
  const [error, setError] = useState(null);
  if (o.status?.phase !== 'Ready') return null;
  const name = o.metadata.name;
  const get = async () => {
    try {
      setLink((await api.call('GET', `projects/${ns}/exports/${name}/download`)).data.url);
    } catch (e) {
      setError(e);
    }
  };
  return (
    <span class="act">
      {link ? <a id={`download-${name}`} href={link} rel="noreferrer">{t.download}</a>
        : <button type="button" id={`link-${name}`} onClick={get}>{t.downloadLink}</button>}
      <Alert error={error} />
    </span>
  );
}

export function Exports({ ns }) {
  const list = useList(ns, 'exports');
  const columns = [
    nameColumn,
    { head: t.cols.disk, cell: (it, o) => o.spec?.pvcName },
    { head: t.cols.phase, cell: (it, o) => <Phase o={o} /> },
    { head: t.cols.progress, cell: (it, o) => <Progress o={o} /> },
    { head: t.cols.size, cell: (it, o) => bytes(parseQuantity(o.status?.storedSize)) },
    { head: t.upload.digest, cell: (it, o) => <code>{o.status?.digest}</code> },
    ageColumn,
  ];
  // The bundled store's bucket names are the whole store's: one named for the namespace is
  // its own, where a plain "exports" would be whichever namespace made it first.
  const form = useForm({ name: '', pvc: '', bucket: `${ns}-exports`.slice(0, 63), object: '' }, async (f) => {
    await api.create(ns, 'exports', {
      apiVersion: 'hypercloud.tmaxanc.com/v1alpha1', kind: 'VirtualMachineVolumeExport', metadata: { name: f.name },
      spec: { pvcName: f.pvc, objectStore: { bucketName: f.bucket, objectName: f.object || `${f.name}.qcow2` } },
    });
    return t.created('VirtualMachineVolumeExport', f.name);
  });
  return (
    <ListPage ns={ns} resource="exports" title={t.nav.exports} id="exports" list={list} columns={columns} extra={(it, o) => <Download ns={ns} o={o} />}>
      <form onSubmit={form.submit} id="export-form">
        <Fieldset legend={t.exportTitle} hint={list.actions['create VirtualMachineVolumeExport']}>
          <label>{t.nameLabel}<input {...form.field('name')} required pattern={namePattern} /></label>
          <DiskSelect ns={ns} form={form} field="pvc" />
          <label>{t.bucketLabel}<input {...form.field('bucket')} required /></label>
          <label>{t.objectLabel}<input {...form.field('object')} placeholder={t.objectDefault} /></label>
          <button type="submit">{t.exportButton}</button>
          <Alert {...form.result} />
        </Fieldset>
      </form>
    </ListPage>
  );
}
