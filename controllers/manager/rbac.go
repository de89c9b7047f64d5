package manager

// The manager's permissions, exactly the verbs its controllers use. `make manifests` turns
// these markers into charts/diskpipe/templates/rbac/role.yaml; the disk controllers' envtest
// suite and the local cluster run the manager with nothing but the chart's RBAC.
//
// The leader-election Lease is in a Role of the release namespace, and patching the webhook
// configuration's caBundle in a ClusterRole limited to its name: both are in
// charts/diskpipe/templates/rbac/bindings.yaml, as markers cannot say either.
//
// Secrets: the manager writes those it makes (presigned URLs, clone tokens, export
// credentials, a namespace's store keys) without reading them back, and reads no user's
// Secret: the pods that need a user's keys mount them. It may read Secrets of one name only,
// the store keys it wrote at a user's request (it checks that it made them before it
// rewrites them), plus, in the release namespace, its webhook certificate and upload token
// key (charts/diskpipe/templates/rbac/bindings.yaml). No ConfigMap is read but the
// apiserver's front-proxy CA in kube-system (a built-in Role, bound in the chart). CDI's API's
// permissions are in controllers/cdi/rbac.go.
//
// +kubebuilder:rbac:groups=hypercloud.tmaxanc.com,resources=virtualmachinepvcs;virtualmachinevolumeexports,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=hypercloud.tmaxanc.com,resources=virtualmachineimages,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=hypercloud.tmaxanc.com,resources=virtualmachineimages/status;virtualmachinepvcs/status;virtualmachinevolumeexports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hypercloud.tmaxanc.com,resources=virtualmachineimages/finalizers;virtualmachinepvcs/finalizers;virtualmachinevolumeexports/finalizers,verbs=update
// +kubebuilder:rbac:groups=virtualmachine.kubesphere.io,resources=virtualmachines,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=virtualmachine.kubesphere.io,resources=imagetemplates,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=virtualmachine.kubesphere.io,resources=imagetemplates/status;virtualmachines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=virtualmachine.kubesphere.io,resources=imagetemplates/finalizers;virtualmachines/finalizers,verbs=update
// +kubebuilder:rbac:groups=diskvolume.kubesphere.io,resources=diskvolumes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=diskvolume.kubesphere.io,resources=diskvolumes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=diskvolume.kubesphere.io,resources=diskvolumes/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete;deletecollection
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get
// +kubebuilder:rbac:groups=export.kubevirt.io,resources=virtualmachineexports,verbs=get
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create;update;delete;deletecollection
// +kubebuilder:rbac:groups="",resources=secrets,resourceNames=diskpipe-objectstore-keys,verbs=get
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=create
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshots,verbs=get;list;watch;create;delete;deletecollection
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotcontents,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=selfsubjectreviews,verbs=create
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
