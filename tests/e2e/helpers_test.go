package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/internal/tcgguest"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// storeSize is the size of every test store (a sparse file on the ext4
// that holds t.TempDir()).
const storeSize = "8G"

func requireRoot(t *testing.T) { testutil.RequireFUSE(t) }

// --- Debian packages ------------------------------------------------------

// apt runs every apt-get of the tests: the package lists are updated at
// most once per test binary.
var apt tcgguest.Apt

// needTools makes sure each command is on PATH, installing the Debian
// package named after the colon ("fio:fio") when it is not, and fails the
// test when that is impossible: a missing tool never passes silently.
func needTools(t *testing.T, pairs ...string) {
	t.Helper()
	var pkgs []string
	for _, p := range pairs {
		cmd, pkg, _ := strings.Cut(p, ":")
		if _, err := exec.LookPath(cmd); err != nil {
			pkgs = append(pkgs, pkg)
		}
	}
	if len(pkgs) == 0 {
		return
	}
	if os.Geteuid() != 0 {
		t.Fatalf("missing %v and not root to install them", pkgs)
	}
	start := time.Now()
	if err := apt.Install(pkgs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("installed %v in %v", pkgs, time.Since(start).Round(time.Millisecond))
	for _, p := range pairs {
		cmd, pkg, _ := strings.Cut(p, ":")
		if _, err := exec.LookPath(cmd); err != nil {
			t.Fatalf("%s still missing after installing %s", cmd, pkg)
		}
	}
}

// --- commands ---------------------------------------------------------------

// run runs a command with a timeout and returns its combined output; it
// fails the test if the command fails.
func run(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	out, err := runErr(timeout, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// runErr runs a command with a timeout and returns its combined output.
func runErr(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v (%v)", timeout, err)
	}
	return string(out), err
}

// --- the vdisk binary, stores and mounts ------------------------------------

// vdiskBin builds cmd/vdisk once per test binary (with -race when the
// tests themselves are built with it, so that the daemon serving the real
// clients runs under the race detector too).
func vdiskBin(t *testing.T) string { return testutil.VdiskBinary(t, raceEnabled) }

// newStore formats a sparse store file in a fresh temporary directory.
func newStore(t *testing.T) string {
	t.Helper()
	store := filepath.Join(t.TempDir(), "test.store")
	run(t, time.Minute, vdiskBin(t), "format", store, "--size", storeSize)
	return store
}

// storeBlockSize is the block size of an unmounted store (vdisk info).
func storeBlockSize(t *testing.T, store string) int64 {
	t.Helper()
	var info struct {
		BlockSize int64 `json:"block_size"`
	}
	out := run(t, time.Minute, vdiskBin(t), "info", store, "--json")
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.BlockSize <= 0 {
		t.Fatalf("vdisk info --json: %v: %s", err, out)
	}
	return info.BlockSize
}

// fsckClean fails the test unless `vdisk fsck STORE` exits 0.
func fsckClean(t *testing.T, store string) {
	t.Helper()
	start := time.Now()
	out, err := runErr(2*time.Minute, vdiskBin(t), "fsck", store)
	if err != nil {
		t.Fatalf("vdisk fsck %s: %v\n%s", store, err, out)
	}
	t.Logf("vdisk fsck: clean in %v: %s", time.Since(start).Round(time.Millisecond), lastLine(out))
}

// mount is one `vdisk mount --foreground` daemon serving a store.
type mount struct {
	dir, store, log string
	cmd             *exec.Cmd
	exited          chan struct{}
	waitErr         error
}

// mountStore starts `vdisk mount STORE DIR --foreground --ready-fd 3
// [EXTRA...]` and returns once the daemon says ready. Cleanup unmounts
// (lazily if it must) and reaps the daemon, killing it only if it does not
// go.
func mountStore(t *testing.T, store, dir string, extra ...string) *mount {
	t.Helper()
	requireRoot(t)
	bin := vdiskBin(t)
	logf, err := os.CreateTemp(t.TempDir(), "mount-*.log")
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	m := &mount{dir: dir, store: store, log: logf.Name(), exited: make(chan struct{})}
	m.cmd = exec.Command(bin, append([]string{"mount", store, dir, "--foreground", "--ready-fd", "3"}, extra...)...)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	m.cmd.ExtraFiles = []*os.File{w}
	start := time.Now()
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start vdisk mount: %v", err)
	}
	w.Close()
	logf.Close()
	go func() {
		m.waitErr = m.cmd.Wait()
		close(m.exited)
	}()
	t.Cleanup(func() { m.cleanup(t) })

	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(r).ReadString('\n')
		r.Close()
		ready <- line
	}()
	select {
	case line := <-ready:
		if strings.TrimSpace(line) != "ready" {
			<-m.exited
			t.Fatalf("vdisk mount %s did not become ready (%v):\n%s", store, m.waitErr, m.logTail())
		}
	case <-time.After(time.Minute):
		t.Fatalf("vdisk mount %s: not ready after a minute:\n%s", store, m.logTail())
	}
	t.Logf("mounted %s at %s (pid %d) in %v", filepath.Base(store), dir, m.cmd.Process.Pid, time.Since(start).Round(time.Millisecond))
	return m
}

