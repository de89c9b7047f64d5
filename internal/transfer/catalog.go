package transfer

// ReasonDoc says what a reason means and what to do about it. Catalog is the one place these
// words live: `kubectl diskpipe` prints Advice after a failure, and docs/troubleshooting.md's
// tables are generated from it (hack/reasons, checked by make verify).
type ReasonDoc struct {
	// Reason as it appears in conditions, results and Events (several joined by " / ").
	Reason string
	// Transient: "yes", "no", or which of several is.
	Transient string
	// On names the objects a controller's reason appears on (empty for the data plane's).
	On      string
	Meaning string
	Advice  string
}

// Catalog holds the data plane's failure reasons (an importer's or exporter's result: the
// Reason constants) and then the reasons controllers give their conditions.
var Catalog = []ReasonDoc{
	{Reason: string(ReasonSourceNotFound), Transient: "no", Meaning: "404, no such object, bucket or tag, no file under `/disk/`, or a redirect loop", Advice: "fix the URL, bucket/object or tag and make the object again"},
	{Reason: string(ReasonSourceForbidden), Transient: "no", Meaning: "401/403, wrong S3 keys, registry authentication required; on the bundled store, a bucket of another namespace", Advice: "fix or add the credentials Secret the source names; on the bundled store, use your namespace's bucket or have its owner share it"},
	{Reason: string(ReasonSourceUnavailable), Transient: "yes", Meaning: "connection refused or reset, 5xx, a response that stalled", Advice: "wait; check that the server is up and reachable from the cluster"},
	{Reason: string(ReasonForbiddenDestination), Transient: "no", Meaning: "the source's URL, a redirect or its DNS answer points at loopback, link-local (cloud metadata), the cluster's pod or service networks (`importer.clusterCIDRs`), or a redirect leaves http(s)", Advice: "use a public address; for a mirror you trust inside the cluster, add its address, CIDR or host name to the chart's `importer.allowedDestinations`"},
	{Reason: string(ReasonTLSError), Transient: "no", Meaning: "the server's certificate is not trusted", Advice: "give its CA bundle (`certConfigMap`)"},
	{Reason: string(ReasonChecksumMismatch), Transient: "no", Meaning: "the downloaded bytes (or a registry layer) differ from the digest", Advice: "the bytes do not match `checksum`: fix it, or find out who changed the source"},
	{Reason: string(ReasonUnsigned), Transient: "no", Meaning: "`registry.signature` is set and the image's digest has no cosign signature", Advice: "sign it: `cosign sign --key cosign.key <image>`"},
	{Reason: string(ReasonSignatureInvalid), Transient: "no", Meaning: "the image's signatures are by other keys (or unreadable)", Advice: "check `publicKeySecretRef`'s `cosign.pub`, or who signed the image"},
	{Reason: string(ReasonSignedDigestMismatch), Transient: "no", Meaning: "a signature by the key, stored for this digest, signs another digest: the image was replaced after it was signed", Advice: "find out who changed the tag; sign the image you trust"},
	{Reason: string(ReasonBackingFile), Transient: "no", Meaning: "qcow2 with a backing file, vmdk/vpc/vdi/vhdx with a parent", Advice: "flatten it: `qemu-img convert -O qcow2 in out`"},
	{Reason: string(ReasonEncrypted), Transient: "no", Meaning: "an encrypted qcow2", Advice: "decrypt it with qemu-img first"},
	{Reason: string(ReasonUnsupportedFormat), Transient: "no", Meaning: "external data file, unknown qcow2 features, a vmdk whose data is in other files, a vhdx with a log to replay", Advice: "convert it to one qcow2 or raw file with qemu-img"},
	{Reason: string(ReasonMalformedImage), Transient: "no", Meaning: "the image is damaged, or claims tables or windows larger than diskpipe reads", Advice: "check it with `qemu-img check`; download or upload it again"},
	{Reason: string(ReasonTruncatedImage), Transient: "no", Meaning: "the image is cut short", Advice: "download or upload it again"},
	{Reason: string(ReasonNeedsRandomAccess), Transient: "no", Meaning: "a monolithicSparse vmdk, vhdx, vpc or vdi (or an unusually laid-out qcow2) from a server without Range, or compressed with gz/xz/zst", Advice: "serve it with Range support (any S3 store, nginx, the bundled store), or convert it to qcow2 or a streamOptimized vmdk"},
	{Reason: string(ReasonTooLarge), Transient: "no", Meaning: "the disk is larger than the volume less its filesystem overhead", Advice: "request a larger size (the message names the least that fits)"},
	{Reason: string(ReasonNoRevision), Transient: "no", Meaning: "a scheduled image's check: the server gives no ETag or Last-Modified", Advice: "serve it from a server that does (nginx, any S3 store, the bundled store)"},
	{Reason: string(ReasonBrokenChain), Transient: "no", Meaning: "the layers of a backup chain do not fit together: a layer missing from the index or the store, one repeated or out of order, a disk smaller than its predecessor's, an index whose sizes or checkpoints disagree with its objects", Advice: "restore a point the index lists, or give the layers full backup first; the message names the layer"},
	{Reason: string(ReasonInvalidArgument), Transient: "no", Meaning: "a malformed URL, header, checksum or bucket name", Advice: "fix the spec; the message names the value"},
	{Reason: string(ReasonTargetError), Transient: "no", Meaning: "the volume or the object store is full, or cannot be written", Advice: "free space or request more"},
	{Reason: string(ReasonTargetNotFound), Transient: "no", Meaning: "the export's bucket does not exist", Advice: "create the bucket"},
	{Reason: string(ReasonCredentialsNotFound), Transient: "yes", Meaning: "the Secret that `secretRef` names (S3 keys) does not exist in the object's namespace, or has no `accessKeyId` and `secretAccessKey`", Advice: "create it; the pod is tried again"},
	{Reason: string(ReasonTargetForbidden), Transient: "no", Meaning: "the object store refused the export's credentials; on the bundled store, a bucket of another namespace", Advice: "fix the credentials Secret; on the bundled store, export to a bucket of your namespace"},
	{Reason: string(ReasonTargetUnavailable), Transient: "yes", Meaning: "the object store could not be reached", Advice: "check the store; the export is retried"},
	{Reason: string(ReasonCancelled), Transient: "yes", Meaning: "the pod was stopped (deleted, evicted, its node drained) before it finished", Advice: "nothing: the next attempt goes on"},
	{Reason: string(ReasonIdle), Transient: "yes", Meaning: "a clone source (a copy across namespaces or nodes) was not read for its idle timeout (10 min): the copy's importer did not start or stopped reading; or it served an hour more than its whole disk takes at 1 MiB/s", Advice: "nothing: the copy waits as long again, leaving the slot to other copies, then starts its clone source again; check why its importer pod did not run (quota, scheduling)"},
	{Reason: string(ReasonInternal), Transient: "yes", Meaning: "a failure diskpipe could not classify, or a pod that ended without a result", Advice: "read the importer pod's log; report it if it repeats"},

	{Reason: "SourceNotFound / SourceNotReady / SourceDeleting", On: "disks, copied images, images of a KubeVirt export", Meaning: "the image, disk, PVC or snapshot read from is missing, not Ready yet, or being deleted; a KubeVirt VirtualMachineExport's server has no ready pod yet", Advice: "create it or wait; the object goes on by itself"},
	{Reason: "SnapshotNotFound", On: "DiskVolume `snap`", Meaning: "the VolumeSnapshot does not exist", Advice: "create it"},
	{Reason: "ObjectStoreNotConfigured", On: "`objectStore`/`upload` images, exports", Meaning: "the installation has no bundled store", Advice: "use an `s3` source or destination"},
	{Reason: "WaitingForUpload", On: "`upload` images", Meaning: "the upload proxy has not stored the whole image yet", Advice: "upload it ([uploads](uploads.md))"},
	{Reason: "ObjectStoreUnavailable", On: "`objectStore` images, exports to the bundled store", Meaning: "the manager could not reach the bundled store to act as the namespace (or make its account)", Advice: "wait; check the store's pod. No pod starts until the store answers"},
	{Reason: "CloneSourceInUse", On: "images (and DataVolumes) copied from a PVC or a DiskVolume", Meaning: "a pod that is not diskpipe's mounts the PVC read-write (a running VM's launcher): a disk copied while it is written is not one to trust, so the copy waits, as CDI's does, and begins once no such pod is left; read-only mounts and finished pods do not count", Advice: "stop the VM, or copy a snapshot of the disk (`source.snapshot`)"},
	{Reason: "InUseWithoutSnapshot", On: "exports", Meaning: "the PVC is mounted by a running pod and cannot be snapshotted: its driver has no VolumeSnapshotClass, or its class names one that is not the driver's", Advice: "stop the VM, install a VolumeSnapshotClass, or name one of the driver's (docs/disks.md)"},
	{Reason: "WaitingForBackup", On: "exports with `backup`", Meaning: "an older backup of the same index has not finished: backups of one index run one at a time, as each rewrites the index", Advice: "wait"},
	{Reason: "WaitingForSnapshot", On: "exports", Meaning: "the in-use PVC's snapshot is being taken", Advice: "wait"},
	{Reason: "InvalidHardware", On: "VirtualMachines", Meaning: "`spec.hardware` is not a KubeVirt VirtualMachineInstance spec", Advice: "fix the named field"},
	{Reason: "WaitingForDisks / DiskFailed", On: "VirtualMachines", Meaning: "a DiskVolume is not Ready yet, or failed", Advice: "wait, or read that DiskVolume's reason"},
	{Reason: "KubeVirtRefused", On: "VirtualMachines", Meaning: "KubeVirt (its webhook) refused the VirtualMachine made of `spec.hardware`; the message is KubeVirt's", Advice: "fix the field it names (it is tried again each minute, for a KubeVirt setting changed meanwhile)"},
	{Reason: "WaitingForKubeVirt", On: "VirtualMachines", Meaning: "KubeVirt is not installed (no CRD `virtualmachines.kubevirt.io`); the disks are made meanwhile", Advice: "install KubeVirt: the KubeVirt VM is made within seconds of its CRD"},
	{Reason: "WaitingForCloneSource", On: "cross-namespace copies", Meaning: "the clone-source pod in the source's namespace is not serving yet, or as many copies of the source (4, 2 for one namespace) are served, or restored from its snapshot, as may be at once, or the copy's own volume cannot take it yet (its storage class does not exist, or it is not bound)", Advice: "wait; check that pod, or the volume's storage class"},
	{Reason: "NoStorageClass", On: "images copying a VolumeSnapshot", Meaning: "the snapshot's source claim is gone and no StorageClass has the provisioner of the snapshot's driver, so it cannot be restored for the copy", Advice: "make a StorageClass of that provisioner"},
	{Reason: "WaitingForBinding", On: "CSI clones, restores", Meaning: "the storage has not bound the PVC yet; a restore also waits for the image's golden VolumeSnapshot (its golden PVC's name and `-golden`) to be ready",
		Advice: "check the CSI driver; `kubectl get volumesnapshot -l diskpipe.io/golden=true -o yaml` shows each golden snapshot's `readyToUse` and the snapshotter's `error` (with an error, the disks made after it are CSI clones)"},
	{Reason: "HandingOver", On: "disks an importer pod fills", Meaning: "the disk is whole in diskpipe's prime PVC; its volume is being bound to the disk's PVC (which stays Pending until then, so no VM boots a half-written disk)", Advice: "wait; if it lasts, check kube-controller-manager (its PV controller binds it)"},
	{Reason: "WaitingForFirstConsumer", On: "Ready disks", Meaning: "the volume is provisioned when the VM's pod is scheduled", Advice: "nothing"},
	{Reason: "WaitingForReplica", On: "disks of node-local images", Meaning: "the image's replica on the disk's node is being copied there (once per node); the disk is a clone of it next", Advice: "wait; the replica's DiskVolume (`replica-<image>-<hash>`) shows the copy"},
	{Reason: "SourceUnreachable", On: "disks of node-local images", Meaning: "the disk's node was fixed before (a replica, a populator's disk) and the storage cannot clone or restore the image's volume there", Advice: "make the disk as a PVC whose dataSourceRef is the image, or run the VM where the image is"},
	{Reason: "NodeLost", On: "Ready disks; Ready images (condition `GoldenVolume`)", Meaning: "the disk's (or the image's golden) volume is on a node deleted from the cluster: a node-local volume's data is gone with it (an image deletes its replica there after 10 minutes, and stays Ready while replicas on other nodes hold its bytes)", Advice: "bring the node back (the disk is Ready again), or delete the disk and make it again; an image with no Ready replica left is imported again"},
	{Reason: "WaitingForClones", On: "images being deleted", Meaning: "disks are still being cloned from the image", Advice: "wait, or delete those disks"},
	{Reason: "WaitingForRevision", On: "scheduled images", Meaning: "no revision is imported yet (the first check or import is under way)", Advice: "wait"},
	{Reason: "InvalidSchedule", On: "scheduled images", Meaning: "`spec.schedule.cron` does not parse", Advice: "fix it"},
	{Reason: "CheckTimedOut", On: "scheduled images", Meaning: "a check pod did not finish in 10 minutes", Advice: "check that the source answers quickly; the next check tries again"},
	{Reason: "WaitingForRevisions", On: "scheduled images being deleted", Meaning: "the images of its revisions are being deleted", Advice: "wait"},
	{Reason: "TooSmall", On: "disks", Meaning: "the requested size is smaller than the source", Advice: "ask for at least the source's size"},
	{Reason: "SizeRequired", On: "images, blank disks", Meaning: "the size cannot be known without importing (compressed raw), or a blank disk has none", Advice: "set `resources.requests.storage`"},
	{Reason: "NameTaken", On: "images, disks, exports", Meaning: "an object of a child's name (a PVC, a pod, a snapshot) exists that diskpipe did not make for this object", Advice: "rename the object, or delete that one and diskpipe makes its own"},
	{Reason: "NameTerminating", On: "images, disks, exports, VirtualMachines, DataVolumes", Meaning: "an object of a child's name that diskpipe did not make for this object is being deleted: most often the child of an earlier object of the same name, deleted and made again before its PVC (still used by a pod), snapshot or KubeVirt VM was gone", Advice: "wait: the child is made once the name is free; `kubectl get` the named object shows what holds it (its finalizers)"},
	{Reason: "VolumeNotBound", On: "disks", Meaning: "the volume a disk would be handed is not bound to diskpipe's claim that filled it (a claim named another volume)", Advice: "delete the disk and make it again; the message names the claim the volume is bound to"},
	{Reason: "Retrying", On: "all", Meaning: "an attempt failed transiently; the next one comes after 2, 4, 8 … s (at most 5 min)", Advice: "nothing, or read the message"},
}

// Advice is what to do about reason ("" when the catalog does not know it).
func Advice(reason string) string {
	for _, d := range Catalog {
		if d.Reason == reason {
			return d.Advice
		}
	}
	return ""
}
