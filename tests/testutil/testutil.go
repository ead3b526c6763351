// Package testutil holds what the mount-level test suites share: the rule
// for tests that need FUSE (skip outside CI, fail in CI), the same rule for
// tests that need a Ceph cluster, and building the vdisk binary once per
// test process for tests that need a real daemon.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// RequireFUSE skips the test when this process cannot serve FUSE (not
// root, or no /dev/fuse) and fails it instead when CI=true, where mounts
// must run for real.
func RequireFUSE(t testing.TB) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test mounts and needs root and /dev/fuse in CI: %s", why)
	}
	t.Skipf("this test mounts and needs root and /dev/fuse: %s", why)
}

// RequireCeph returns the pool the RBD tests (build tag rbd) make their
// images in: $VDISKFS_TEST_RBD_POOL, default rbd, on the cluster CEPH_CONF
// names (tools/ceph/cluster.sh start prints it). Without CEPH_CONF the test
// skips, and fails instead when CI=true, where tools/test.sh starts a
// cluster: a cluster that did not start never passes as a skip.
func RequireCeph(t testing.TB) string {
	t.Helper()
	if os.Getenv("CEPH_CONF") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CEPH_CONF is not set: in CI the RBD tests run against the cluster tools/test.sh starts (tools/ceph/cluster.sh)")
		}
		t.Skip("no Ceph cluster: eval \"$(tools/ceph/cluster.sh start)\" sets CEPH_CONF")
	}
	if pool := os.Getenv("VDISKFS_TEST_RBD_POOL"); pool != "" {
		return pool
	}
	return "rbd"
}

var (
	buildMu sync.Mutex
	built   = map[bool]string{} // race → binary
)

// VdiskBinary builds cmd/vdisk once per test process (with -race when race
// is true, so a daemon under test runs under the race detector too, and
// with the build tag rbd when the tests have it) into a directory under
// os.TempDir(), and returns its path.
func VdiskBinary(t testing.TB, race bool) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := built[race]; ok {
		return bin
	}
	dir, err := os.MkdirTemp("", "vdisk-bin")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "vdisk")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	if rbdTag {
		args = append(args, "-tags", "rbd")
	}
	out, err := exec.Command("go", append(args, "github.com/vdiskfs/vdiskfs/cmd/vdisk")...).CombinedOutput()
	if err != nil {
		t.Fatalf("build vdisk: %v\n%s", fmt.Sprint(err), out)
	}
	built[race] = bin
	return bin
}