// unmount unmounts and checks that the daemon committed and exited 0.
func (m *mount) unmount(t *testing.T) {
	t.Helper()
	start := time.Now()
	var err error
	for i := 0; i < 50; i++ { // a client that just exited may still hold it
		if err = unix.Unmount(m.dir, 0); err != unix.EBUSY {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("umount %s: %v", m.dir, err)
	}
	select {
	case <-m.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("vdisk mount did not exit within 2 minutes of umount:\n%s", m.logTail())
	}
	if m.waitErr != nil {
		t.Fatalf("vdisk mount exited with %v after umount:\n%s", m.waitErr, m.logTail())
	}
	t.Logf("unmounted %s in %v (daemon exited 0)", m.dir, time.Since(start).Round(time.Millisecond))
}

// kill9 kills the daemon with SIGKILL, as a crash would, and waits for
// it; the mount point is left dead for the next mount to clear.
func (m *mount) kill9(t *testing.T) {
	t.Helper()
	if err := m.cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", m.cmd.Process.Pid, err)
	}
	select {
	case <-m.exited:
	case <-time.After(time.Minute):
		t.Fatalf("vdisk mount (pid %d) still there a minute after SIGKILL", m.cmd.Process.Pid)
	}
	t.Logf("killed vdisk mount (pid %d) with SIGKILL", m.cmd.Process.Pid)
}

func (m *mount) cleanup(t *testing.T) {
	select {
	case <-m.exited:
		if isMounted(m.dir) { // a killed daemon's dead mount, not cleared
			unix.Unmount(m.dir, unix.MNT_DETACH)
		}
	default:
		if unix.Unmount(m.dir, 0) != nil {
			unix.Unmount(m.dir, unix.MNT_DETACH)
		}
		select {
		case <-m.exited:
		case <-time.After(time.Minute):
			t.Errorf("vdisk mount (pid %d) still running a minute after umount: killing it", m.cmd.Process.Pid)
			m.cmd.Process.Kill()
			<-m.exited
		}
	}
	if t.Failed() {
		t.Logf("vdisk mount log (%s):\n%s", m.store, m.logTail())
	}
}

// logTail is the end of the daemon's log.
func (m *mount) logTail() string {
	b, _ := os.ReadFile(m.log)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// --- small things -------------------------------------------------------------

// usage returns the allocated bytes (st_blocks*512) and the apparent size
// of a file.
func usage(t *testing.T, path string) (allocated, apparent int64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512, st.Size
}

func mib(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// firstDiff is the index of the first differing byte, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// isMounted reports whether dir is a mount point in /proc/self/mounts.
func isMounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == dir {
			return true
		}
	}
	return false
}
