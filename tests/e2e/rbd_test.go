//go:build rbd

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// The tests of a store on a Ceph RBD image (build tag rbd), through the
// real daemon, on the cluster of testutil.RequireCeph (tools/test.sh starts
// one with tools/ceph/cluster.sh).

var rbdStoreSeq atomic.Int64

// newRBDStore formats a new 8 GiB store on an RBD image (thin: the cluster
// stores only what is written) and removes the image when the test ends.
func newRBDStore(t *testing.T) string {
	t.Helper()
	requireRoot(t)
	pool := testutil.RequireCeph(t)
	needTools(t, "rbd:ceph-common", "ceph:ceph-common")
	store := fmt.Sprintf("rbd:%s/store-%s-%d-%d", pool, t.Name(), os.Getpid(), rbdStoreSeq.Add(1))
	t.Cleanup(func() { // after the mounts' cleanups: they were registered later
		if err := backend.Remove(store); err != nil {
			t.Errorf("remove %s: %v", store, err)
		}
	})
	bin := vdiskBin(t)
	start := time.Now()
	run(t, time.Minute, bin, "format", store, "--size", storeSize)
	t.Logf("vdisk format %s --size %s: %v", store, storeSize, time.Since(start).Round(time.Millisecond))
	return store
}

// rbdLocker is the holder of an image's exclusive lock (rbd lock ls).
type rbdLocker struct {
	Client string `json:"locker"`
	Cookie string `json:"id"`
	Addr   string `json:"address"`
}

// rbdLockers lists the exclusive lock's holders of the store's image.
func rbdLockers(t *testing.T, store string) []rbdLocker {
	t.Helper()
	n, err := backend.ParseRBDName(store)
	if err != nil {
		t.Fatal(err)
	}
	var ls []rbdLocker
	out := run(t, time.Minute, "rbd", "lock", "ls", "--format", "json", n.ImageSpec())
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("rbd lock ls: %v: %s", err, out)
	}
	return ls
}

// blocklisted reports whether the cluster blocklists the client address.
func blocklisted(t *testing.T, addr string) bool {
	t.Helper()
	var bl []struct {
		Addr string `json:"addr"`
	}
	out := run(t, time.Minute, "ceph", "osd", "blocklist", "ls", "--format", "json")
	// The output holds "listed N entries" (stderr, which run joins) and,
	// after the list of addresses, one of ranges: decode the first list.
	i := strings.IndexByte(out, '[')
	if i < 0 {
		t.Fatalf("ceph osd blocklist ls: no list in %q", out)
	}
	if err := json.NewDecoder(strings.NewReader(out[i:])).Decode(&bl); err != nil {
		t.Fatalf("ceph osd blocklist ls: %v: %s", err, out)
	}
	for _, b := range bl {
		if b.Addr == addr {
			return true
		}
	}
	return false
}

// syncedFile is data written to a disk and fsync'ed: it must survive any
// crash of the daemon.
type syncedFile struct {
	path string
	data []byte
}

