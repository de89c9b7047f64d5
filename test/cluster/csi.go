package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Driver is the name of the harness's CSI driver.
const Driver = "hostpath.csi.diskpipe.test"

// TopologyKey is the driver's topology: the node a node-local volume lives on. A class whose
// parameters set LocalParameter "true" makes node-local volumes, as TopoLVM, LVMS, local-path
// and OpenEBS LocalPV do: the volume is published only on its node, and a clone or a restore
// of it is made only there (refused with InvalidArgument when the node it is wanted on is
// another). Other classes make volumes every node reaches, as Ceph RBD does.
const (
	TopologyKey    = "topology.hostpath.csi.diskpipe.test/node"
	LocalParameter = "diskpipe.test/node-local"
)

// hostPath is the harness's CSI driver. It is a test fixture, not a storage system: a
// filesystem volume is a directory, a block volume a file (block.img) in a directory attached
// as a loop device while published, clones and snapshots are sparse copies (reflinked where
// the filesystem can). What makes it real is who drives it: the kubelet (through the plugin
// registration socket and NodePublishVolume), the external-provisioner and the csi-snapshotter,
// all over CSI's gRPC.
type hostPath struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	node string
	dir  string // volumes/<id>/, snapshots/<id>/
	log  io.Writer
	// kubeletRoot is the kubelet's root directory as this process sees it: the kubelet, in
	// the node's mount namespace, names paths under KubeletRoot, a bind mount of it there.
	kubeletRoot string

	mu    sync.Mutex
	loops map[string]string // publish target → loop device
}

func (d *hostPath) volumeDir(id string) string { return filepath.Join(d.dir, "volumes", id) }

// nodeOf is the node a node-local volume or snapshot (its directory dir) lives on; "" when it
// is not node-local.
func nodeOf(dir string) string {
	data, _ := os.ReadFile(dir + ".node")
	return strings.TrimSpace(string(data))
}

// topology is the accessible topology of a volume on node ("": every node).
func topology(node string) []*csi.Topology {
	if node == "" {
		return nil
	}
	return []*csi.Topology{{Segments: map[string]string{TopologyKey: node}}}
}

// placeLocal picks the node a new node-local volume lives on: its source's, which the
// request must allow, or the node the request prefers (the consumer's, for a class that
// waits for it).
func placeLocal(req *csi.CreateVolumeRequest, sourceNode string) (string, error) {
	var allowed []string
	for _, t := range req.GetAccessibilityRequirements().GetRequisite() {
		allowed = append(allowed, t.GetSegments()[TopologyKey])
	}
	if sourceNode != "" {
		if len(allowed) > 0 && !slices.Contains(allowed, sourceNode) {
			return "", status.Errorf(codes.InvalidArgument, "the source lives on node %s: a clone or a restore of a node-local volume is made only there, and this one is wanted on %s",
				sourceNode, strings.Join(allowed, ", "))
		}
		return sourceNode, nil
	}
	for _, t := range req.GetAccessibilityRequirements().GetPreferred() {
		if n := t.GetSegments()[TopologyKey]; n != "" {
			return n, nil
		}
	}
	if len(allowed) > 0 && allowed[0] != "" {
		return allowed[0], nil
	}
	return "", status.Error(codes.InvalidArgument, "a node-local volume needs a node: the request names none")
}

// here is where a path the kubelet names is in this process's mount namespace.
func (d *hostPath) here(p string) string {
	if rest, ok := strings.CutPrefix(p, KubeletRoot+"/"); ok && d.kubeletRoot != "" {
		return filepath.Join(d.kubeletRoot, rest)
	}
	return p
}
func (d *hostPath) snapshotDir(id string) string { return filepath.Join(d.dir, "snapshots", id) }

// serve serves CSI on sock and the kubelet's plugin registration on regSock until ctx ends.
func (d *hostPath) serve(ctx context.Context, sock, regSock string) error {
	for _, p := range []string{sock, regSock} {
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			return err
		}
		_ = os.Remove(p)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	rl, err := net.Listen("unix", regSock)
	if err != nil {
		l.Close()
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.logCalls))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	csi.RegisterNodeServer(srv, d)
	reg := grpc.NewServer()
	registerapi.RegisterRegistrationServer(reg, &registration{endpoint: sock, log: d.log})
	go func() { _ = srv.Serve(l) }()
	go func() { _ = reg.Serve(rl) }()
	go func() { <-ctx.Done(); reg.Stop(); srv.Stop() }()
	return nil
}

