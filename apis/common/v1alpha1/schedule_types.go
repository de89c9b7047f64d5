package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ImageSchedule keeps a golden image current: its source is checked on a schedule, and each
// new revision of it (a registry digest, an ETag or Last-Modified, an S3 ETag) is imported
// into an image of its own, named after the scheduled image and the revision. Disks made from
// the scheduled image get its newest Ready revision; disks already made keep theirs.
type ImageSchedule struct {
	// cron is when the source is checked, in cron syntax: "0 */6 * * *", "@daily", or
	// "@every 6h". The first check is made when the image is created.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	Cron string `json:"cron"`

	// keep is how many imported revisions are kept, the current one included (default 3).
	// Older ones are deleted once no disk is being cloned from them.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Keep *int32 `json:"keep,omitempty"`

	// suspend stops the checks while it is true, as a CronJob's does: the revisions kept stay,
	// and the current one still serves disks.
	// +optional
	Suspend *bool `json:"suspend,omitempty"`
}

// DefaultKeep is how many revisions a schedule keeps when it does not say.
const DefaultKeep = 3

// ScheduleStatus is the observed state of a scheduled image's checks.
type ScheduleStatus struct {
	// current names the image (of the same kind and namespace) that holds the newest Ready
	// revision: the one new disks are made from.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Current string `json:"current,omitempty"`

	// revisions are the images this schedule made and keeps, newest first.
	// +optional
	// +kubebuilder:validation:MaxItems=101
	Revisions []ScheduledRevision `json:"revisions,omitempty"`

	// lastCheckTime is when the source was last checked, whatever the outcome.
	// +optional
	LastCheckTime *metav1.Time `json:"lastCheckTime,omitempty"`

	// nextCheckTime is when the source is checked next.
	// +optional
	NextCheckTime *metav1.Time `json:"nextCheckTime,omitempty"`

	// upToDateTime is when a check last found that the current image holds the source's
	// newest revision. An image is out of date when this falls behind its schedule.
	// +optional
	UpToDateTime *metav1.Time `json:"upToDateTime,omitempty"`

	// outOfDateTime is when the image counts as out of date unless a check finds it up to
	// date before: the second scheduled check after upToDateTime (or after the image was
	// created). The metric diskpipe_scheduled_image_out_of_date_timestamp_seconds follows it.
	// +optional
	OutOfDateTime *metav1.Time `json:"outOfDateTime,omitempty"`

	// checks counts the checks made, to name each check's pod.
	// +optional
	Checks int64 `json:"checks,omitempty"`
}

// ScheduledRevision is one revision of a scheduled image's source, imported into an image.
type ScheduledRevision struct {
	// image is the name of the image holding the revision.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Image string `json:"image"`

	// revision is the source's revision the image imported.
	// +required
	// +kubebuilder:validation:MaxLength=512
	Revision string `json:"revision"`

	// phase of that image.
	// +optional
	Phase Phase `json:"phase,omitempty"`
}

// ReplicaPolicy says which nodes get a copy of a node-local image before any disk is wanted
// there, and when a copy no disk uses is let go of. It matters only for an image whose volume
// lives on one node (TopoLVM, local-path, ...): elsewhere a disk is cloned from the image's own
// volume. A node gets its copy from the image's node once, never from the origin.
type ReplicaPolicy struct {
	// nodeSelector pre-warms the nodes whose labels match it: each gets the image's replica
	// as soon as the image is Ready, and keeps it. Empty: none is pre-warmed.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// evictAfter deletes a replica of a node the selector does not match once no disk was
	// made from it for this long ("168h"). Unset: replicas are kept until the image goes.
	// +optional
	EvictAfter *metav1.Duration `json:"evictAfter,omitempty"`
}