// writeSynced writes n random bytes (in pieces, some O_DIRECT, some
// buffered, at odd offsets) to a new disk and fsyncs it; then overwrites
// part of another disk without fsync, which may be lost but must not break
// anything.
func writeSynced(t *testing.T, mnt, name string, n int, seed uint64) syncedFile {
	t.Helper()
	data := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(data)
	path := filepath.Join(mnt, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data[:n/2], 0); err != nil {
		t.Fatal(err)
	}
	df, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()
	buf := directio.AlignedBlock(n - n/2)
	copy(buf, data[n/2:])
	if _, err := df.WriteAt(buf, int64(n/2)); err != nil {
		t.Fatalf("O_DIRECT write: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, name+".unsynced"), bytes.Repeat([]byte{0xee}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	return syncedFile{path: name, data: data}
}

// check fails the test unless the file reads back its data in the mount.
func (s syncedFile) check(t *testing.T, mnt, when string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(mnt, s.path))
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if i := firstDiff(got, s.data); i >= 0 {
		t.Fatalf("%s: %s differs from what was fsync'ed at byte %d (%d bytes, want %d)", when, s.path, i, len(got), len(s.data))
	}
}

// TestRBDStore is the life of a store on an RBD image: format, mount, the
// core file operations (O_DIRECT dd, sparse cp, punch and zero range,
// SEEK_HOLE, fsync), fio with crc32c verification, a second mount refused
// naming the holder, kill -9 and a --break-lock mount elsewhere that
// blocklists the dead daemon, every fsynced byte there, a kill -9 and a
// plain remount, and vdisk fsck clean.
func TestRBDStore(t *testing.T) {
	testStart := time.Now()
	needTools(t, "fio:fio")
	store := newRBDStore(t)
	bin := vdiskBin(t)
	mnt, mnt2 := filepath.Join(t.TempDir(), "mnt"), filepath.Join(t.TempDir(), "mnt2")
	m := mountStore(t, store, mnt)

	// O_DIRECT dd in and out.
	src := filepath.Join(t.TempDir(), "src")
	srcData := make([]byte, 64<<20)
	rand.NewChaCha8([32]byte{1}).Read(srcData)
	if err := os.WriteFile(src, srcData, 0o600); err != nil {
		t.Fatal(err)
	}
	dd := syncedFile{path: "dd.raw", data: srcData}
	run(t, time.Minute, "dd", "if="+src, "of="+filepath.Join(mnt, dd.path), "bs=1M", "oflag=direct", "conv=fsync", "status=none")
	run(t, time.Minute, "bash", "-c", fmt.Sprintf("set -o pipefail; dd if=%s bs=1M iflag=direct status=none | cmp - %s", filepath.Join(mnt, dd.path), src))

	// A sparse copy keeps its holes; SEEK_DATA and SEEK_HOLE find them.
	sparse := filepath.Join(t.TempDir(), "sparse.raw")
	run(t, time.Minute, "truncate", "-s", "64M", sparse)
	run(t, time.Minute, "dd", "if="+src, "of="+sparse, "bs=1M", "count=2", "seek=10", "conv=notrunc", "status=none")
	run(t, time.Minute, "cp", "--sparse=always", sparse, filepath.Join(mnt, "sparse.raw"))
	run(t, time.Minute, "cmp", sparse, filepath.Join(mnt, "sparse.raw"))
	if alloc, _ := usage(t, filepath.Join(mnt, "sparse.raw")); alloc != 2<<20 {
		t.Errorf("sparse copy: %d bytes allocated, want the 2 MiB of data", alloc)
	}
	sf, err := os.OpenFile(filepath.Join(mnt, "sparse.raw"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fd := int(sf.Fd())
	if off, err := unix.Seek(fd, 0, unix.SEEK_DATA); err != nil || off != 10<<20 {
		t.Errorf("SEEK_DATA 0 = %d, %v; want %d", off, err, 10<<20)
	}
	if off, err := unix.Seek(fd, 10<<20, unix.SEEK_HOLE); err != nil || off != 12<<20 {
		t.Errorf("SEEK_HOLE 10M = %d, %v; want %d", off, err, 12<<20)
	}
	// Punch the first MiB of the data, zero the next 4 KiB plus a bit.
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 10<<20, 1<<20); err != nil {
		t.Fatalf("punch hole: %v", err)
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 11<<20, 4096+512); err != nil {
		t.Fatalf("zero range: %v", err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
	sf.Close()
	want := make([]byte, 64<<20)
	copy(want[11<<20:12<<20], srcData[1<<20:2<<20])
	clear(want[11<<20 : 11<<20+4096+512])
	punched := syncedFile{path: "sparse.raw", data: want}
	punched.check(t, mnt, "after punch and zero range")
	if alloc, _ := usage(t, filepath.Join(mnt, "sparse.raw")); alloc > 1<<20 {
		t.Errorf("after punching 1 MiB of 2: %d bytes allocated", alloc)
	}

	// fio, verified, and durable (end_fsync) so that it must survive kill -9.
	fioJobs := [][]string{
		{"--name=seq-1m-qd16", "--filename=" + filepath.Join(mnt, "fio-seq.raw"), "--rw=write", "--bs=1M", "--iodepth=16",
			"--ioengine=io_uring", "--direct=1", "--size=128M", "--end_fsync=1"},
		{"--name=rand-4k-qd32", "--filename=" + filepath.Join(mnt, "fio-rand.raw"), "--rw=randwrite", "--bs=4k", "--iodepth=32",
			"--ioengine=libaio", "--direct=1", "--size=32M", "--end_fsync=1"},
	}
	for _, j := range fioJobs {
		run(t, time.Minute, "truncate", "-s", "256M", strings.TrimPrefix(j[1], "--filename="))
		runFio(t, strings.TrimPrefix(j[0], "--name="), append(j[1:], fioVerify...)...)
	}
	synced := writeSynced(t, mnt, "synced.raw", 8<<20, 2)
	checkAll := func(dir, when string) {
		t.Helper()
		for _, f := range []syncedFile{dd, punched, synced} {
			f.check(t, dir, when)
		}
		for _, j := range fioJobs {
			args := append([]string{"--filename=" + filepath.Join(dir, filepath.Base(strings.TrimPrefix(j[1], "--filename=")))}, j[2:]...)
			runFio(t, strings.TrimPrefix(j[0], "--name=")+"-verify_only", append(append(args, fioVerify...), "--verify_only=1")...)
		}
	}

	// A second mount, elsewhere and as another client, is refused naming
	// the holder (its client and address, and the owner record's pid), and
	// so is a read-only command.
	ls := rbdLockers(t, store)
	if len(ls) != 1 {
		t.Fatalf("rbd lock ls: %+v, want one exclusive lock", ls)
	}
	first := ls[0]
	for _, args := range [][]string{
		{"mount", store, mnt2, "--foreground", "--id", "second"},
		{"diff", store, "dd.raw", "sparse.raw"}, // a read-only command that opens the store itself
	} {
		out, err := runErr(time.Minute, bin, args...)
		if err == nil {
			t.Fatalf("vdisk %s while mounted: succeeded:\n%s", strings.Join(args, " "), out)
		}
		for _, want := range []string{"exclusive lock is held by " + first.Client, first.Addr, fmt.Sprintf("pid %d", m.cmd.Process.Pid)} {
			if !strings.Contains(out, want) {
				t.Errorf("vdisk %s while mounted: %v, and the message lacks %q:\n%s", strings.Join(args, " "), err, want, out)
			}
		}
		t.Logf("vdisk %s while mounted: %s", args[0], lastLine(out))
	}

	// A command that can go through the mount does, given the store's name.
	if out, err := runErr(time.Minute, bin, "ls", store); err != nil || !strings.Contains(out, "dd.raw") {
		t.Errorf("vdisk ls %s while mounted (through the mount): %v\n%s", store, err, out)
	}

	// kill -9, then take over with --break-lock at another mount point:
	// the dead daemon's client is blocklisted first.
	m.kill9(t)
	start := time.Now()
	m2 := mountStore(t, store, mnt2, "--break-lock")
	t.Logf("--break-lock mount after kill -9: %v", time.Since(start).Round(time.Millisecond))
	if log := m2.logTail(); !strings.Contains(log, "blocklisted the holder") || !strings.Contains(log, first.Addr) {
		t.Errorf("the --break-lock daemon's log does not say it blocklisted %s:\n%s", first.Addr, log)
	}
	if !blocklisted(t, first.Addr) {
		t.Errorf("the killed daemon's client %s %s is not blocklisted", first.Client, first.Addr)
	}
	checkAll(mnt2, "after kill -9 and --break-lock")

	// Once more without --break-lock: the dead holder's lock passes on when
	// the cluster notices it is gone (osd_client_watch_timeout).
	second := rbdLockers(t, store)
	m2.kill9(t)
	start = time.Now()
	m3 := mountStore(t, store, mnt)
	t.Logf("plain mount after kill -9: %v", time.Since(start).Round(time.Millisecond))
	if len(second) == 1 && !blocklisted(t, second[0].Addr) {
		t.Errorf("the killed daemon's client %s is not blocklisted after the lock passed on", second[0].Addr)
	}
	checkAll(mnt, "after kill -9 and a plain mount")
	m3.unmount(t)
	if ls := rbdLockers(t, store); len(ls) != 0 {
		t.Errorf("the lock is still held after a clean unmount: %+v", ls)
	}
	fsckClean(t, store)
	t.Logf("TestRBDStore: %v in all", time.Since(testStart).Round(time.Millisecond))
}

// TestRBDBreakLockFencesLiveHolder: --break-lock against a daemon that is
// alive (a host cut off, or hung) blocklists it: its writes fail from then
// on, so it can never touch the store again, and the new mount has every
// fsynced byte.
func TestRBDBreakLockFencesLiveHolder(t *testing.T) {
	store := newRBDStore(t)
	mnt1, mnt2 := filepath.Join(t.TempDir(), "mnt1"), filepath.Join(t.TempDir(), "mnt2")
	m1 := mountStore(t, store, mnt1)
	synced := writeSynced(t, mnt1, "a.raw", 4<<20, 3)
	holder := rbdLockers(t, store)

	m2 := mountStore(t, store, mnt2, "--break-lock")
	if len(holder) != 1 || !blocklisted(t, holder[0].Addr) {
		t.Fatalf("the first daemon's client (%+v) is not blocklisted", holder)
	}
	// The first daemon is fenced: an O_DIRECT overwrite reaches the
	// backing and fails, and so does the fsync after it.
	f, err := os.OpenFile(filepath.Join(mnt1, "a.raw"), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := directio.AlignedBlock(4096)
	_, werr := f.WriteAt(buf, 0)
	serr := f.Sync()
	f.Close()
	if werr == nil && serr == nil {
		t.Fatal("the fenced daemon's write and fsync succeeded")
	}
	t.Logf("the fenced daemon: write %v, fsync %v", werr, serr)
	synced.check(t, mnt2, "in the new mount")

	// The fenced daemon cannot close the store cleanly; it exits once
	// unmounted, and the new mount is unaffected.
	if err := unix.Unmount(mnt1, 0); err != nil {
		t.Fatalf("umount %s: %v", mnt1, err)
	}
	select {
	case <-m1.exited:
		t.Logf("the fenced daemon exited: %v", m1.waitErr)
	case <-time.After(2 * time.Minute):
		t.Fatal("the fenced daemon did not exit after its unmount")
	}
	synced.check(t, mnt2, "after the fenced daemon exited")
	m2.unmount(t)
	fsckClean(t, store)
}
