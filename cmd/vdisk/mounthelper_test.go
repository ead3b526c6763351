package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// shDefaultPath is where mount.fuse3's /bin/sh looks for "vdisk": mount(8)
// clears PATH, so dash's built-in default applies.
var shDefaultPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// TestMountDashTFuseVdisk is issue 20's CI check, through the real tools:
// mount -t fuse.vdisk STORE MNT (mount(8) → mount.fuse3 → vdisk), a disk
// written with O_DIRECT and read back, umount MNT, and at once vdisk fsck
// STORE exits 0 (it waits for the closing daemon).
//
// mount.fuse3 finds vdisk on the shell's default PATH only. So as not to
// install anything on the machine, the test runs in a private mount
// namespace (unshare -m) in which a directory holding the freshly built
// binary is bind-mounted over the first directory of that PATH; the FUSE
// mount lives in that namespace too, and the script unmounts it whatever
// happens (the daemon then exits and the namespace goes).
func TestMountDashTFuseVdisk(t *testing.T) {
	requireFUSE(t)
	for _, tool := range []string{"unshare", "mount", "umount", "dd", "cmp"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
	}
	found := false
	for _, p := range []string{"/sbin/mount.fuse3", "/usr/sbin/mount.fuse3", "/sbin/mount.fuse", "/usr/sbin/mount.fuse"} {
		if _, err := os.Stat(p); err == nil {
			found = true
			break
		}
	}
	if !found {
		testutil.Missing(t, "no mount.fuse3 (package fuse3) here; tools/test.sh installs fuse3")
	}
	binDir := t.TempDir()
	src, err := os.ReadFile(vdiskBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "vdisk"), src, 0o755); err != nil {
		t.Fatal(err)
	}
	over := ""
	for _, d := range shDefaultPath {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			over = d
			break
		}
	}
	store := newStore(t)
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	script := `set -eu
mount --bind "$BIN_DIR" "$OVER"
mounted=
cleanup() { if [ -n "$mounted" ]; then umount "$MNT" || umount -l "$MNT"; fi; }
trap cleanup EXIT
mount -t fuse.vdisk -o allow_other,commit_interval=1s,nofail,x-systemd.before=libvirtd.service,log_file="$LOG" "$STORE" "$MNT"
mounted=1
grep " $MNT " /proc/self/mounts
dd if=/dev/urandom of="$DATA" bs=1M count=8 status=none
dd if="$DATA" of="$MNT/vm.raw" bs=1M oflag=direct status=none
dd if="$MNT/vm.raw" of="$DATA.back" bs=1M iflag=direct status=none
cmp "$DATA" "$DATA.back"
umount "$MNT"
mounted=
"$OVER/vdisk" fsck "$STORE"
echo "fsck exit $?"
`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	logFile := filepath.Join(dir, "mount.log")
	cmd.Env = append(os.Environ(), "BIN_DIR="+binDir, "OVER="+over, "MNT="+mnt, "STORE="+store, "LOG="+logFile,
		"DATA="+filepath.Join(dir, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("mount -t fuse.vdisk script: %v\n%s\ndaemon log:\n%s", err, out, log)
	}
	for _, want := range []string{store + " " + mnt + " fuse.vdiskfs", "allow_other", "result: clean (exit 0)", "fsck exit 0"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("script output lacks %q:\n%s", want, out)
		}
	}
	// Outside the namespace: the store is closed, and the disk is there.
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck: exit %d: %+v", code, res.Findings)
	}
	if d := diskByName(t, store, "vm.raw"); d.Size != 8<<20 {
		t.Fatalf("vm.raw: %d bytes", d.Size)
	}
	t.Logf("%s", out) // says whether fsck had to wait for the closing daemon
}
