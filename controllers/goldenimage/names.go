package goldenimage

import (
	"strings"

	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
)

// Kind of a golden image, as DiskVolume's source.image.kind spells it.
const (
	KindVirtualMachineImage = diskvolume.ImageKindVirtualMachineImage
	KindImageTemplate       = diskvolume.ImageKindImageTemplate
)

// Finalizer holds an image until its importer pods, golden PVC and golden snapshot are gone.
const Finalizer = "diskpipe.io/golden-image"

// Labels of the children, and of the disks being cloned from an image.
const (
	LabelImage  = "diskpipe.io/golden-image"
	LabelRole   = "diskpipe.io/role"
	LabelGolden = "diskpipe.io/golden"
	// LabelCloneOf marks a disk's PVC with the UID of the image it is being made from, until
	// it is made: the image is not deleted while a clone reads it.
	LabelCloneOf = "diskpipe.io/clone-of"
	// LabelStaging ("true") marks an image that stages one disk's bytes and goes once the disk
	// is made (a DataVolume's import or upload): its disk is cloned from its volume, never from
	// a golden snapshot, which would be taken and restored for that one disk.
	LabelStaging = "diskpipe.io/staging"
)

// The prefixes of the names of an image's children (childName), by kind.
const (
	PrefixVirtualMachineImage = "vmim"
	PrefixImageTemplate       = "imt"
)

// IsPVCName says whether a PVC of that name would be an image's golden PVC.
func IsPVCName(name string) bool {
	return strings.HasPrefix(name, PrefixVirtualMachineImage+"-") || strings.HasPrefix(name, PrefixImageTemplate+"-")
}

// IsKind says whether kind is one of the image kinds, whose children are golden PVCs.
func IsKind(kind string) bool {
	return kind == string(KindVirtualMachineImage) || kind == string(KindImageTemplate)
}

// Reasons of an image's Ready condition that other controllers read (CDI's DataVolume).
const (
	ReasonSizeRequired     = "SizeRequired"
	ReasonWaitingForUpload = "WaitingForUpload"
)
