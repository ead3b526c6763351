package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// vhost-user serves a disk of a mount on a socket and --stop ends it; ls
// shows where; with -o vhost_user_dir every disk is served as
// DIR/NAME.sock; a disk is served on one socket at a time; the sockets get
// the mount's socket group, 0660.
func TestVhostUserCommand(t *testing.T) {
	store := newStore(t)
	dir := t.TempDir()
	old := syscall.Umask(0)
	mnt, exit := mountInProcess(t, "-o", "socket_group=65534,vhost_user_dir="+dir, store, filepath.Join(t.TempDir(), "mnt"))
	syscall.Umask(old)
	if err := os.WriteFile(filepath.Join(mnt, "d.raw"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "m.raw"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	auto := filepath.Join(dir, "d.raw.sock")
	sock := filepath.Join(t.TempDir(), "asked.sock")
	// One socket per disk: m.raw, served from the directory, moves to sock
	// only once its own socket stops.
	wantFail(t, exitFailure, []string{"served on " + filepath.Join(dir, "m.raw.sock") + " already"}, "vhost-user", filepath.Join(mnt, "m.raw"), sock)
	mustRun(t, "vhost-user", "--stop", filepath.Join(dir, "m.raw.sock"))
	r := mustRun(t, "vhost-user", filepath.Join(mnt, "m.raw"), sock)
	if !strings.Contains(r.stdout, sock) {
		t.Errorf("vhost-user said %q", r.stdout)
	}
	for _, s := range []string{auto, sock} {
		fi, err := os.Lstat(s)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 || st.Gid != 65534 {
			t.Errorf("%s: mode %v gid %d, want a socket, 0660 and gid 65534", s, fi.Mode(), st.Gid)
		}
	}
	ls := mustRun(t, "ls", mnt).stdout
	if !strings.Contains(ls, "VHOST-USER") || !strings.Contains(ls, auto) || !strings.Contains(ls, sock) {
		t.Errorf("ls does not show the sockets:\n%s", ls)
	}
	wantFail(t, exitFailure, []string{"served there already"}, "vhost-user", filepath.Join(mnt, "d.raw"), sock)
	wantFail(t, exitFailure, []string{"missing.raw"}, "vhost-user", filepath.Join(mnt, "missing.raw"), filepath.Join(dir, "x.sock"))
	mustRun(t, "vhost-user", "--stop", sock)
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after --stop: %v", err)
	}
	wantFail(t, exitFailure, []string{"no vdiskfs mount serves"}, "vhost-user", "--stop", sock)
	wantFail(t, exitFailure, []string{"2 arguments"}, "vhost-user", filepath.Join(mnt, "d.raw"))
	// The auto socket follows a rename.
	if err := os.Rename(filepath.Join(mnt, "d.raw"), filepath.Join(mnt, "e.raw")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "e.raw.sock")); err != nil {
		t.Errorf("no socket for the renamed disk: %v", err)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("sockets left after the unmount: %v", left)
	}
}
