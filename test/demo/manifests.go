package main

import (
	"os"
	"path/filepath"
	"strings"
)

// seed reads a seed document from test/fixtures/seeds and applies this demo's substitutions:
// the local image server for the internet, the demo's names where the seed leaves them open.
func seed(name string, replace ...string) (string, error) {
	b, err := os.ReadFile(filepath.Join("test", "fixtures", "seeds", name))
	if err != nil {
		return "", err
	}
	return strings.NewReplacer(replace...).Replace(string(b)), nil
}

// diskForTheVM is the PVC the seed's VirtualMachine mounts as disk1 (claimName
// disk1-from-image), its boot disk, made here from the HTTP image and grown to 10Gi.
const diskForTheVM = `apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: disk1-from-image
spec:
  source:
    image:
      name: ubuntu-http
      kind: VirtualMachineImage
  storageClassName: cephrbd
  resources:
    requests:
      storage: 10Gi
`
