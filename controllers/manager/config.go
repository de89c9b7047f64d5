package manager

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
)

// FileConfig is the manager's --config file, written by the chart (templates/manager.yaml)
// from its importer, cloneStrategy and filesystemOverhead values.
type FileConfig struct {
	Importer           importpod.Config             `json:"importer"`
	CloneStrategy      disk.StrategyDefaults        `json:"cloneStrategy"`
	FilesystemOverhead importpod.FilesystemOverhead `json:"filesystemOverhead"`
	VirtualMachines    VirtualMachinesConfig        `json:"virtualMachines"`
	CDI                CDIConfig                    `json:"cdi"`
}

// CDIConfig is the chart's cdi values.
type CDIConfig struct {
	// Compatibility serves CDI's API (cdi.kubevirt.io), whose CRDs the chart then installs.
	Compatibility bool `json:"compatibility"`
}

// VirtualMachinesConfig is the chart's virtualMachines values.
type VirtualMachinesConfig struct {
	// AllowHostDisk lets VirtualMachines use hostDisk volumes: files on the node.
	AllowHostDisk bool `json:"allowHostDisk"`
}

// LoadConfig reads path strictly: an unknown key is an error, not a silently ignored setting.
func LoadConfig(path string) (FileConfig, error) {
	var c FileConfig
	data, err := os.ReadFile(path) //nolint:gosec // the manager's own configuration
	if err != nil {
		return c, fmt.Errorf("reading the configuration: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("the configuration %s: %w", path, err)
	}
	if err := c.CloneStrategy.Validate(); err != nil {
		return c, fmt.Errorf("the configuration %s: %w", path, err)
	}
	if err := c.Importer.ValidateEgress(); err != nil {
		return c, fmt.Errorf("the configuration %s: %w", path, err)
	}
	if err := c.FilesystemOverhead.Validate(); err != nil {
		return c, fmt.Errorf("the configuration %s: %w", path, err)
	}
	return c, nil
}

// Apply puts c into o.
func (c FileConfig) Apply(o *Options) {
	o.Importer, o.CloneStrategies = c.Importer, c.CloneStrategy
	o.Importer.FilesystemOverhead = c.FilesystemOverhead
	o.AllowHostDisk = c.VirtualMachines.AllowHostDisk
	o.CDICompatibility = c.CDI.Compatibility
}
