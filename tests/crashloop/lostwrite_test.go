package crashloop

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// A write that grew the disk from inside its last block, never fsynced,
// is lost when the daemon is killed: the disk keeps the size it had. Its
// bytes past that size must not show when the disk grows again: the
// crash loop found them in a snapshot taken after a later write had grown
// the disk past them.
func TestLostGrowingWriteAfterKill(t *testing.T) {
	testutil.RequireFUSE(t)
	bin := testutil.VdiskBinary(t, false)
	dir := t.TempDir()
	store, mnt := filepath.Join(dir, "store.img"), filepath.Join(dir, "mnt")
	if out, err := exec.Command(bin, "format", store, "--size", "1G").CombinedOutput(); err != nil {
		t.Fatalf("format: %v: %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	// The timer is an hour away: nothing commits but the fsync.
	d := mount(t, bin, store, mnt, "--commit-interval", "1h")
	t.Cleanup(func() { d.cmd.Process.Kill(); d.cmd.Wait() })
	disk := filepath.Join(mnt, "d.raw")
	const end = 4096 + 100 // inside block 1
	f, err := os.OpenFile(disk, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{1}, 2*4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(end); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{2}, 1000), end); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	d.cmd.Wait()
	unix.Unmount(mnt, unix.MNT_DETACH)

	d = mount(t, bin, store, mnt)
	if err := os.Truncate(disk, 4*4096); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	want := append(bytes.Repeat([]byte{1}, end), make([]byte, 4*4096-end)...)
	if !bytes.Equal(got, want) {
		j := 0
		for j < min(len(got), len(want)) && got[j] == want[j] {
			j++
		}
		t.Fatalf("after kill -9 and a truncate that grew the disk again, byte %d of %d is %#x, want %#x: the lost write shows past the old end (%d)",
			j, len(got), got[j], want[j], end)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("daemon exit after unmount: %v: %s", err, d.stderr)
	}
	if out, err := exec.Command(bin, "fsck", store).CombinedOutput(); err != nil {
		t.Fatalf("fsck: %v\n%s", err, out)
	}
}
