// Disks: DiskVolumes and VirtualMachinePvcs, made from an image, a snapshot, or blank.
import { t } from '../texts.js';
import * as api from '../api.js';
import { ListPage, Fieldset, Alert, Phase, Progress, useList, useForm, nameColumn, ageColumn, namePattern } from '../ui.jsx';

const sourceOf = (o) => o.spec?.virtualMachineImageName || o.spec?.source?.image?.name
  || (o.spec?.source?.snap && `${t.cols.snapshot} ${o.spec.source.snap.name}`) || (o.spec?.source?.blank && t.blankShort) || '';

const columns = [
  nameColumn,
  { head: t.cols.kind, cell: (it) => it.kind },
  { head: t.cols.phase, cell: (it, o) => <Phase o={o} /> },
  { head: t.cols.progress, cell: (it, o) => <Progress o={o} /> },
  { head: t.cols.source, cell: (it, o) => sourceOf(o) },
  { head: t.cols.strategy, cell: (it, o) => o.status?.cloneStrategy },
  { head: t.cols.capacity, cell: (it, o) => o.status?.capacity },
  ageColumn,
];

// sources: what a disk can be made from, as the form's options ("image:NAME", "snap:NAME").
function sourceBody(v) {
  const [kind, name] = [v.slice(0, v.indexOf(':')), v.slice(v.indexOf(':') + 1)];
  if (kind === 'image') return { image: { name, kind: 'VirtualMachineImage' } };
  if (kind === 'snap') return { snap: { name } };
  return { blank: {} };
}

export function Disks({ ns }) {
  const list = useList(ns, 'disks');
  const images = useList(ns, 'images');
  const snaps = useList(ns, 'snapshots');
  const form = useForm({ name: '', source: '', size: '' }, async (f) => {
    await api.create(ns, 'disks', {
      apiVersion: 'diskvolume.kubesphere.io/v1alpha1', kind: 'DiskVolume', metadata: { name: f.name },
      spec: { source: sourceBody(f.source), accessModes: ['ReadWriteOnce'], resources: { requests: { storage: f.size } } },
    });
    return t.created('DiskVolume', f.name);
  });
  return (
    <ListPage ns={ns} resource="disks" title={t.nav.disks} id="disks" list={list} columns={columns}>
      <form onSubmit={form.submit} id="disk-form">
        <Fieldset legend={t.diskTitle} hint={list.actions['create DiskVolume']}>
          <label>{t.nameLabel}<input {...form.field('name')} required pattern={namePattern} /></label>
          <label>{t.cols.source}
            <select name="source" value={form.f.source} onChange={(e) => form.setF({ ...form.f, source: e.target.value })}>
              <option value="">{t.blank}</option>
              {(images.items || []).filter((i) => i.kind === 'VirtualMachineImage').map((i) => (
                <option value={`image:${i.object.metadata.name}`}>{t.cols.image} {i.object.metadata.name}</option>))}
              {(snaps.items || []).map((i) => <option value={`snap:${i.object.metadata.name}`}>{t.cols.snapshot} {i.object.metadata.name}</option>)}
            </select>
          </label>
          <label>{t.sizeLabel}<input {...form.field('size')} required pattern="[0-9]+(\.[0-9]+)?([KMGTPE]i?)?" /></label>
          <button type="submit">{t.makeDisk}</button>
          <Alert {...form.result} />
        </Fieldset>
      </form>
    </ListPage>
  );
}

// DiskSelect picks one of ns's disks for a form field, by its PVC (the disks that have one).
export function DiskSelect({ ns, form, field }) {
  const disks = useList(ns, 'disks');
  const claims = (disks.items || []).filter((i) => i.object.status?.pvcName);
  return (
    <label>{t.cols.disk}
      <select name={field} value={form.f[field]} onChange={(e) => form.setF({ ...form.f, [field]: e.target.value })} required>
        <option value="" />
        {claims.map((i) => <option value={i.object.status.pvcName}>{i.object.metadata.name}</option>)}
      </select>
    </label>
  );
}
