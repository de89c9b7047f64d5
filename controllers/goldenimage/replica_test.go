package goldenimage

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
)

// TestReplicaName: a replica's name is a PVC name its pods can mount (at most 63 characters,
// no dot or hyphen before the hash), and differs for two images whose names begin alike (a
// scheduled image's revisions) and for two nodes.
func TestReplicaName(t *testing.T) {
	golden := func(name, uid string) *Golden {
		return &Golden{Obj: &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}}}
	}
	long := strings.Repeat("fedora-cloud-base-", 3) // 54 characters
	rev1, rev2 := golden(long+"-0123456789", "u1"), golden(long+"-9876543210", "u2")
	seen := map[string]string{}
	for _, c := range []struct {
		g    *Golden
		node string
	}{{rev1, "n1"}, {rev2, "n1"}, {rev1, "n2"}, {golden("a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v", "u3"), "n1"}} {
		name := ReplicaName(c.g, c.node)
		if len(name) > 63 || strings.Contains(name, ".-") || strings.Contains(name, "--") {
			t.Errorf("ReplicaName(%s, %s) = %q: not a PVC name pods can mount", c.g.Obj.GetName(), c.node, name)
		}
		key := c.g.Obj.GetName() + "@" + c.node
		if other, ok := seen[name]; ok {
			t.Errorf("ReplicaName: %s and %s share %q", other, key, name)
		}
		seen[name] = key
	}
}
