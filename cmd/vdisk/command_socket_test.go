package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/telemetry"
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
