package fs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
)

// Shared blocks through the mount (issue 18): copy_file_range shares,
// snapshots are read-only and show up at once.

// statfsUsed is the store's use as df shows it.
func statfsUsed(t *testing.T, mnt string) int64 {
	t.Helper()
	sf := statfsOf(t, mnt)
	return int64(sf.Blocks-sf.Bfree) * sf.Bsize
}

// storeStat is Store.Stat, failing the test when the disk is missing.
func (tc *testCase) storeStat(name string) image.DiskInfo {
	tc.t.Helper()
	info, err := tc.store.Stat(name)
	if err != nil {
		tc.t.Fatal(err)
	}
	return info
}

// patchFile writes p at off into the file at path (which must exist) and
// fsyncs it. The sync matters to what the store reports: the blocks a
// write over shared blocks unmapped lose their reference only once that is
// committed, and until then Store.Info counts them as free (a quirk of
// package image: the quarantine is taken to be free whatever its counts).
func patchFile(t *testing.T, path string, p []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCpShares is issue 18's first must-show, with the real cp: 256 MiB of
// random data in a.raw (32 MiB with -short); cp a.raw b.raw reads equal,
// writes no data to the backing and grows df by at most 4 MiB; both disks
// show all their blocks in st_blocks; 1 MiB written into b.raw (unaligned,
// so both edge blocks are read-modify-written from the shared copy) leaves
// a.raw as it was, and so do aligned O_DIRECT writes into a.raw (which the
// io_uring queue threads may serve) for b.raw; after a remount both still
// share what neither overwrote, and read the same.
// The store is checked at the remount and at cleanup (what fsck runs).
func TestCpShares(t *testing.T) {
	size := int64(256 << 20)
	if testing.Short() {
		size = 32 << 20
	}
	forTransports(t, func(t *testing.T, tr Transport) {
		tc := newTestCase(t, withMountOptions(Options{Transport: tr}))
		src := filepath.Join(tc.dir, "src.raw")
		writeRandomFile(t, src, size, 18)
		run(t, "cp", src, tc.path("a.raw"))
		used := statfsUsed(t, tc.mnt)
		before := tc.store.Counters()
		start := time.Now()
		run(t, "cp", tc.path("a.raw"), tc.path("b.raw"))
		took := time.Since(start)
		after := tc.store.Counters()
		grew := statfsUsed(t, tc.mnt) - used
		ops := tc.srv.OpMetrics()["COPY_FILE_RANGE"].Count
		t.Logf("cp of %d MiB: %v, %d COPY_FILE_RANGE, df used +%d bytes, backend data writes %d bytes, metadata writes %d bytes",
			size>>20, took.Round(time.Millisecond), ops, grew, after.DataWriteBytes-before.DataWriteBytes, after.MetaWriteBytes-before.MetaWriteBytes)
		if ops == 0 {
			t.Fatal("cp sent no COPY_FILE_RANGE")
		}
		if grew > 4<<20 {
			t.Errorf("df used grew by %d bytes for a shared copy, want at most 4 MiB", grew)
		}
		if n := after.DataWriteBytes - before.DataWriteBytes; n != 0 {
			t.Errorf("the copy of whole blocks wrote %d data bytes to the backing", n)
		}
		sameFiles(t, tc.path("a.raw"), tc.path("b.raw"))
		for _, name := range []string{"a.raw", "b.raw"} {
			if st := stat(t, tc.path(name)); st.Size != size || st.Blocks*512 != size {
				t.Errorf("%s: size %d, st_blocks %d: want every mapped block counted", name, st.Size, st.Blocks)
			}
		}
		if b := tc.storeStat("b.raw"); !b.Clone || b.Origin != "a.raw" || b.Shared != size {
			t.Errorf("b.raw: clone %v of %q, %d bytes shared; want a clone of a.raw sharing %d", b.Clone, b.Origin, b.Shared, size)
		}

		patch := make([]byte, 1<<20)
		newPRNGReader(19).Read(patch)
		const at = 3<<20 + 512
		used = statfsUsed(t, tc.mnt)
		patchFile(t, tc.path("b.raw"), patch, at)
		if grew := statfsUsed(t, tc.mnt) - used; grew < 1<<20 || grew > 2<<20 {
			t.Errorf("1 MiB written over shared blocks grew df by %d bytes, want its own new blocks (1 MiB + 4 KiB)", grew)
		}
		wantB := filepath.Join(tc.dir, "want-b.raw")
		run(t, "cp", src, wantB)
		patchFile(t, wantB, patch, at)
		sameFiles(t, src, tc.path("a.raw"))

		// Aligned O_DIRECT writes over a.raw's shared blocks, which the
		// io_uring queue threads may serve themselves (ownerIO): b.raw
		// keeps the old blocks.
		direct := directio.AlignedBlock(64 << 10)
		newPRNGReader(20).Read(direct)
		const directAt = 8 << 20
		var ownerWrites uint64
		if tc.srv.ring != nil {
			_, ownerWrites = tc.srv.ring.OwnerIO()
		}
		f, err := os.OpenFile(tc.path("a.raw"), os.O_WRONLY|unix.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := int64(0); i < 4; i++ {
			if _, err := f.WriteAt(direct[i<<14:(i+1)<<14], directAt+i<<14); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil { // before the remount, which would wait for it
			t.Fatal(err)
		}
		if tc.srv.ring != nil {
			_, w := tc.srv.ring.OwnerIO()
			t.Logf("%d of the 4 O_DIRECT writes over shared blocks were served by the queue threads", w-ownerWrites)
		}
		wantA := filepath.Join(tc.dir, "want-a.raw")
		run(t, "cp", src, wantA)
		patchFile(t, wantA, direct, directAt)

		check := func(when string) {
			t.Helper()
			sameFiles(t, wantA, tc.path("a.raw"))
			sameFiles(t, wantB, tc.path("b.raw"))
			written := int64(1<<20/4096+1)*4096 + int64(len(direct)) // the blocks the writes gave new blocks
			for _, name := range []string{"a.raw", "b.raw"} {
				if info := tc.storeStat(name); info.Shared != size-written || info.Allocated != size {
					t.Errorf("%s %s: %d of %d bytes shared, want %d of %d", when, name, info.Shared, info.Allocated, size-written, size)
				}
			}
		}
		check("before the remount")
		tc.remount()
		check("after the remount")
	})
}

// copyRange is copy_file_range(2) between two files at explicit offsets.
func copyRange(t *testing.T, in *os.File, offIn int64, out *os.File, offOut int64, n int) (int, error) {
	t.Helper()
	return unix.CopyFileRange(int(in.Fd()), &offIn, int(out.Fd()), &offOut, n, 0)
}

// TestCopyFileRange: the cases of copy_file_range(2) the kernel hands to
// us, against what a plain byte copy would leave. A whole disk into an
// empty one is a clone (its partial last block copied); offsets placed
// alike in their blocks share the whole blocks between partial edges;
// differently placed ones copy bytes; a copy within one disk works; past
// the source's end nothing is copied; one call copies at most 1 GiB; a
// target opened O_DSYNC is committed before the reply.
func TestCopyFileRange(t *testing.T) {
	tc := newTestCase(t, withStoreOptions(image.Options{CommitInterval: -1}))
	const size = 8<<20 + 100
	data := make([]byte, size)
	newPRNGReader(20).Read(data)
	if err := os.WriteFile(tc.path("a.raw"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	a := tc.openFile("a.raw", os.O_RDONLY, 0)
	newDisk := func(name string, flags int) *os.File {
		return tc.openFile(name, os.O_CREATE|os.O_RDWR|flags, 0o644)
	}
	wantContent := func(name string, want []byte) {
		t.Helper()
		if got := readAll(t, tc.path(name)); !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes do not read as the %d expected", name, len(got), len(want))
		}
	}

	// The whole disk, asking for far more than there is.
	c := newDisk("c.raw", 0)
	if n, err := copyRange(t, a, 0, c, 0, 1<<40); err != nil || n != size {
		t.Fatalf("whole-disk copy: %d, %v; want %d", n, err, size)
	}
	wantContent("c.raw", data)
	if info := tc.storeStat("c.raw"); !info.Clone || info.Origin != "a.raw" || info.Shared != 8<<20 || info.Allocated != 8<<20+4096 {
		t.Errorf("c.raw: clone %v of %q, %d of %d bytes shared; want a clone of a.raw sharing 8 MiB of 8 MiB + 4 KiB", info.Clone, info.Origin, info.Shared, info.Allocated)
	}
	if n, err := copyRange(t, a, size, c, 0, 4096); err != nil || n != 0 {
		t.Errorf("copy from the source's end: %d, %v; want 0", n, err)
	}

	// Alike in their blocks (7 bytes in): partial head and tail copied,
	// the 511 blocks between shared.
	d := newDisk("d.raw", 0)
	want := make([]byte, 8192+7+2<<20)
	copy(want[8192+7:], data[4096+7:4096+7+2<<20])
	if n, err := copyRange(t, a, 4096+7, d, 8192+7, 2<<20); err != nil || n != 2<<20 {
		t.Fatalf("copy placed alike: %d, %v", n, err)
	}
	wantContent("d.raw", want)
	if info := tc.storeStat("d.raw"); info.Shared != 511*4096 || info.Clone {
		t.Errorf("d.raw: %d bytes shared, clone %v; want 511 blocks, no clone", info.Shared, info.Clone)
	}
	// Placed differently: bytes copied, nothing shared.
	e := newDisk("e.raw", 0)
	want = make([]byte, 5000+1<<20)
	copy(want[5000:], data[1000:1000+1<<20])
	if n, err := copyRange(t, a, 1000, e, 5000, 1<<20); err != nil || n != 1<<20 {
		t.Fatalf("copy placed differently: %d, %v", n, err)
	}
	wantContent("e.raw", want)
	if info := tc.storeStat("e.raw"); info.Shared != 0 {
		t.Errorf("e.raw: %d bytes shared after a byte copy", info.Shared)
	}
	// Within one disk: 1 MiB of c.raw onto its own 6 MiB.
	if n, err := copyRange(t, c, 0, c, 6<<20, 1<<20); err != nil || n != 1<<20 {
		t.Fatalf("copy within a disk: %d, %v", n, err)
	}
	want = bytes.Clone(data)
	copy(want[6<<20:], data[:1<<20])
	wantContent("c.raw", want)
	_, err := copyRange(t, c, 0, c, 4096, 1<<20)
	wantErrno(t, "overlapping copy within a disk", err, unix.EINVAL)

	// One call copies at most 1 GiB: 3 GiB, 1 MiB of data at 2.5 GiB.
	big := newDisk("big.raw", 0)
	if err := big.Truncate(3 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := big.WriteAt(data[:1<<20], 5<<29); err != nil {
		t.Fatal(err)
	}
	big2 := newDisk("big2.raw", 0)
	var calls []int
	for off := int64(0); off < 3<<30; {
		n, err := copyRange(t, big, off, big2, off, 3<<30)
		if err != nil || n == 0 {
			t.Fatalf("copy of big.raw at %d: %d, %v", off, n, err)
		}
		calls = append(calls, n)
		off += int64(n)
	}
	if !slices.Equal(calls, []int{1 << 30, 1 << 30, 1 << 30}) {
		t.Errorf("copy of 3 GiB: calls copied %v, want 1 GiB each", calls)
	}
	got := make([]byte, 1<<20)
	if _, err := big2.ReadAt(got, 5<<29); err != nil || !bytes.Equal(got, data[:1<<20]) {
		t.Errorf("big2.raw does not read big.raw's data: %v", err)
	}
	if info := tc.storeStat("big2.raw"); info.Size != 3<<30 || info.Allocated != 1<<20 || info.Shared != 1<<20 {
		t.Errorf("big2.raw: size %d, %d allocated, %d shared; want 3 GiB with the 1 MiB of data shared", info.Size, info.Allocated, info.Shared)
	}

	// O_DSYNC target: committed before the reply; a plain one is not.
	commits := tc.store.Counters().Commits
	plain := newDisk("plain.raw", 0)
	if _, err := copyRange(t, a, 0, plain, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if n := tc.store.Counters().Commits; n != commits {
		t.Errorf("a copy into a plain handle committed (%d commits, %d before)", n, commits)
	}
	dsync := newDisk("dsync.raw", unix.O_DSYNC)
	if _, err := copyRange(t, a, 0, dsync, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if n := tc.store.Counters().Commits; n == commits {
		t.Error("a copy into an O_DSYNC handle returned uncommitted")
	}
}

// TestQemuImgConvertCopyOffload: qemu-img convert -C (copy offloading)
// into a new disk uses copy_file_range, which shares: the target reads
// the same, maps the source's blocks, and the backing gets no data but the
// first block that QEMU writes into every new raw image.
func TestQemuImgConvertCopyOffload(t *testing.T) {
	requireFUSE(t)
	requireTool(t, "qemu-img", "qemu-utils")
	tc := newTestCase(t)
	src := filepath.Join(tc.dir, "src.raw")
	data := sparseSource(t, src, 64, [][2]int64{{0, 8}, {20, 21}, {40, 56}}, -1)
	run(t, "cp", src, tc.path("a.raw"))
	used := statfsUsed(t, tc.mnt)
	before := tc.store.Counters()
	run(t, "qemu-img", "convert", "-C", "-f", "raw", "-O", "raw", tc.path("a.raw"), tc.path("q.raw"))
	after := tc.store.Counters()
	run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", tc.path("a.raw"), tc.path("q.raw"))
	sameFiles(t, src, tc.path("q.raw"))
	grew := statfsUsed(t, tc.mnt) - used
	written := after.DataWriteBytes - before.DataWriteBytes
	t.Logf("qemu-img convert -C: %d COPY_FILE_RANGE, df +%d bytes, %d data bytes written", tc.srv.OpMetrics()["COPY_FILE_RANGE"].Count, grew, written)
	if info := tc.storeStat("q.raw"); info.Shared != data || info.Allocated != data {
		t.Errorf("q.raw: %d of %d bytes shared, want all %d bytes of data", info.Shared, info.Allocated, data)
	}
	if grew > 4<<20 || written > 64<<10 {
		t.Errorf("convert -C: df grew %d bytes, %d data bytes written; want a shared copy", grew, written)
	}
}

// TestSnapshotOnMount: a snapshot taken through Server.Snapshot shows in
// the mount at once (also after a lookup that found no such name); opens
// for writing and truncates fail with EROFS; it reads as the disk read at
// the call while the disk goes on changing; cp of it over the disk rolls
// the disk back (a clone again, its own blocks freed); chmod, rename, cp
// from it (into a writable clone) and unlink work; it costs no space.
func TestSnapshotOnMount(t *testing.T) {
	tc := newTestCase(t)
	data := make([]byte, 8<<20)
	newPRNGReader(21).Read(data)
	if err := os.WriteFile(tc.path("a.raw"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	snap := tc.path("a-snap")
	if _, err := os.Stat(snap); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of the name before the snapshot: %v", err)
	}
	used := statfsUsed(t, tc.mnt)
	info, err := tc.srv.Snapshot("a.raw", "a-snap")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Snapshot || info.OriginID == 0 || info.Size != int64(len(data)) {
		t.Errorf("snapshot info %+v", info)
	}
	if st := stat(t, snap); st.Size != int64(len(data)) || st.Blocks*512 != int64(len(data)) || st.Mode&0o777 != 0o644 {
		t.Errorf("a-snap: size %d, st_blocks %d, mode %o", st.Size, st.Blocks, st.Mode)
	}
	ents, err := os.ReadDir(tc.mnt)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ents, func(e os.DirEntry) bool { return e.Name() == "a-snap" }) {
		t.Errorf("readdir does not list the snapshot: %v", ents)
	}
	if grew := statfsUsed(t, tc.mnt) - used; grew > 64<<10 {
		t.Errorf("the snapshot took %d bytes of the store", grew)
	}

	for _, fl := range []int{os.O_RDWR, os.O_WRONLY, os.O_WRONLY | os.O_TRUNC, os.O_RDONLY | os.O_TRUNC, os.O_RDWR | os.O_CREATE} {
		f, err := os.OpenFile(snap, fl, 0)
		if err == nil {
			f.Close()
		}
		wantErrno(t, "open of the snapshot with flags "+openFlags(fl), err, unix.EROFS)
	}
	wantErrno(t, "truncate of the snapshot", os.Truncate(snap, 0), unix.EROFS)

	// a.raw goes on changing; the snapshot does not.
	patchFile(t, tc.path("a.raw"), bytes.Repeat([]byte{0xaa}, 1<<20), 100)
	if err := os.Truncate(tc.path("a.raw"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, snap); !bytes.Equal(got, data) {
		t.Fatal("the snapshot changed with its origin")
	}
	// Roll back: cp of the snapshot over its origin (O_TRUNC, then one
	// copy of the whole disk) makes the origin a clone of the snapshot.
	// (Commits before each statfs: until then the store counts blocks
	// waiting for their release as free, shared or not.)
	if err := tc.store.Commit(); err != nil {
		t.Fatal(err)
	}
	used = statfsUsed(t, tc.mnt)
	run(t, "cp", snap, tc.path("a.raw"))
	if got := readAll(t, tc.path("a.raw")); !bytes.Equal(got, data) {
		t.Fatal("a.raw does not read as the snapshot after cp back")
	}
	if a := tc.storeStat("a.raw"); !a.Clone || a.Origin != "a-snap" || a.Shared != int64(len(data)) {
		t.Errorf("a.raw after cp of its snapshot over it: %+v", a)
	}
	if err := tc.store.Commit(); err != nil {
		t.Fatal(err)
	}
	// a.raw had 1 MiB of blocks of its own (the patch, cut to 1 MiB).
	if grew := statfsUsed(t, tc.mnt) - used; grew != -(1 << 20) {
		t.Errorf("rolling back changed the use by %d bytes, want -1 MiB: the blocks a.raw had of its own are freed", grew)
	}

	if err := os.Chmod(snap, 0o400); err != nil {
		t.Errorf("chmod of a snapshot: %v", err)
	}
	if st := stat(t, snap); st.Mode&0o777 != 0o400 {
		t.Errorf("mode after chmod: %o", st.Mode&0o777)
	}
	if err := os.Rename(snap, tc.path("a-snap2")); err != nil {
		t.Fatal(err)
	}
	run(t, "cp", tc.path("a-snap2"), tc.path("clone.raw"))
	patchFile(t, tc.path("clone.raw"), []byte("written"), 4096)
	if c := tc.storeStat("clone.raw"); c.Snapshot || !c.Clone || c.Origin != "a-snap2" {
		t.Errorf("cp of a snapshot: %+v, want a writable clone of a-snap2", c)
	}
	if got := readAll(t, tc.path("a-snap2")); !bytes.Equal(got, data) {
		t.Fatal("the snapshot changed when its clone was written")
	}
	if err := os.Remove(tc.path("a-snap2")); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.srv.Snapshot("a.raw", "clone.raw"); !errors.Is(err, image.ErrExist) {
		t.Errorf("snapshot onto an existing name: %v", err)
	}
	if _, err := tc.srv.Snapshot("missing.raw", "x"); !errors.Is(err, image.ErrNotExist) {
		t.Errorf("snapshot of a missing disk: %v", err)
	}
}

// openFlags names the access mode and the flags tests use.
func openFlags(fl int) string {
	s := map[int]string{os.O_RDONLY: "O_RDONLY", os.O_WRONLY: "O_WRONLY", os.O_RDWR: "O_RDWR"}[fl&unix.O_ACCMODE]
	if fl&os.O_TRUNC != 0 {
		s += "|O_TRUNC"
	}
	if fl&os.O_CREATE != 0 {
		s += "|O_CREAT"
	}
	return s
}

// TestStatfsAfterRemovingClones: removing clones frees none of the blocks
// their origin still maps. statfs never shows more free than the store has
// while the removals wait for their commit (Store.Info counts the blocks
// they unmapped as free until then), and after the commit the use is the
// origin's blocks again.
func TestStatfsAfterRemovingClones(t *testing.T) {
	tc := newTestCase(t, withStoreOptions(image.Options{CommitInterval: -1}))
	data := make([]byte, 8<<20)
	newPRNGReader(22).Read(data)
	if err := os.WriteFile(tc.path("a.raw"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tc.store.Commit(); err != nil {
		t.Fatal(err)
	}
	used := statfsUsed(t, tc.mnt)
	for i := range 4 {
		run(t, "cp", tc.path("a.raw"), tc.path(fmt.Sprintf("c%d.raw", i)))
	}
	for i := range 4 {
		if err := os.Remove(tc.path(fmt.Sprintf("c%d.raw", i))); err != nil {
			t.Fatal(err)
		}
	}
	if sf := statfsOf(t, tc.mnt); sf.Bfree > sf.Blocks || sf.Bavail > sf.Blocks {
		t.Errorf("statfs after removing clones: %d free of %d blocks", sf.Bfree, sf.Blocks)
	}
	if err := tc.store.Commit(); err != nil {
		t.Fatal(err)
	}
	if now := statfsUsed(t, tc.mnt); now != used {
		t.Errorf("after removing the clones and a commit, %d bytes used, %d before the clones", now, used)
	}
	if got := readAll(t, tc.path("a.raw")); !bytes.Equal(got, data) {
		t.Error("a.raw changed when its clones were removed")
	}
}
