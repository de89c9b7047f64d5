// Snapshots of disks: taken of a disk's PVC, restored by making a disk from one (Disks).
import { t } from '../texts.js';
import * as api from '../api.js';
import { ListPage, Fieldset, Alert, useList, useForm, nameColumn, ageColumn, namePattern } from '../ui.jsx';
import { DiskSelect } from './disks.jsx';

const columns = [
  nameColumn,
  { head: t.cols.disk, cell: (it, o) => o.spec?.source?.persistentVolumeClaimName },
  { head: t.cols.ready, cell: (it, o) => (o.status?.readyToUse ? t.yes : t.no) },
  { head: t.cols.size, cell: (it, o) => o.status?.restoreSize },
  { head: t.cols.class, cell: (it, o) => o.spec?.volumeSnapshotClassName },
  ageColumn,
];

// goldenLabel marks a golden image's own snapshot, which disks are restored from: diskpipe's,
// not the user's to take or delete, so the page leaves it out (the apiserver still decides).
const goldenLabel = 'diskpipe.io/golden-image';

export function Snapshots({ ns }) {
  const all = useList(ns, 'snapshots');
  const list = { ...all, items: all.items && all.items.filter((i) => !i.object.metadata.labels?.[goldenLabel]) };
  const form = useForm({ name: '', pvc: '', cls: '' }, async (f) => {
    const spec = { source: { persistentVolumeClaimName: f.pvc } };
    if (f.cls) spec.volumeSnapshotClassName = f.cls;
    await api.create(ns, 'snapshots', { apiVersion: 'snapshot.storage.k8s.io/v1', kind: 'VolumeSnapshot', metadata: { name: f.name }, spec });
    return t.created('VolumeSnapshot', f.name);
  });
  return (
    <ListPage ns={ns} resource="snapshots" title={t.nav.snapshots} id="snapshots" list={list} columns={columns}>
      <form onSubmit={form.submit} id="snapshot-form">
        <Fieldset legend={t.snapshotTitle} hint={list.actions['create VolumeSnapshot']}>
          <label>{t.nameLabel}<input {...form.field('name')} required pattern={namePattern} /></label>
          <DiskSelect ns={ns} form={form} field="pvc" />
          <label>{t.snapshotClassLabel}<input {...form.field('cls')} /></label>
          <button type="submit">{t.takeSnapshot}</button>
          <Alert {...form.result} />
        </Fieldset>
      </form>
    </ListPage>
  );
}
