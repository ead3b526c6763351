// Package testutil holds what the mount-level test suites share: the rule
// for tests that need FUSE (skip outside CI, fail in CI), and building the
// vdisk binary once per test process for tests that need a real daemon.
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

var (
	buildMu sync.Mutex
	built   = map[bool]string{} // race → binary
)

// VdiskBinary builds cmd/vdisk once per test process (with -race when race
// is true, so a daemon under test runs under the race detector too) into a
// directory under os.TempDir(), and returns its path.
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
	out, err := exec.Command("go", append(args, "github.com/vdiskfs/vdiskfs/cmd/vdisk")...).CombinedOutput()
	if err != nil {
		t.Fatalf("build vdisk: %v\n%s", fmt.Sprint(err), out)
	}
	built[race] = bin
	return bin
}