func (d *hostPath) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err != nil || !strings.Contains(info.FullMethod, "Probe") && !strings.Contains(info.FullMethod, "Capabilities") {
		fmt.Fprintf(d.log, "%s csi %s: %v\n", time.Now().Format(time.TimeOnly), info.FullMethod, errOr(err, "ok"))
	}
	return resp, err
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// registration answers the kubelet's plugin watcher for the driver's socket.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
	log      io.Writer
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: Driver, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	fmt.Fprintf(r.log, "csi: registered with the kubelet: %v %s\n", s.PluginRegistered, s.Error)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Identity.

func (d *hostPath) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: Driver, VendorVersion: "test"}, nil
}

func (d *hostPath) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}}},
	}}, nil
}

func (d *hostPath) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// Controller.

func (d *hostPath) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, c := range []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT, csi.ControllerServiceCapability_RPC_CLONE_VOLUME} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func isBlock(caps []*csi.VolumeCapability) bool {
	for _, c := range caps {
		if c.GetBlock() != nil {
			return true
		}
	}
	return false
}

// CreateVolume makes the volume named by the request (idempotently), empty or a copy of the
// volume or snapshot it names.
func (d *hostPath) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "a name is required")
	}
	size := req.GetCapacityRange().GetRequiredBytes()
	if size == 0 {
		size = 1 << 30
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dir := d.volumeDir(req.GetName())
	// The volume's context names what it was made from; the provisioner writes it into the
	// PV (spec.csi.volumeAttributes), where a test sees that a clone or a restore went through CSI.
	vol := &csi.Volume{VolumeId: req.GetName(), CapacityBytes: size, ContentSource: req.GetVolumeContentSource(),
		VolumeContext: map[string]string{ContentSourceAttribute: contentSource(req.GetVolumeContentSource())}}
	if _, err := os.Stat(dir); err == nil {
		vol.AccessibleTopology = topology(nodeOf(dir))
		return &csi.CreateVolumeResponse{Volume: vol}, nil
	}
	src := ""
	switch s := req.GetVolumeContentSource(); {
	case s.GetVolume() != nil:
		src = d.volumeDir(s.GetVolume().GetVolumeId())
	case s.GetSnapshot() != nil:
		src = d.snapshotDir(s.GetSnapshot().GetSnapshotId())
	}
	node := ""
	if req.GetParameters()[LocalParameter] == "true" {
		var err error
		if node, err = placeLocal(req, nodeOf(src)); err != nil {
			return nil, err
		}
	} else if src != "" && nodeOf(src) != "" {
		return nil, status.Errorf(codes.InvalidArgument, "the source lives on node %s: a clone or a restore of a node-local volume is node-local too", nodeOf(src))
	}
	vol.AccessibleTopology = topology(node)
	tmp := dir + ".new"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if src != "" {
		if _, err := os.Stat(src); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, status.Errorf(codes.NotFound, "content source %s: %v", filepath.Base(src), err)
		}
		if err := copyTree(src, tmp); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if isBlock(req.GetVolumeCapabilities()) {
		if err := growFile(filepath.Join(tmp, "block.img"), size); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if node != "" {
		if err := os.WriteFile(dir+".node", []byte(node), 0o644); err != nil {
			_ = os.RemoveAll(tmp)
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.CreateVolumeResponse{Volume: vol}, nil
}

// ContentSourceAttribute is the PV attribute that says what a volume was made from:
// "volume/<id>", "snapshot/<id>" or "empty".
const ContentSourceAttribute = "diskpipe.test/content-source"

func contentSource(s *csi.VolumeContentSource) string {
	switch {
	case s.GetVolume() != nil:
		return "volume/" + s.GetVolume().GetVolumeId()
	case s.GetSnapshot() != nil:
		return "snapshot/" + s.GetSnapshot().GetSnapshotId()
	}
	return "empty"
}

// growFile makes path (sparse) at least size bytes long.
func growFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < size {
		return f.Truncate(size)
	}
	return nil
}

// copyTree copies the contents of src into dst, keeping holes and sharing extents where the
// filesystem can.
func copyTree(src, dst string) error {
	out, err := exec.Command("cp", "-a", "--sparse=always", "--reflink=auto", src+"/.", dst+"/").CombinedOutput()
	if err != nil {
		return fmt.Errorf("copying %s: %w: %s", src, err, out)
	}
	return nil
}

func (d *hostPath) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "a volume ID is required")
	}
	if err := os.RemoveAll(d.volumeDir(req.GetVolumeId())); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	_ = os.Remove(d.volumeDir(req.GetVolumeId()) + ".node")
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *hostPath) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if _, err := os.Stat(d.volumeDir(req.GetVolumeId())); err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeCapabilities: req.GetVolumeCapabilities()}}, nil
}

