package virtualmachine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// bareNumber is a memory quantity written without a unit.
var bareNumber = regexp.MustCompile(`^[0-9]+$`)

// decodeHardware reads spec.hardware as a KubeVirt VirtualMachineInstanceSpec, strictly: an
// unknown field is an error that names it, so a typo is not silently dropped.
//
// Memory written as a bare number (the seed's `memory: 1024`) means MiB, as KubeSphere's VM
// forms meant it: read as a Kubernetes quantity it would be 1024 bytes, which no guest boots
// with. Quantities with a unit ("1Gi", "512M") are kept.
func decodeHardware(raw []byte) (*kubevirtv1.VirtualMachineInstanceSpec, error) {
	var generic map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil {
		return nil, fmt.Errorf("spec.hardware is not a JSON object: %w", err)
	}
	if res, ok := dig(generic, "domain", "resources"); ok {
		for _, section := range []string{"requests", "limits"} {
			if m, ok := res[section].(map[string]any); ok {
				if mem, ok := memoryMiB(m["memory"]); ok {
					m["memory"] = mem
				}
			}
		}
	}
	b, err := json.Marshal(generic)
	if err != nil {
		return nil, err
	}
	spec := &kubevirtv1.VirtualMachineInstanceSpec{}
	if err := StrictDecode(b, spec); err != nil {
		return nil, fmt.Errorf("spec.hardware is not a KubeVirt VirtualMachineInstance spec: %w", err)
	}
	return spec, nil
}

// refuseHostDisk fails a spec with a hostDisk volume, which reaches the node's files: the
// admission webhook refuses it first, this holds where the webhook is off.
func refuseHostDisk(spec *kubevirtv1.VirtualMachineInstanceSpec) error {
	for _, v := range spec.Volumes {
		if v.HostDisk != nil {
			return fmt.Errorf("volume %q of spec.hardware is a hostDisk (%s on the node): VirtualMachines may not reach the node's files unless the chart's virtualMachines.allowHostDisk is true", v.Name, v.HostDisk.Path)
		}
	}
	return nil
}

// StrictDecode decodes raw into v and fails on any field v's type does not have. KubeVirt's
// VirtualMachineInstanceSpec has its own UnmarshalJSON, which decodes leniently whatever the
// decoder asks, so the check is made again by encoding v and looking for every field of raw
// that carries a value.
func StrictDecode(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	back, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var in, out any
	if err := json.Unmarshal(raw, &in); err != nil {
		return err
	}
	if err := json.Unmarshal(back, &out); err != nil {
		return err
	}
	if path := missing(in, out, ""); path != "" {
		return fmt.Errorf("unknown field %q", path)
	}
	return nil
}

// missing is the path of the first field of in that carries a value and is not in out.
func missing(in, out any, path string) string {
	switch a := in.(type) {
	case map[string]any:
		b, _ := out.(map[string]any)
		for k, v := range a {
			w, ok := b[k]
			if !ok {
				if isZero(v) {
					continue // dropped by omitempty
				}
				return strings.TrimPrefix(path+"."+k, ".")
			}
			if p := missing(v, w, path+"."+k); p != "" {
				return p
			}
		}
	case []any:
		b, _ := out.([]any)
		for i, v := range a {
			if i < len(b) {
				if p := missing(v, b[i], fmt.Sprintf("%s[%d]", path, i)); p != "" {
					return p
				}
			}
		}
	}
	return ""
}

func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	}
	return false
}

// memoryMiB turns a bare number of MiB into a quantity.
func memoryMiB(v any) (string, bool) {
	switch n := v.(type) {
	case float64:
		if n == float64(int64(n)) && n > 0 {
			return fmt.Sprintf("%dMi", int64(n)), true
		}
	case string:
		if bareNumber.MatchString(n) {
			return n + "Mi", true
		}
	}
	return "", false
}

func dig(m map[string]any, keys ...string) (map[string]any, bool) {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil, false
		}
		m = next
	}
	return m, true
}

// bindDisks gives every disk of the domain named like a diskVolumeTemplate a volume bound to
// that DiskVolume's PVC, unless the user wrote a volume of that name; the user's volumes are
// kept as they are.
func bindDisks(spec *kubevirtv1.VirtualMachineInstanceSpec, pvcs map[string]string) {
	have := map[string]bool{}
	for _, v := range spec.Volumes {
		have[v.Name] = true
	}
	for _, d := range spec.Domain.Devices.Disks {
		claim, ok := pvcs[d.Name]
		if !ok || have[d.Name] {
			continue
		}
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: d.Name, VolumeSource: kubevirtv1.VolumeSource{
			PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
				PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}})
		have[d.Name] = true
	}
}
