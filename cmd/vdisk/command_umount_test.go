package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUmountInProcess: vdisk umount of an in-process mount returns once the
// store is closed; fsck right after it is clean, and the data is there.
func TestUmountInProcess(t *testing.T) {
	store := newStore(t)
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	if err := os.WriteFile(filepath.Join(mnt, "a.raw"), bytes.Repeat([]byte("a"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	r := mustRun(t, "umount", mnt)
	if !strings.Contains(r.stdout, "closed") {
		t.Errorf("umount said %q", r.stdout)
	}
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck right after vdisk umount: exit %d: %+v", code, res.Findings)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	if d := diskByName(t, store, "a.raw"); d.Size != 1<<20 {
		t.Fatalf("a.raw: %d bytes after umount", d.Size)
	}
}

// TestUmountErrors: a directory that is not mounted, and a busy mount, fail
// with exit 8 and say why; the busy mount stays mounted and usable.
func TestUmountErrors(t *testing.T) {
	wantFail(t, exitFailure, []string{"is not mounted"}, "umount", t.TempDir())
	store := newStore(t)
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	f, err := os.Create(filepath.Join(mnt, "busy.raw"))
	if err != nil {
		t.Fatal(err)
	}
	wantFail(t, exitFailure, []string{"busy", "nothing was unmounted"}, "umount", mnt)
	if _, err := f.Write([]byte("still mounted")); err != nil {
		t.Fatalf("write after the refused umount: %v", err)
	}
	f.Close()
	mustRun(t, "umount", mnt)
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
}

// TestUmountDeadDaemonBusy: a mount whose daemon was killed while a file
// on it stays open (a hypervisor that has not noticed) cannot be unmounted
// plainly; vdisk umount says that nothing serves it and that umount -l
// detaches it, and after the detach the store mounts again.
func TestUmountDeadDaemonBusy(t *testing.T) {
	requireFUSE(t)
	bin := vdiskBinary(t)
	store := newStore(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	pid := startDaemon(t, bin, store, mnt)
	f, err := os.Create(filepath.Join(mnt, "vm.raw"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	killDaemon(t, pid)
	wantFail(t, exitFailure, []string{"busy", "no daemon serves it", "umount -l " + mnt}, "umount", mnt)
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Fatalf("umount -l: %v", err)
	}
	stop := mountForeground(t, bin, store, mnt)
	stop()
}

// TestUmountRemountLoop is issue 16's "umount must mean closed", through
// the real daemon: 20 rounds of mount, write, unmount. Odd rounds unmount
// with plain umount(2) and mount again at once (vdisk mount waits for the
// closing daemon); even rounds use vdisk umount and run fsck at once (clean
// without any wait). Every round's data is there in the next.
func TestUmountRemountLoop(t *testing.T) {
	requireFUSE(t)
	bin := vdiskBinary(t)
	store := newStore(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	logFile := filepath.Join(t.TempDir(), "mount.log")
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	mount := func(round int) {
		t.Helper()
		out, err := exec.Command(bin, "mount", store, mnt, "--log-file", logFile).CombinedOutput()
		if err != nil {
			log, _ := os.ReadFile(logFile)
			t.Fatalf("round %d: vdisk mount: %v: %s\nlog:\n%s", round, err, out, log)
		}
	}
	mount(0)
	for round := 1; round <= 20; round++ {
		name := filepath.Join(mnt, "r"+string(rune('a'+round))+".raw")
		data := bytes.Repeat([]byte{byte(round)}, 256<<10)
		if err := os.WriteFile(name, data, 0o644); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if round%2 == 1 {
			if err := unix.Unmount(mnt, 0); err != nil {
				t.Fatalf("round %d: umount: %v", round, err)
			}
		} else {
			out, err := exec.Command(bin, "umount", mnt).CombinedOutput()
			if err != nil {
				t.Fatalf("round %d: vdisk umount: %v: %s", round, err, out)
			}
			if res, code := fsckJSON(t, store); code != exitOK {
				t.Fatalf("round %d: fsck right after vdisk umount: exit %d: %+v", round, code, res.Findings)
			}
		}
		mount(round)
		if got := readFileT(t, name); !bytes.Equal(got, data) {
			t.Fatalf("round %d: %s lost its data after the remount", round, name)
		}
	}
	// A plain umount and, at once, fsck: it waits for the closing daemon.
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck right after umount: exit %d: %+v", code, res.Findings)
	}
}

// The systemd unit is Type=notify: the foreground daemon sends READY=1 to
// $NOTIFY_SOCKET once the mount is usable, and the unit's ExecStop (vdisk
// umount) then closes it.
func TestMountNotifiesSystemd(t *testing.T) {
	requireFUSE(t)
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	store := newStore(t)
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), "READY=1") {
		t.Fatalf("notify socket: %q, %v", buf[:n], err)
	}
	mustRun(t, "umount", mnt)
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
}
