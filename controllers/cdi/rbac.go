package cdi

// The manager's permissions on CDI's API, exactly the verbs these controllers use (`make
// manifests` adds them to the manager's ClusterRole, controllers/manager/rbac.go has the rest).
//
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes,verbs=get;list;watch
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes/finalizers,verbs=update
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=cdis;cdiconfigs,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=storageprofiles,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datasources,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=dataimportcrons,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=dataimportcrons/finalizers,verbs=update
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=storageprofiles/status,verbs=get;update;patch
