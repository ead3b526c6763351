package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

func requireFUSE(t *testing.T) { testutil.RequireFUSE(t) }

// mountInProcess runs `vdisk mount ... --foreground --ready-fd` in this
// process and returns once the mount is ready. The returned channel yields
// the exit code after the mount goes away; cleanup unmounts if needed.
func mountInProcess(t *testing.T, args ...string) (mnt string, exit <-chan result) {
	t.Helper()
	requireFUSE(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The mount closes the descriptor it is given: hand it a duplicate, so
	// that w's own finalizer cannot close a reused descriptor number.
	fd, err := unix.Dup(int(w.Fd()))
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	mnt = args[len(args)-1]
	done := make(chan result, 1)
	go func() {
		done <- vdisk(t, append(append([]string{"mount"}, args...), "--foreground", "--ready-fd", strconv.Itoa(fd))...)
	}()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		unix.Unmount(mnt, unix.MNT_DETACH)
		res := <-done
		t.Fatalf("mount did not become ready: exit %d: %s", res.code, res.stderr)
	}
	t.Cleanup(func() {
		unix.Unmount(mnt, unix.MNT_DETACH)
	})
	return mnt, done
}

func TestMountForeground(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	if got := readFileT(t, filepath.Join(mnt, "a.raw")); len(got) != 1<<20 {
		t.Fatalf("a.raw: %d bytes, want 1 MiB", len(got))
	}
	if err := os.WriteFile(filepath.Join(mnt, "b.raw"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	// vdisk stats reads the running mount, FUSE layer included.
	stats := mustRun(t, "stats", mnt).stdout
	for _, want := range []string{"b.raw", "requests in", "FUSE OP", "WRITE"} {
		if !strings.Contains(stats, want) {
			t.Errorf("vdisk stats lacks %q:\n%s", want, stats)
		}
	}
	// A second mount of the same store is refused, naming the holder.
	r := vdisk(t, "mount", store, filepath.Join(t.TempDir(), "mnt2"), "--foreground")
	if r.code != exitFailure || !strings.Contains(r.stderr, "vdisk mount") {
		t.Fatalf("second mount: exit %d: %s", r.code, r.stderr)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	out := mustRun(t, "ls", store).stdout
	if !strings.Contains(out, "b.raw") {
		t.Fatalf("b.raw not in the store after unmount:\n%s", out)
	}
}

func TestMountDefaultStore(t *testing.T) {
	home := t.TempDir()
	t.Setenv("XDG_DATA_HOME", home)
	mnt, exit := mountInProcess(t, "--default-size", "2G", filepath.Join(t.TempDir(), "mnt"))
	store := filepath.Join(home, "vdiskfs", "default.store")
	if err := os.WriteFile(filepath.Join(mnt, "d.raw"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if total := int64(st.Blocks) * st.Bsize; total < 1<<30 || total > 2<<30 {
		t.Fatalf("statfs of the default store: %d bytes", total)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	checkStore(t, store)
}

// vdiskBinary builds the vdisk binary once: the daemon and kill -9 tests
// need a real process.
func vdiskBinary(t *testing.T) string { return testutil.VdiskBinary(t, false) }

// TestMountDaemonKill9 is the fsync contract through the real daemon: write
// with O_DIRECT, fsync, kill -9 the daemon, mount again (which clears the
// dead mount), and the data is there; fsck is clean afterwards.
func TestMountDaemonKill9(t *testing.T) {
	requireFUSE(t)
	bin := vdiskBinary(t)
	store := newStore(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	pid := startDaemon(t, bin, store, mnt)

	data := directio.AlignedBlock(4 << 20)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	f, err := os.OpenFile(filepath.Join(mnt, "vm.raw"), os.O_CREATE|os.O_RDWR|syscall.O_DIRECT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// Written after the fsync: may or may not survive, but must not corrupt.
	f.WriteAt(data[:1<<20], 8<<20)
	killDaemon(t, pid)
	f.Close() // fails with ENOTCONN: the daemon is gone

	// Mount again in the foreground, through the real binary.
	stop := mountForeground(t, bin, store, mnt)
	got := readFileT(t, filepath.Join(mnt, "vm.raw"))
	if len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("fsynced data lost after kill -9 (%d bytes back)", len(got))
	}
	stop()
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck after kill -9 and remount: exit %d: %+v", code, res.Findings)
	}
}

// startDaemon mounts store at mnt with the real binary, which returns once
// the mount is ready and leaves the daemon in the background, and returns
// the daemon's pid. Cleanup detaches the mount if it is still there.
func startDaemon(t *testing.T, bin, store, mnt string) int {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), "mount.log")
	out, err := exec.Command(bin, "mount", store, mnt, "--log-file", logFile).CombinedOutput()
	if err != nil {
		t.Fatalf("vdisk mount: %v: %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	m := regexp.MustCompile(`pid (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no pid in %q", out)
	}
	pid, _ := strconv.Atoi(string(m[1]))
	return pid
}

// killDaemon kills the daemon pid with SIGKILL and returns once it is gone.
func killDaemon(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for !exited(pid) {
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
}

// mountForeground mounts store at mnt with the real binary in the
// foreground (which clears a dead mount left there by a killed daemon) and
// returns once the mount is ready. stop unmounts and waits for the daemon
// to exit, failing the test if it did not close the store cleanly.
func mountForeground(t *testing.T, bin, store, mnt string) (stop func()) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(bin, "mount", store, mnt, "--foreground", "--ready-fd", "3")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		cmd.Wait()
		t.Fatalf("mount failed: %s", stderr.String())
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) }) // when the test fails before stop
	return func() {
		t.Helper()
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("daemon exit: %v: %s", err, stderr.String())
		}
	}
}

func readFileT(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
