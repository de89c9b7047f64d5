package cdi

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// What CDI knows of storage it has not been told about: the claim properties each provisioner
// offers (access and volume modes), as CDI's StorageProfile controller ships them
// (pkg/storagecapabilities), keyed by the provisioner and, for some, a parameter of the class.
// A DataVolume's spec.storage is completed from them: RBD's RWX Block first, which KubeVirt's
// live migration needs. A provisioner not listed gets RWO Filesystem, which every CSI driver
// offers (CDI leaves it empty, and refuses such DataVolumes until an administrator writes the
// profile's spec).

type capability struct {
	mode   corev1.PersistentVolumeAccessMode
	volume corev1.PersistentVolumeMode
}

var (
	rwxBlock = capability{corev1.ReadWriteMany, corev1.PersistentVolumeBlock}
	rwoBlock = capability{corev1.ReadWriteOnce, corev1.PersistentVolumeBlock}
	roxBlock = capability{corev1.ReadOnlyMany, corev1.PersistentVolumeBlock}
	rwxFS    = capability{corev1.ReadWriteMany, corev1.PersistentVolumeFilesystem}
	rwoFS    = capability{corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem}
	roxFS    = capability{corev1.ReadOnlyMany, corev1.PersistentVolumeFilesystem}

	capsRBD   = []capability{rwxBlock, rwoBlock, rwoFS}
	capsABRF  = []capability{rwxBlock, rwoBlock, rwoFS, roxBlock, roxFS}
	capsPMax  = []capability{rwxBlock, rwoBlock, rwoFS, roxBlock}
	capsAllFS = []capability{rwxFS, rwoFS, roxFS}
	capsRWOBF = []capability{rwoBlock, rwoFS}
	capsShare = []capability{rwxFS, rwoFS}
)

