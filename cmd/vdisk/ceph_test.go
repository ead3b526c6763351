package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// The Ceph flags fold into an RBD store name, relative configuration paths
// become absolute, and the flags are refused for a file store.
func TestStoreName(t *testing.T) {
	abs, err := filepath.Abs("ceph.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in   string
		ceph cephFlags
		want string
	}{
		{"rbd:rbd/store", cephFlags{}, "rbd:rbd/store"},
		{"rbd:rbd/store", cephFlags{conf: "/etc/ceph/x.conf", user: "vdisk"}, "rbd:rbd/store:id=vdisk:conf=/etc/ceph/x.conf"},
		{"rbd:rbd/store:id=old:conf=/a", cephFlags{user: "new"}, "rbd:rbd/store:id=new:conf=/a"},
		{"rbd:p/ns/img", cephFlags{conf: "ceph.conf"}, "rbd:p/ns/img:conf=" + abs},
		{"/srv/s.img", cephFlags{}, "/srv/s.img"},
	} {
		e := newEnv(nil, nil, false)
		e.ceph = c.ceph
		got, err := e.storeName(c.in)
		if err != nil || got != c.want {
			t.Errorf("storeName(%q) with %+v = %q, %v; want %q", c.in, c.ceph, got, err, c.want)
		}
	}
	e := newEnv(nil, nil, false)
	e.ceph.user = "x"
	if _, err := e.storeName("/srv/s.img"); err == nil {
		t.Error("--ceph-user with a file store was accepted")
	}
}

// What the CLI says about RBD stores without a cluster: flags on a file
// store, --break-lock on a file store, a malformed name, and, in a build
// without the rbd tag, how to get one.
func TestRBDStoreErrors(t *testing.T) {
	store := newStore(t)
	wantFail(t, exitFailure, []string{"apply to an rbd:POOL/IMAGE store only"}, "ls", store, "--ceph-conf", "/etc/ceph/ceph.conf")
	wantFail(t, exitFailure, []string{"apply to an rbd:POOL/IMAGE store only"}, "mount", filepath.Join(t.TempDir(), "mnt"), "--id", "x")
	wantFail(t, exitFailure, []string{"--break-lock applies to an rbd:POOL/IMAGE store only"}, "mount", store, filepath.Join(t.TempDir(), "mnt"), "--break-lock")
	wantFail(t, exitFailure, []string{"rbd:POOL/IMAGE"}, "ls", "rbd:just-a-pool")
	if backend.RBDSupported {
		return
	}
	for _, args := range [][]string{
		{"format", "rbd:rbd/store", "--size", "1G"},
		{"ls", "rbd:rbd/store", "--id", "vdisk"},
		{"fsck", "rbd:rbd/store"},
	} {
		r := vdisk(t, args...)
		if r.code == 0 || !strings.Contains(r.stderr, "without Ceph RBD support") || !strings.Contains(r.stderr, "TAGS=rbd") {
			t.Errorf("vdisk %s: exit %d: %s", strings.Join(args, " "), r.code, r.stderr)
		}
	}
}
