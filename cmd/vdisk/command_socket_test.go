package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/telemetry"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// -o socket_group=GROUP (and --socket-group) gives the mount's control
// socket to that group, 0660, whatever the umask; vdisk stats still works
// for root. An unknown group is a usage error before anything is mounted.
func TestMountSocketGroup(t *testing.T) {
	store := newStore(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	old := syscall.Umask(0)
	mnt, exit := mountInProcess(t, "-o", "socket_group=65534", store, mnt)
	syscall.Umask(old)
	fi, err := os.Lstat(telemetry.SocketPath(mnt))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Gid != 65534 {
		t.Errorf("socket: mode %v gid %d, want 0660 and gid 65534", fi.Mode(), st.Gid)
	}
	mustRun(t, "stats", mnt)
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}

	wantFail(t, exitFailure, []string{"--socket-group", "no-such-group-vdiskfs"},
		"mount", store, filepath.Join(t.TempDir(), "mnt2"), "--foreground", "--socket-group", "no-such-group-vdiskfs")
}

// runAsNobody runs the vdisk binary bin as user nobody (uid and gid
// 65534) with args, and returns its exit code and output.
func runAsNobody(t *testing.T, bin string, args ...string) (code int, out string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	b, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("vdisk %v as nobody: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), string(b)
}

// Another user, even one that may open the mount (allow_other), is told
// it may not use root's mount's control socket, whatever the daemon's
// umask; with the mount's socket
// group it may, but reads through the socket only the disks it could read
// through the mount.
func TestSocketOtherUserOfMount(t *testing.T) {
	requireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to run vdisk as another user")
	}
	open := testutil.SharedTempDir(t)
	data, err := os.ReadFile(vdiskBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(open, "vdisk")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	store := newStore(t)
	mustRun(t, "create", store, "secret.raw", "1M", "--mode", "0600")
	mustRun(t, "create", store, "pub.raw", "1M", "--mode", "0644")
	mnt := filepath.Join(open, "mnt")

	for _, group := range []bool{false, true} {
		args := []string{"--allow-other", store, mnt}
		if group {
			args = append([]string{"--socket-group", "65534"}, args...)
		}
		old := syscall.Umask(0) // a umask that must not widen the socket
		_, exit := mountInProcess(t, args...)
		syscall.Umask(old)
		code, out := runAsNobody(t, bin, "stats", mnt)
		if !group {
			sock := telemetry.SocketPath(mnt)
			if want := "permission denied: the socket of " + mnt + " (" + sock + ") admits only root; you are uid 65534"; code != exitFailure || !strings.Contains(out, want) {
				t.Errorf("nobody's vdisk stats: exit %d: %s; want %q", code, out, want)
			}
			if code, out := runAsNobody(t, bin, "send", filepath.Join(mnt, "pub.raw")); code != exitFailure || !strings.Contains(out, "permission denied") {
				t.Errorf("nobody's vdisk send of a 0644 disk without the socket group: exit %d: %s", code, out)
			}
		} else {
			if code != 0 {
				t.Errorf("vdisk stats of a member of the socket group: exit %d: %s", code, out)
			}
			if code, out := runAsNobody(t, bin, "send", filepath.Join(mnt, "secret.raw")); code != exitFailure ||
				!strings.Contains(out, `uid 65534 (nobody) may not read disk "secret.raw" (mode 0600`) {
				t.Errorf("vdisk send of a 0600 disk by a member of the socket group: exit %d: %s", code, out)
			}
			if code, out := runAsNobody(t, bin, "send", filepath.Join(mnt, "pub.raw")); code != 0 {
				t.Errorf("vdisk send of a 0644 disk by a member of the socket group: exit %d: %s", code, out)
			}
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Fatal(err)
		}
		if res := <-exit; res.code != 0 {
			t.Fatalf("mount exited %d: %s", res.code, res.stderr)
		}
	}
}