// capabilities are CDI's claim properties by provisioner key (provisionerKey).
var capabilities = map[string][]capability{
	"kubevirt.io.hostpath-provisioner": {rwoFS}, "kubevirt.io.hostpath-provisioner/overlay": {rwxFS},
	"kubevirt.io/hostpath-provisioner": {rwoFS}, "k8s.io/minikube-hostpath": {rwoFS}, "rancher.io/local-path": {rwoFS},
	"nfs.csi.k8s.io": {rwxFS}, "k8s-sigs.io/nfs-subdir-external-provisioner": {rwxFS},
	"kubernetes.io/rbd": capsRBD, "rbd.csi.ceph.com": capsRBD, "rook-ceph.rbd.csi.ceph.com": capsRBD, "openshift-storage.rbd.csi.ceph.com": capsRBD,
	"cephfs.csi.ceph.com": capsShare, "rook-ceph.cephfs.csi.ceph.com": capsShare, "openshift-storage.cephfs.csi.ceph.com": capsShare,
	"linstor.csi.linbit.com": capsABRF, "csi-unity.dellemc.com": capsABRF, "csi-unity.dellemc.com/nfs": capsAllFS,
	"csi-vxflexos.dellemc.com": capsABRF, "csi-vxflexos.dellemc.com/nfs": capsAllFS, "csi-isilon.dellemc.com": capsAllFS,
	"csi-powermax.dellemc.com": capsPMax, "csi-powermax.dellemc.com/nfs": capsAllFS,
	"csi-powerstore.dellemc.com": capsPMax, "csi-powerstore.dellemc.com/nfs": capsAllFS,
	"kubernetes.io/storageos": {rwoFS}, "storageos": {rwoFS},
	"kubernetes.io/aws-ebs": {rwoBlock}, "ebs.csi.aws.com": {rwoBlock}, "ebs.csi.aws.com/io1": {rwoBlock}, "ebs.csi.aws.com/gp": {rwoBlock},
	"ebs.csi.aws.com/io2": capsRBD, "efs.csi.aws.com": capsShare,
	"kubernetes.io/azure-disk": {rwoBlock}, "disk.csi.azure.com": {rwoBlock}, "kubernetes.io/azure-file": {rwxFS}, "file.csi.azure.com": {rwxFS},
	"kubernetes.io/gce-pd": capsRWOBF, "pd.csi.storage.gke.io": capsRWOBF, "pd.csi.storage.gke.io/hyperdisk": capsRBD,
	"hspc.csi.hitachi.com": capsRBD, "csi.hpe.com": capsRBD, "block.csi.ibm.com": capsRBD, "spectrumscale.csi.ibm.com": capsShare,
	"vpc.block.csi.ibm.io":              capsRWOBF,
	"kubernetes.io/portworx-volume/nfs": capsShare, "pxd.portworx.com/nfs": capsShare,
	"kubernetes.io/portworx-volume": {rwxBlock, rwxFS, rwoBlock, rwoFS}, "pxd.portworx.com": {rwxBlock, rwxFS, rwoBlock, rwoFS},
	"pxd.portworx.com/pure_block": capsRBD, "pxd.portworx.com/pure_fa_file": capsShare,
	"csi.trident.netapp.io/ontap-nas": capsShare, "csi.trident.netapp.io/ontap-san": {rwxBlock}, "csi.trident.netapp.io/gcnv-flex": capsShare,
	"topolvm.cybozu.com": capsRWOBF, "topolvm.io": capsRWOBF, "cinder.csi.openstack.org": capsRWOBF, "csi.ovirt.org": capsRWOBF,
	"manila.csi.openstack.org": {rwxFS},
	"csi.vsphere.vmware.com":   capsRWOBF, "csi.vsphere.vmware.com/nfs": {rwxFS, rwoBlock, rwoFS},
	"csi.huawei.com": capsABRF, "csi.huawei.com/nfs": capsAllFS,
	"kubesan.gitlab.io":  {rwxBlock, roxBlock, rwoBlock, rwoFS},
	"driver.longhorn.io": {rwoBlock}, "driver.longhorn.io/migratable": {rwxBlock, rwoBlock},
	"driver.longhorn.io/nfs": capsShare, "driver.longhorn.io/fs": {rwoFS},
	"blockvolume.csi.oraclecloud.com": capsRBD, "csi.san.synology.com/iscsi": capsRBD,
	"csi.san.synology.com/nfs": capsShare, "csi.san.synology.com/smb": capsShare, "directpv-min-io": {rwoFS},
}

// minimumSizes are the smallest volumes some storage makes, by provisioner key: a DataVolume's
// disk asks for at least this much (CDI's annotation cdi.kubevirt.io/minimumSupportedPvcSize on
// the StorageProfile, which an administrator may change).
var minimumSizes = map[string]string{
	"pd.csi.storage.gke.io/hyperdisk": "4Gi", "ebs.csi.aws.com/io1": "4Gi", "ebs.csi.aws.com/io2": "4Gi",
	"ebs.csi.aws.com/gp": "1Gi", "csi.san.synology.com/iscsi": "1Gi", "csi.san.synology.com/nfs": "1Gi", "csi.san.synology.com/smb": "1Gi",
	"csi.trident.netapp.io/gcnv-flex": "1Gi", "hspc.csi.hitachi.com": "1Gi",
	"vpc.file.csi.ibm.io/rfs": "1Gi", "vpc.file.csi.ibm.io/rfs-rwo": "1Gi", "vpc.file.csi.ibm.io/dp2": "10Gi", "vpc.file.csi.ibm.io/dp2-rwo": "10Gi",
}

// snapshotSources are the storage whose golden images CDI keeps as VolumeSnapshots by default
// (a StorageProfile's dataImportCronSourceFormat snapshot), by provisioner key: clones of one
// snapshot scale better there than clones of one volume. Reported only where a
// VolumeSnapshotClass of the driver exists.
var snapshotSources = []string{
	"rook-ceph.rbd.csi.ceph.com", "openshift-storage.rbd.csi.ceph.com",
	"csi.trident.netapp.io/ontap-nas", "csi.trident.netapp.io/ontap-san", "csi.trident.netapp.io/gcnv-flex",
	"pd.csi.storage.gke.io", "pd.csi.storage.gke.io/hyperdisk",
	"vpc.file.csi.ibm.io", "vpc.file.csi.ibm.io/dp2", "vpc.file.csi.ibm.io/dp2-rwo", "vpc.file.csi.ibm.io/rfs", "vpc.file.csi.ibm.io/rfs-rwo",
}

