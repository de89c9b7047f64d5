package main

// The seed's documents (shared/seeds/003 and 000), with the image URL and sizes of this demo.

const images = `apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineImage
metadata:
  name: ubuntu18.04
spec:
  storageClassName: cephrbd
  source:
    objectStore:
      bucketName: vmimage
      objectName: bionic-server-cloudimg-amd64.img
---
apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineImage
metadata:
  name: ubuntu-http
spec:
  storageClassName: cephrbd
  source:
    http: http://%s/demo.qcow2
`

const disks = `apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachinePvc
metadata:
  name: vmrootdisk
spec:
  virtualMachineImageName: ubuntu18.04
  pvc:
    accessModes:
      - ReadWriteOnce
    storageClassName: cephrbd
    resources:
      requests:
        storage: 1Gi
---
apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: disk1-from-image
spec:
  source:
    image:
      name: ubuntu-http
      kind: VirtualMachineImage
  storageClassName: cephrbd
`

const vm = `apiVersion: virtualmachine.kubesphere.io/v1alpha1
kind: VirtualMachine
metadata:
  name: vm1
spec:
  ippool: "p1"
  hardware:
      hostname: vm-test
      domain:
        cpu:
          cores: 2
          threads: 1
          sockets: 1
          model: Westmere
        devices:
          disks:
          - disk:
              bus: virtio
            name: disk0-vm-blank
          - disk:
              bus: virtio
            name: disk1
            bootOrder: 1
          - disk:
              bus: virtio
            name: cloudinitdisk
          interfaces:
            - macvtap: {}
              model: e1000
              name: eth0
          rng: {}
        machine:
          type: ""
        resources:
          requests:
            memory: 1024
      volumes:
      - name: disk1
        persistentVolumeClaim:
          claimName: disk1-from-image
      - cloudInitNoCloud:
          userData: |
            #cloud-config
            ssh_pwauth: True
        name: cloudinitdisk
  diskVolumeTemplates:
    - metadata:
        name: disk0-vm-blank
      spec:
        resources:
          requests:
            storage: 4Gi
        source:
          blank: {}
`

const export = `apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineVolumeExport
metadata:
  name: export
spec:
  pvcName: vmrootdisk
  objectStore:
    bucketName: vmimage
    objectName: vmrootdisk.qcow2
`
