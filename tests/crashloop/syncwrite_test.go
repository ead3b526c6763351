package crashloop

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// A synchronous write (O_SYNC, O_DSYNC, RWF_SYNC, RWF_DSYNC) is durable
// when it returns: with the commit timer at an hour, so that nothing but
// the write itself can have committed it, every such write must be there
// after kill -9 of the daemon and a remount. So must a fallocate on a
// handle opened with O_SYNC or O_DSYNC, and a plain write followed by
// `vdisk sync MOUNTPOINT`.

const slot = 1 << 20 // each case writes its own MiB of the disk

// syncCase is one synchronous change, made in slot slot of the disk.
type syncCase struct {
	name  string
	open  int  // open flags besides O_RDWR
	rwf   int  // pwritev2 flags; 0: pwrite
	over  bool // the slot holds fsynced data first: an overwrite in place
	skew  int  // byte offset into the slot: unaligned when not 0
	punch uint32
	// syncCmd: a plain write, then `vdisk sync MOUNTPOINT` (run first, so
	// that its commit covers no other case).
	syncCmd bool
}

var syncCases = []syncCase{
	{name: "plain, then vdisk sync", syncCmd: true},
	{name: "dsync", open: unix.O_DSYNC},
	{name: "sync", open: unix.O_SYNC},
	{name: "direct,dsync", open: unix.O_DIRECT | unix.O_DSYNC},
	{name: "direct,sync", open: unix.O_DIRECT | unix.O_SYNC},
	{name: "rwf_dsync", rwf: unix.RWF_DSYNC},
	{name: "rwf_sync", rwf: unix.RWF_SYNC},
	{name: "direct,rwf_dsync", open: unix.O_DIRECT, rwf: unix.RWF_DSYNC},
	{name: "dsync,unaligned", open: unix.O_DSYNC, skew: 100},
	{name: "over,dsync", open: unix.O_DSYNC, over: true},
	{name: "over,direct,dsync", open: unix.O_DIRECT | unix.O_DSYNC, over: true},
	{name: "over,direct,rwf_dsync", open: unix.O_DIRECT, rwf: unix.RWF_DSYNC, over: true},
	{name: "over,sync,unaligned", open: unix.O_SYNC, over: true, skew: 1000},
	{name: "punch,dsync", open: unix.O_DSYNC, over: true, punch: unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE},
	{name: "zero,sync", open: unix.O_SYNC, over: true, punch: unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE},
	// Last: a write past the end grows the disk; the size must last too.
	{name: "grow,direct,dsync", open: unix.O_DIRECT | unix.O_DSYNC},
}

// pattern is what case i writes (round 1) or what its slot held before
// (round 0): never zero, different for every case and round.
func pattern(i, round int) []byte {
	p := directio.AlignedBlock(slot)
	for j := range p {
		p[j] = byte(1 + (i*7+round*131+j/512)%251)
	}
	return p
}

func TestSyncWritesSurviveKill(t *testing.T) {
	testutil.RequireFUSE(t)
	bin := testutil.VdiskBinary(t, false)
	for _, transport := range []string{"auto", "dev"} {
		t.Run(transport, func(t *testing.T) { testSyncWrites(t, bin, transport) })
	}
}

func testSyncWrites(t *testing.T, bin, transport string) {
	dir := t.TempDir()
	store, mnt := filepath.Join(dir, "store.img"), filepath.Join(dir, "mnt")
	if out, err := exec.Command(bin, "format", store, "--size", "1G").CombinedOutput(); err != nil {
		t.Fatalf("format: %v: %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	d := mount(t, bin, store, mnt, "--commit-interval", "1h", "--fuse-transport", transport)
	t.Cleanup(func() { d.cmd.Process.Kill(); d.cmd.Wait() })
	disk := filepath.Join(mnt, "d.raw")
	grow := len(syncCases) - 1 // the growing case writes at the end
	f, err := os.OpenFile(disk, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(grow) * slot); err != nil {
		t.Fatal(err)
	}
	for i, c := range syncCases {
		if c.over {
			if _, err := f.WriteAt(pattern(i, 0), int64(i)*slot); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Sync(); err != nil { // the disk, its size and round 0 are durable
		t.Fatal(err)
	}
	f.Close()

	for i, c := range syncCases {
		if err := c.run(disk, i); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if c.syncCmd {
			if out, err := exec.Command(bin, "sync", mnt).CombinedOutput(); err != nil {
				t.Fatalf("vdisk sync: %v: %s", err, out)
			}
		}
	}
	// Nothing was fsynced and the timer is an hour away: only the
	// synchronous writes themselves can have made their changes durable.
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	d.cmd.Wait()
	unix.Unmount(mnt, unix.MNT_DETACH)

	d = mount(t, bin, store, mnt, "--fuse-transport", transport)
	got, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(grow+1) * slot; int64(len(got)) != want {
		t.Errorf("%s: disk is %d bytes after kill -9, want %d", syncCases[grow].name, len(got), want)
	}
	for i, c := range syncCases {
		lo := int64(i) * slot
		if lo+slot > int64(len(got)) {
			continue
		}
		if want := c.want(i); !bytes.Equal(got[lo:lo+slot], want) {
			j := 0
			for got[lo+int64(j)] == want[j] {
				j++
			}
			t.Errorf("%s: byte %d of its MiB is %#x after kill -9, want %#x (acknowledged by a synchronous call)", c.name, j, got[lo+int64(j)], want[j])
		}
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

// run makes case i's change in its slot and closes the file without fsync.
func (c syncCase) run(disk string, i int) error {
	f, err := os.OpenFile(disk, os.O_RDWR|c.open, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	off := int64(i)*slot + int64(c.skew)
	if c.punch != 0 {
		return unix.Fallocate(int(f.Fd()), c.punch, off, slot)
	}
	p := pattern(i, 1)[:slot-2*c.skew]
	var n int
	if c.rwf != 0 {
		n, err = unix.Pwritev2(int(f.Fd()), [][]byte{p}, off, c.rwf)
	} else {
		n, err = f.WriteAt(p, off)
	}
	if err == nil && n != len(p) {
		err = fmt.Errorf("short write: %d of %d", n, len(p))
	}
	return err
}

// want is what case i's slot must read after the crash.
func (c syncCase) want(i int) []byte {
	w := make([]byte, slot)
	if c.punch != 0 {
		return w
	}
	if c.over {
		copy(w, pattern(i, 0))
	}
	copy(w[c.skew:slot-c.skew], pattern(i, 1))
	return w
}
