package export_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/exporter"
	"github.com/diskpipe/diskpipe/internal/backup"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestBackupExport keeps two exports of a disk as backups in the bundled store: each pod's own
// arguments, run by the real exporter with the keys its Secret holds, write a full and then an
// incremental beside the index; the keys reach only the index's directory. A backup to be
// deleted with its export is refused by the API server.
func TestBackupExport(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	newPVC(t, ns, "vm-root", "csi")
	disk := filepath.Join(t.TempDir(), "disk.img")
	g.Expect(os.WriteFile(disk, bytes.Repeat([]byte("a VM's disk "), 1<<20), 0o600)).To(Succeed())

	run := func(name string) *transfer.Result {
		t.Helper()
		ex := newExport(ns, name, "vm-root", "backups/vm-root/index.json")
		ex.Spec.Backup = &hypercloud.ExportBackup{}
		g.Expect(env.Client.Create(ctx, ex)).To(Succeed())
		pod := ctrltest.Pod(t, env, ns, name+"-export-0")
		if name == "b2" {
			// A younger backup of the same index waits for this one.
			younger := newExport(ns, "b3", "vm-root", "backups/vm-root/index.json")
			younger.Spec.Backup = &hypercloud.ExportBackup{}
			g.Expect(env.Client.Create(ctx, younger)).To(Succeed())
			g.Eventually(exportStatus(t, younger), 20*time.Second).Should(Equal("Pending WaitingForBackup: waiting for the backup b2 of the same index to finish: backups of one index run one at a time"))
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b3-export-0"}, &corev1.Pod{})).NotTo(Succeed())
		}
		args := pod.Spec.Containers[0].Args
		joined := strings.Join(args, " ")
		g.Expect(joined).To(ContainSubstring("--object backups/vm-root/" + name + ".qcow2 "))
		g.Expect(joined).To(ContainSubstring("--backup-index backups/vm-root/index.json --backup-checkpoint " + name + " --backup-max-chain 7"))
		creds := &corev1.Secret{}
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-export-store"}, creds)).To(Succeed())
		auth := t.TempDir()
		for k, v := range creds.Data {
			g.Expect(os.WriteFile(filepath.Join(auth, k), v, 0o600)).To(Succeed())
		}
		if name == "b1" { // the keys reach the index's directory, nothing else
			p := filepath.Join(t.TempDir(), "x")
			g.Expect(os.WriteFile(p, []byte("x"), 0o600)).To(Succeed())
			out, err := store.AWSAs(ctx, string(creds.Data["accessKeyId"]), string(creds.Data["secretAccessKey"]), "s3", "cp", p, "s3://"+bucketOf(ns)+"/elsewhere")
			g.Expect(err).To(HaveOccurred(), "the backup's keys write outside its index's directory:\n"+out)
		}
		term := filepath.Join(t.TempDir(), "result")
		var run []string
		for i := 0; i < len(args); i++ {
			switch a := args[i]; {
			case a == "--source":
				run, i = append(run, a, disk), i+1
			case strings.HasPrefix(a, "/var/run/diskpipe/auth"):
				run = append(run, auth+strings.TrimPrefix(a, "/var/run/diskpipe/auth"))
			default:
				run = append(run, a)
			}
		}
		var log bytes.Buffer
		code := exporter.Main(ctx, append(run, "--allow-destination", "127.0.0.0/8", "--metrics-addr", "", "--termination-message-path", term), &log)
		g.Expect(code).To(Equal(0), log.String())
		b, err := os.ReadFile(term)
		g.Expect(err).NotTo(HaveOccurred())
		res, err := transfer.ReadResult(string(b))
		g.Expect(err).NotTo(HaveOccurred())
		ctrltest.Complete(t, env, ns, name+"-export-0", *res)
		g.Eventually(exportStatus(t, ex), 20*time.Second).Should(HavePrefix("Ready Exported: exported vm-root as qcow2 to s3://" + bucketOf(ns) + "/backups/vm-root/" + name + ".qcow2"))
		return res
	}
	full := run("b1")
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = f.WriteAt(bytes.Repeat([]byte{0x77}, 100<<10), 5<<20)
	g.Expect(err).NotTo(HaveOccurred())
	f.Close()
	inc := run("b2")
	g.Expect(inc.BytesWritten).To(BeNumerically("<", full.BytesWritten/2), "the second backup holds only what changed")

	obj, err := store.Client().GetObject(ctx, bucketOf(ns), "backups/vm-root/index.json", minio.GetObjectOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	raw, err := io.ReadAll(obj)
	g.Expect(err).NotTo(HaveOccurred())
	ix, err := backup.Parse(raw)
	g.Expect(err).NotTo(HaveOccurred(), string(raw))
	var got []string
	for _, l := range ix.Layers {
		got = append(got, l.Checkpoint+"<"+l.Parent+" "+l.Object)
	}
	g.Expect(slices.Equal(got, []string{"b1< b1.qcow2", "b2<b1 b2.qcow2"})).To(BeTrue(), "%v", got)

	ctrltest.Pod(t, env, ns, "b3-export-0") // its turn has come

	deleting := newExport(ns, "b4", "vm-root", "backups/vm-root/index.json")
	deleting.Spec.Backup, deleting.Spec.RetainPolicy = &hypercloud.ExportBackup{}, hypercloud.RetainPolicyDelete
	g.Expect(env.Client.Create(ctx, deleting)).To(MatchError(ContainSubstring("a backup is retained")))
}
