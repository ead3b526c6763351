// Package testutil holds what the test suites share: the rule for tests
// whose prerequisite is missing (Missing: skip outside CI, fail in CI), for
// FUSE and a Ceph cluster in particular, and building the vdisk binary once per
// test process for tests that need a real daemon.
package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Missing is the one rule for a test whose prerequisite (FUSE, a tool, a
// kernel feature) this machine lacks: it skips the test, and fails it
// instead when CI=true, where everything the suite needs is installed
// (tools/test.sh) and a skip would hide a test that never ran.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true, and this test's prerequisite is missing: %s", why)
	}
	t.Skipf("prerequisite missing: %s", why)
}

// RequireFUSE skips the test when this process cannot serve FUSE (not
// root, or no /dev/fuse) and fails it instead when CI=true, where mounts
// must run for real (Missing).
func RequireFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "this test mounts and needs root")
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		Missing(t, "this test mounts and needs /dev/fuse: %v", err)
	}
}

// RequireCeph returns the pool the RBD tests (build tag rbd) make their
// images in: $VDISKFS_TEST_RBD_POOL, default rbd, on the cluster CEPH_CONF
// names (tools/ceph/cluster.sh start prints it). Without CEPH_CONF the test
// skips, and fails instead when CI=true, where tools/test.sh starts a
// cluster: a cluster that did not start never passes as a skip.
func RequireCeph(t testing.TB) string {
	t.Helper()
	if os.Getenv("CEPH_CONF") == "" {
		Missing(t, "no Ceph cluster: CEPH_CONF is not set (eval \"$(tools/ceph/cluster.sh start)\" sets it; in CI tools/test.sh starts one)")
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

// SharedTempDir makes a directory, removed at the test's end, that every
// user may enter (0755), for a test that runs a program as another user:
// under os.TempDir() when every directory above it lets others in (as
// tools/test.sh arranges), else under /tmp.
func SharedTempDir(t testing.TB) string {
	t.Helper()
	parent := os.TempDir()
	for d := parent; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			parent = "/tmp"
			break
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	dir, err := os.MkdirTemp(parent, "vdiskfs-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Seed is the seed of a randomised test: $VDISK_SEED when set (to replay
// a failure from its log), else a random one. It logs the seed with the
// command-line setting that replays it.
func Seed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if v := os.Getenv("VDISK_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("VDISK_SEED=%q: %v", v, err)
		}
		seed = n
	}
	t.Logf("seed %d (VDISK_SEED=%d replays it)", seed, seed)
	return seed
}

// SocketPair returns the two ends of a Unix stream socket pair, closed at
// the end of the test.
func SocketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// HugePages makes sure the kernel's pool holds n free 2 MiB hugetlb pages
// (what a VM's huge-page memory comes from): as root it grows
// vm.nr_hugepages by what is missing and shrinks it back at cleanup;
// without root, or when the kernel cannot find the pages, the
// prerequisite is missing (Missing).
func HugePages(t testing.TB, n int) {
	t.Helper()
	free, total, err := hugePagesFree()
	if err != nil {
		Missing(t, "hugetlb pages: %v", err)
	}
	if free >= n {
		return
	}
	if os.Geteuid() != 0 {
		Missing(t, "%d free 2 MiB huge pages (%d free; as root the test reserves them)", n, free)
	}
	set := func(pages int) error {
		return os.WriteFile(hugePagesDir+"nr_hugepages", []byte(strconv.Itoa(pages)), 0)
	}
	if err := set(total + n - free); err != nil {
		Missing(t, "reserving %d huge pages: %v", n-free, err)
	}
	t.Cleanup(func() {
		if err := set(total); err != nil {
			t.Errorf("giving the huge pages back (vm.nr_hugepages=%d): %v", total, err)
		}
	})
	if free, _, err = hugePagesFree(); err != nil || free < n {
		Missing(t, "%d free 2 MiB huge pages: the kernel found %d (%v)", n, free, err)
	}
}

// hugePagesDir holds the kernel's counters of its 2 MiB hugetlb pool.
const hugePagesDir = "/sys/kernel/mm/hugepages/hugepages-2048kB/"

// hugePagesFree reads the free and total 2 MiB hugetlb pages.
func hugePagesFree() (free, total int, err error) {
	read := func(name string) (int, error) {
		b, err := os.ReadFile(hugePagesDir + name)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if free, err = read("free_hugepages"); err != nil {
		return 0, 0, err
	}
	total, err = read("nr_hugepages")
	return free, total, err
}
