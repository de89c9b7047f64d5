// Command crdcolumns gives a generated CRD the printer columns its project's own CRD has and
// controller-gen cannot know of (make manifests runs it). Usage:
//
//	crdcolumns FILE NAME:TYPE:JSONPATH...
//
// For KubeVirt's VirtualMachine these are Age, Status and Ready, as virt-operator installs them.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "crdcolumns:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: crdcolumns FILE NAME:TYPE:JSONPATH")
	}
	file := args[0]
	var cols []apiextensionsv1.CustomResourceColumnDefinition
	for _, a := range args[1:] {
		f := strings.SplitN(a, ":", 3)
		if len(f) != 3 || f[0] == "" || f[2] == "" {
			return fmt.Errorf("column %q: want NAME:TYPE:JSONPATH", a)
		}
		cols = append(cols, apiextensionsv1.CustomResourceColumnDefinition{Name: f[0], Type: f[1], JSONPath: f[2]})
	}
	in, err := os.ReadFile(file) //nolint:gosec // the Makefile's file
	if err != nil {
		return err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(bytes.TrimPrefix(in, []byte("---\n")), crd); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	for i := range crd.Spec.Versions {
		crd.Spec.Versions[i].AdditionalPrinterColumns = cols
	}
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	// The status controller-gen leaves empty is not part of a manifest.
	out = bytes.Replace(out, []byte("status:\n  acceptedNames:\n    kind: \"\"\n    plural: \"\"\n  conditions: null\n  storedVersions: null\n"), nil, 1)
	return os.WriteFile(file, append([]byte("---\n"), out...), 0o644) //nolint:gosec // a manifest
}