// CreateSnapshot copies the volume, which is then ready at once.
func (d *hostPath) CreateSnapshot(_ context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" || req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "a name and a source volume are required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	src, dst := d.volumeDir(req.GetSourceVolumeId()), d.snapshotDir(req.GetName())
	if _, err := os.Stat(src); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s: %v", req.GetSourceVolumeId(), err)
	}
	if _, err := os.Stat(dst); err != nil {
		tmp := dst + ".new"
		_ = os.RemoveAll(tmp)
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if err := copyTree(src, tmp); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		// A snapshot of a node-local volume lives on its node.
		if node := nodeOf(src); node != "" {
			if err := os.WriteFile(dst+".node", []byte(node), 0o644); err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
		}
		if err := os.Rename(tmp, dst); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.CreateSnapshotResponse{Snapshot: &csi.Snapshot{SnapshotId: req.GetName(), SourceVolumeId: req.GetSourceVolumeId(),
		CreationTime: timestamppb.New(fi.ModTime()), ReadyToUse: true, SizeBytes: dirSize(dst)}}, nil
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func (d *hostPath) DeleteSnapshot(_ context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "a snapshot ID is required")
	}
	if err := os.RemoveAll(d.snapshotDir(req.GetSnapshotId())); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	_ = os.Remove(d.snapshotDir(req.GetSnapshotId()) + ".node")
	return &csi.DeleteSnapshotResponse{}, nil
}

// Node.

func (d *hostPath) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.node, AccessibleTopology: topology(d.node)[0]}, nil
}

func (d *hostPath) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// NodePublishVolume bind-mounts the volume's directory, or the loop device of its block.img,
// at the kubelet's target path.
func (d *hostPath) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	target, id := d.here(req.GetTargetPath()), req.GetVolumeId()
	if target == "" || id == "" || req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "a volume, a target path and a capability are required")
	}
	dir := d.volumeDir(id)
	if _, err := os.Stat(dir); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s: %v", id, err)
	}
	if node := nodeOf(dir); node != "" && node != d.node {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s lives on node %s, not on %s", id, node, d.node)
	}
	if mounted(target) {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	src := dir
	if req.GetVolumeCapability().GetBlock() != nil {
		out, err := exec.Command("losetup", "-f", "--show", filepath.Join(dir, "block.img")).CombinedOutput()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "losetup: %v: %s", err, out)
		}
		src = strings.TrimSpace(string(out))
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		f, err := os.OpenFile(target, os.O_CREATE, 0o660)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		f.Close()
		d.loops[target] = src
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return nil, status.Errorf(codes.Internal, "bind mount %s: %v", src, err)
	}
	if req.GetReadonly() {
		if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return nil, status.Errorf(codes.Internal, "read-only remount: %v", err)
		}
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *hostPath) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	target := d.here(req.GetTargetPath())
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "a target path is required")
	}
	for mounted(target) {
		if err := unix.Unmount(target, 0); err != nil {
			return nil, status.Errorf(codes.Internal, "unmount: %v", err)
		}
	}
	d.mu.Lock()
	if loop, ok := d.loops[target]; ok {
		_ = exec.Command("losetup", "-d", loop).Run()
		delete(d.loops, target)
	}
	d.mu.Unlock()
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// mounted says whether path is a mount point.
func mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && unescapeMount(f[4]) == path {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}