// provisionerKey is class's key in capabilities: its provisioner, and for some the parameter
// that tells their kinds of volume apart, as CDI computes it.
func provisionerKey(class *storagev1.StorageClass) string {
	p, params := class.Provisioner, class.Parameters
	fstype := strings.ToLower(params["csi.storage.k8s.io/fstype"])
	switch p {
	case "kubevirt.io.hostpath-provisioner":
		if _, ok := params["overlayCSI"]; ok {
			return p + "/overlay"
		}
	case "csi.trident.netapp.io":
		switch bt := params["backendType"]; {
		case strings.HasPrefix(bt, "ontap-nas"):
			return p + "/ontap-nas"
		case strings.HasPrefix(bt, "ontap-san"):
			return p + "/ontap-san"
		case strings.HasPrefix(bt, "google-cloud-netapp-volumes") && strings.Contains(params["selector"], "performance=flex"):
			return p + "/gcnv-flex"
		}
		return "UNKNOWN"
	case "pxd.portworx.com":
		switch params["backend"] {
		case "pure_block", "pure_fa_file":
			return p + "/" + params["backend"]
		}
		fallthrough
	case "kubernetes.io/portworx-volume":
		if o := params["sharedv4_mount_options"]; strings.Contains(o, "vers=3.0") && strings.Contains(o, "nolock") {
			return p + "/nfs"
		}
	case "csi.vsphere.vmware.com":
		if strings.Contains(fstype, "nfs") {
			return p + "/nfs"
		}
	case "csi-unity.dellemc.com", "csi.huawei.com":
		if strings.EqualFold(params["protocol"], "nfs") {
			return p + "/nfs"
		}
	case "csi-powerstore.dellemc.com", "csi-vxflexos.dellemc.com", "csi-powermax.dellemc.com":
		if fstype == "nfs" {
			return p + "/nfs"
		}
	case "driver.longhorn.io":
		switch {
		case params["migratable"] == "true":
			return p + "/migratable"
		case params["nfsOptions"] != "":
			return p + "/nfs"
		case params["fsType"] != "":
			return p + "/fs"
		}
	case "ebs.csi.aws.com":
		switch params["type"] {
		case "io1", "io2":
			return p + "/" + params["type"]
		case "gp2", "gp3":
			return p + "/gp"
		}
	case "pd.csi.storage.gke.io":
		if t := params["type"]; t == "hyperdisk-balanced" || t == "hyperdisk-balanced-high-availability" {
			return p + "/hyperdisk"
		}
	case "vpc.file.csi.ibm.io":
		key := map[string]string{"rfs": "/rfs", "dp2": "/dp2"}[params["profile"]]
		if key != "" && params["vmState"] == "true" {
			key += "-rwo"
		}
		return p + key
	case "csi.san.synology.com":
		switch params["protocol"] {
		case "iscsi", "":
			return p + "/iscsi"
		case "smb":
			return p + "/smb"
		case "nfs", "nfs_treeq":
			return p + "/nfs"
		}
		return "UNKNOWN"
	}
	return p
}

// classProperties are the claim property sets CDI ships for class (nil: it knows none).
func classProperties(class *storagev1.StorageClass) []cdiv1.ClaimPropertySet {
	var sets []cdiv1.ClaimPropertySet
	for _, c := range capabilities[provisionerKey(class)] {
		sets = append(sets, cdiv1.ClaimPropertySet{AccessModes: []corev1.PersistentVolumeAccessMode{c.mode}, VolumeMode: &c.volume})
	}
	return sets
}
