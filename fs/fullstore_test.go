package fs

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
)

// A full store through a mount: a thin store filled to capacity answers
// ENOSPC to the writer that needs a new block, and to nobody else: every
// disk stays readable, overwrites of mapped blocks, truncates and creates
// (which need no data block) still work, fsync still works (the store
// keeps a checkpoint's worth of blocks in reserve), nothing acknowledged is
// lost across a remount, and once space is freed (punch, delete) writes
// succeed again. The same holds when the store is filled with 4 KiB blocks
// scattered at random, one extent each, which makes the metadata as large
// as it can get.

// fillDisk writes n-byte blocks of tagged data into f from off on, until a
// write fails; it returns the data written (acknowledged) and the error.
func fillDisk(f *os.File, off int64, n int, tag byte, seed uint64) ([]byte, error) {
	var written []byte
	for i := uint64(0); ; i++ {
		p := tagged(tag, n, seed+i)
		if _, err := f.WriteAt(p, off+int64(len(written))); err != nil {
			return written, err
		}
		written = append(written, p...)
	}
}

func statfsOf(t *testing.T, path string) unix.Statfs_t {
	t.Helper()
	var sf unix.Statfs_t
	if err := unix.Statfs(path, &sf); err != nil {
		t.Fatal(err)
	}
	return sf
}

func TestFullStore(t *testing.T) {
	// ENOSPC warnings are expected: keep them out of the output.
	size := int64(48 << 20)
	if testing.Short() {
		size = 24 << 20
	}
	tc := newTestCase(t, withStoreSize(size), withStoreOptions(image.Options{CommitInterval: -1, Logger: quietLogger()}),
		withMountOptions(Options{Logger: quietLogger()}))
	bs := int64(tc.store.BlockSize())

	// Acknowledged and fsynced before the store fills.
	keep := tagged(1, 4<<20, 1)
	if err := os.WriteFile(tc.path("keep.raw"), keep, 0o600); err != nil {
		t.Fatal(err)
	}
	mf := tc.openFile("mapped.raw", os.O_RDWR|os.O_CREATE, 0o600)
	mapped := append(tagged(2, 2<<20, 2), make([]byte, 6<<20)...) // 2 MiB of data, then a hole to 8 MiB
	if _, err := mf.WriteAt(mapped[:2<<20], 0); err != nil {
		t.Fatal(err)
	}
	if err := mf.Truncate(int64(len(mapped))); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"keep.raw", "mapped.raw"} {
		f := tc.openFile(name, os.O_RDWR, 0)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}

	// Fill: 1 MiB O_DIRECT writes, then 4 KiB ones, until ENOSPC.
	ff := tc.openFile("fill.raw", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	fill, err := fillDisk(ff, 0, 1<<20, 3, 100)
	wantErrno(t, "1 MiB write to a full store", err, unix.ENOSPC)
	more, err := fillDisk(ff, int64(len(fill)), int(bs), 3, 1<<20)
	wantErrno(t, "4 KiB write to a full store", err, unix.ENOSPC)
	fill = append(fill, more...)
	sf := statfsOf(t, tc.mnt)
	t.Logf("filled: %d MiB + %d KiB in fill.raw; statfs: %d of %d blocks free", len(fill)>>20, len(more)>>10, sf.Bfree, sf.Blocks)
	if sf.Bfree*uint64(bs) > 256<<10 {
		t.Errorf("ENOSPC with %d blocks free", sf.Bfree)
	}
	if st := stat(t, tc.path("fill.raw")); st.Size != int64(len(fill)) {
		t.Errorf("fill.raw: size %d after ENOSPC, %d acknowledged", st.Size, len(fill))
	}
	if err := ff.Sync(); err != nil {
		t.Fatalf("fsync of the full disk: %v", err)
	}

	// Every disk still reads.
	if got := readAll(t, tc.path("keep.raw")); !bytes.Equal(got, keep) {
		t.Error("keep.raw does not read back on the full store")
	}

	// Overwrites of mapped blocks still work, O_DIRECT and buffered.
	md := tc.openFile("mapped.raw", os.O_RDWR|syscall.O_DIRECT, 0)
	over := tagged(2, 1<<20, 3)
	if _, err := md.WriteAt(over, 512<<10); err != nil {
		t.Errorf("O_DIRECT overwrite of mapped blocks on a full store: %v", err)
	} else {
		copy(mapped[512<<10:], over)
	}
	small := tagged(2, 10000, 4)
	if _, err := mf.WriteAt(small, 12345); err != nil {
		t.Errorf("unaligned overwrite of mapped blocks on a full store: %v", err)
	} else {
		copy(mapped[12345:], small)
	}
	// What needs a new block fails, and changes nothing.
	alloc0, _ := tc.allocated("mapped.raw")
	_, err = md.WriteAt(tagged(2, 64<<10, 5), 4<<20)
	wantErrno(t, "O_DIRECT write into a hole", err, unix.ENOSPC)
	_, err = mf.WriteAt([]byte("x"), 6<<20+1)
	wantErrno(t, "1-byte write into a hole", err, unix.ENOSPC)
	_, err = mf.WriteAt([]byte("past the end"), int64(len(mapped)))
	wantErrno(t, "write past the end", err, unix.ENOSPC)
	wantErrno(t, "fallocate of a hole", unix.Fallocate(int(mf.Fd()), 0, 3<<20, 1<<20), unix.ENOSPC)
	wantErrno(t, "fallocate past the end", unix.Fallocate(int(mf.Fd()), 0, int64(len(mapped)), 1<<20), unix.ENOSPC)
	if alloc, _ := tc.allocated("mapped.raw"); alloc != alloc0 {
		t.Errorf("mapped.raw: allocated %d -> %d by writes that failed", alloc0, alloc)
	}
	if st := stat(t, tc.path("mapped.raw")); st.Size != int64(len(mapped)) {
		t.Errorf("mapped.raw: size %d after failed writes, want %d", st.Size, len(mapped))
	}
	// What needs no data block works: growing by truncate, creating.
	if err := mf.Truncate(16 << 20); err != nil {
		t.Errorf("truncate up on a full store: %v", err)
	} else {
		mapped = append(mapped, make([]byte, 8<<20)...)
	}
	nf := tc.openFile("new.raw", os.O_RDWR|os.O_CREATE, 0o600)
	_, err = nf.WriteAt([]byte("new"), 0)
	wantErrno(t, "write to a new disk", err, unix.ENOSPC)
	for _, f := range []*os.File{mf, nf, ff} {
		if err := f.Sync(); err != nil {
			t.Errorf("fsync on a full store: %v", err)
		}
	}
	tc.check("full")

	verify := func(when string) {
		t.Helper()
		for name, want := range map[string][]byte{"keep.raw": keep, "mapped.raw": mapped, "fill.raw": fill} {
			if got := readAll(t, tc.path(name)); !bytes.Equal(got, want) {
				t.Errorf("%s: %s differs from what was acknowledged (%d bytes, want %d)", when, name, len(got), len(want))
			}
		}
	}
	verify("full")
	for _, f := range []*os.File{mf, md, nf, ff} {
		f.Close()
	}
	tc.remount()
	verify("full, after a remount")

	// Space comes back with a punch: writes into holes work again (the
	// punched blocks are released by the commit the allocator asks for).
	ff = tc.openFile("fill.raw", os.O_RDWR, 0)
	if err := unix.Fallocate(int(ff.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 8<<20, 8<<20); err != nil {
		t.Fatalf("punch on a full store: %v", err)
	}
	clear(fill[8<<20 : 16<<20])
	mf = tc.openFile("mapped.raw", os.O_RDWR, 0)
	refill := tagged(2, 4<<20, 6)
	if _, err := mf.WriteAt(refill, 3<<20); err != nil {
		t.Errorf("write into a hole after a punch freed 8 MiB: %v", err)
	} else {
		copy(mapped[3<<20:], refill)
	}
	// And with a delete.
	ff.Close()
	if err := os.Remove(tc.path("fill.raw")); err != nil {
		t.Fatal(err)
	}
	// The space comes back when FUSE's RELEASE of the closed file arrives
	// (close(2) does not wait for it).
	eventually(t, "fill.raw's blocks freed after the unlink", func() bool { return tc.store.Info().FreeBytes >= int64(len(fill))/2 })
	again := tagged(4, len(fill)/2, 7) // half of what the filler held
	if err := os.WriteFile(tc.path("new.raw"), again, 0o600); err != nil {
		t.Errorf("write of %d MiB after deleting the filler: %v", len(again)>>20, err)
	}
	if err := mf.Sync(); err != nil {
		t.Fatal(err)
	}
	mf.Close()
	tc.remount()
	for name, want := range map[string][]byte{"keep.raw": keep, "mapped.raw": mapped, "new.raw": again} {
		if got := readAll(t, tc.path(name)); !bytes.Equal(got, want) {
			t.Errorf("after freeing space and a remount: %s differs", name)
		}
	}
}

// TestFullStoreFragmented fills a store with 4 KiB O_DIRECT writes at
// random offsets of two huge sparse disks, two writers at once: every
// block is its own extent, so every block costs metadata too. The store
// must still end in ENOSPC (not EIO, not a failed commit), stay clean,
// fsync, checkpoint at unmount within its reserve, and give everything
// back after a remount.
func TestFullStoreFragmented(t *testing.T) {
	size := int64(24 << 20)
	if testing.Short() {
		size = 8 << 20
	}
	// A small journal: commits turn into checkpoints often while filling.
	tc := newTestCase(t, withStoreSize(size), withFormatOptions(image.FormatOptions{JournalSize: 64 << 10}),
		withStoreOptions(image.Options{CommitInterval: -1, Logger: quietLogger()}), withMountOptions(Options{Logger: quietLogger()}))
	const span = 1 << 40 // disk size: random blocks never touch
	bs := int64(tc.store.BlockSize())
	type block struct {
		off  int64
		seed uint64
	}
	written := make([][]block, 2)
	files := make([]*os.File, 2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for w := range 2 {
		f := tc.openFile(fmt.Sprintf("frag%d.raw", w), os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
		if err := f.Truncate(span); err != nil {
			t.Fatal(err)
		}
		files[w] = f
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 5))
			used := map[int64]bool{}
			for i := 0; ; i++ {
				off := r.Int64N(span/bs) * bs
				if used[off] || used[off-bs] || used[off+bs] {
					continue
				}
				seed := uint64(w)<<32 | uint64(i)
				if _, err := f.WriteAt(tagged(byte(w+1), int(bs), seed), off); err != nil {
					errs[w] = err
					return
				}
				used[off] = true
				written[w] = append(written[w], block{off, seed})
				if i%256 == 255 {
					if err := f.Sync(); err != nil {
						errs[w] = fmt.Errorf("fsync: %w", err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, f := range files {
		f.Close()
	}
	for w, err := range errs {
		wantErrno(t, fmt.Sprintf("writer %d at the end", w), err, unix.ENOSPC)
	}
	info := tc.store.Info()
	n := len(written[0]) + len(written[1])
	t.Logf("%d blocks written as %d extents; %d of %d blocks free, %d checkpoints", n, info.Extents, info.FreeBlocks, info.DataBlocks, tc.store.Counters().Checkpoints)
	if info.Extents < n*9/10 {
		t.Errorf("only %d extents for %d scattered blocks", info.Extents, n)
	}
	if n < int(info.DataBlocks)*8/10 {
		t.Errorf("ENOSPC after only %d of %d blocks", n, info.DataBlocks)
	}
	tc.check("full of fragments")
	for w := range 2 {
		f := tc.openFile(fmt.Sprintf("frag%d.raw", w), os.O_RDWR|syscall.O_DIRECT, 0)
		if err := f.Sync(); err != nil {
			t.Errorf("fsync of a full, fragmented store: %v", err)
		}
		// Overwriting a mapped block still works.
		b := written[w][0]
		b.seed ^= 1 << 60
		if _, err := f.WriteAt(tagged(byte(w+1), int(bs), b.seed), b.off); err != nil {
			t.Errorf("overwrite on a full, fragmented store: %v", err)
		} else {
			written[w][0] = b
		}
		f.Close()
	}
	verify := func(when string) {
		t.Helper()
		for w := range 2 {
			f := tc.openFile(fmt.Sprintf("frag%d.raw", w), os.O_RDONLY|syscall.O_DIRECT, 0)
			p := directio.AlignedBlock(int(bs))
			for _, b := range written[w] {
				if _, err := f.ReadAt(p, b.off); err != nil {
					t.Fatalf("%s: frag%d.raw read at %d: %v", when, w, b.off, err)
				}
				if !bytes.Equal(p, tagged(byte(w+1), int(bs), b.seed)) {
					t.Fatalf("%s: frag%d.raw block at %d differs", when, w, b.off)
				}
			}
			if st := stat(t, tc.path(fmt.Sprintf("frag%d.raw", w))); st.Blocks*512 != int64(len(written[w]))*bs {
				t.Errorf("%s: frag%d.raw has %d bytes allocated, %d written", when, w, st.Blocks*512, int64(len(written[w]))*bs)
			}
			f.Close()
		}
	}
	verify("full")
	tc.remount() // the close checkpoints every extent within the reserve
	verify("after a remount")

	// Punch half of frag0's blocks: the other disk can write again.
	f0 := tc.openFile("frag0.raw", os.O_RDWR, 0)
	half := len(written[0]) / 2
	for _, b := range written[0][:half] {
		if err := unix.Fallocate(int(f0.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, b.off, bs); err != nil {
			t.Fatalf("punch: %v", err)
		}
	}
	written[0] = written[0][half:]
	f1 := tc.openFile("frag1.raw", os.O_RDWR|syscall.O_DIRECT, 0)
	if _, err := f1.WriteAt(tagged(2, 1<<20, 99), span-(1<<20)); err != nil {
		t.Errorf("write after punching %d blocks: %v", half, err)
	}
	f0.Close()
	f1.Close()
	tc.remount()
}

// TestFullStoreMetadataGrowth: on a full store, calls that allocate no
// data block but make the metadata larger: punching every other block of
// a large extent (a guest's fstrim: half the space comes free, but the
// extent splits into many, and the punched blocks stay in quarantine until
// a commit makes the punch durable), and creating many disks. A checkpoint
// happens when the journal has no room for a commit, and at every close.
// Expected: fsync succeeds, writes into the punched holes succeed, the
// unmount closes the store cleanly, and everything is there after a
// remount.
//
// The journal keeps its last quarter for this: when the checkpoint has no
// room, the records commit there, so the punched blocks come out of
// quarantine and the next checkpoint fits; records that do not fit the
// reserve in one commit go in parts, split between mutations.
func TestFullStoreMetadataGrowth(t *testing.T) {
	// The journal's last quarter takes the commit the checkpoint has no room
	// for; with a 256 KiB journal it holds the 1024 punch records.
	t.Run("punches, fsync with the journal full", func(t *testing.T) { punchSplit(t, true, 256<<10) })
	t.Run("punches, unmount without fsync", func(t *testing.T) { punchSplit(t, false, 64<<10) })
	t.Run("punches, more records than the journal's reserve", func(t *testing.T) {
		punchSplit(t, true, 64<<10)
	})
	t.Run("creates, unmount", func(t *testing.T) {
		tc := newTestCase(t, withStoreSize(8<<20), withStoreOptions(image.Options{CommitInterval: -1, Logger: quietLogger()}),
			withMountOptions(Options{Logger: quietLogger()}))
		f := tc.openFile("d.raw", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
		_, err := fillDisk(f, 0, int(tc.store.BlockSize()), 1, 1)
		wantErrno(t, "4 KiB writes", err, unix.ENOSPC)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		for i := range 300 {
			name := fmt.Sprintf("disk-%03d-%s.raw", i, strings.Repeat("x", 200))
			if err := os.WriteFile(tc.path(name), nil, 0o600); err != nil {
				t.Fatalf("create %d on a full store: %v", i, err)
			}
		}
		tc.remount()
		if n := len(tc.store.List()); n != 301 {
			t.Errorf("%d disks after a remount, want 301", n)
		}
	})
}

func punchSplit(t *testing.T, fullJournal bool, journal int64) {
	tc := newTestCase(t, withStoreSize(24<<20), withFormatOptions(image.FormatOptions{JournalSize: journal}),
		withStoreOptions(image.Options{CommitInterval: -1, Logger: quietLogger()}), withMountOptions(Options{Logger: quietLogger()}))
	bs := int64(tc.store.BlockSize())
	f := tc.openFile("d.raw", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	data, err := fillDisk(f, 0, 1<<20, 1, 1)
	wantErrno(t, "1 MiB write to a full store", err, unix.ENOSPC)
	more, err := fillDisk(f, int64(len(data)), int(bs), 1, 1<<20)
	wantErrno(t, "4 KiB write to a full store", err, unix.ENOSPC)
	data = append(data, more...)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// Bring the journal to just below the checkpoint point with small commits (an
	// overwrite in place and an fsync: one attr record, one page each).
	for i := 0; fullJournal; i++ {
		info := tc.store.Info()
		if info.JournalUsed+2*4096 >= info.JournalBytes*3/4 { // a checkpoint comes at 3/4
			break
		}
		if i > 1000 {
			t.Fatalf("the journal does not fill: %+v", info)
		}
		if _, err := f.WriteAt(data[:bs], 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	// Punch every other block of the first 8 MiB: 1024 holes, 4 MiB freed.
	fd := int(f.Fd())
	for off := int64(0); off < 8<<20; off += 2 * bs {
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, bs); err != nil {
			t.Fatalf("punch at %d: %v", off, err)
		}
		clear(data[off : off+bs])
	}
	info := tc.store.Info()
	t.Logf("after the punches: %d extents, %d blocks free (quarantine included), journal %d of %d bytes used", info.Extents, info.FreeBlocks, info.JournalUsed, info.JournalBytes)
	if fullJournal {
		if err := f.Sync(); err != nil {
			t.Errorf("fsync after punching 4 MiB out of a full store: %v", err)
		}
		if _, err := f.WriteAt(tagged(1, int(bs), 7), 2*bs); err != nil {
			t.Errorf("write into a punched hole: %v", err)
		} else {
			copy(data[2*bs:], tagged(1, int(bs), 7))
		}
		if err := f.Sync(); err != nil {
			t.Errorf("fsync after the write into a punched hole: %v", err)
		}
	}
	f.Close()
	tc.remount()
	if got := readAll(t, tc.path("d.raw")); !bytes.Equal(got, data) {
		t.Error("d.raw differs after a remount")
	}
}

// TestFullStoreCheckpointGrowth: a store filled with scattered 4 KiB
// blocks and no checkpoint on the way (its metadata grew from nothing to
// one extent per block), then kept busy at full with overwrites in place
// and fsyncs, as a VM at 100% of its thin disk is. The journal fills
// again and again, so every few fsyncs is a checkpoint; each needs as many
// blocks as the one before it, and the old one's blocks come free only
// after the new one is written. Every fsync must succeed, and so must the
// close at unmount.
//
// Regression test: ckptReserveLocked kept back the blocks one checkpoint
// of the current state needs, but not that the current checkpoint's blocks
// are still in use while the next one is written. The first checkpoint at
// full took the reserve (free went from 13 blocks to 2, the old checkpoint
// being one block), and the next one failed with ErrNoSpace ("checkpoint
// needs 12 blocks, 2 free"): fsync answered ENOSPC from then on, forever,
// and the close at unmount failed.
func TestFullStoreCheckpointGrowth(t *testing.T) {
	tc := newTestCase(t, withStoreSize(8<<20), withFormatOptions(image.FormatOptions{JournalSize: 64 << 10}),
		withStoreOptions(image.Options{CommitInterval: -1, Logger: quietLogger()}), withMountOptions(Options{Logger: quietLogger()}))
	bs := int64(tc.store.BlockSize())
	f := tc.openFile("frag.raw", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	const span = 1 << 40
	if err := f.Truncate(span); err != nil {
		t.Fatal(err)
	}
	// Every other block of a stretch far apart from the last: one extent
	// each, and the allocator's goal (right after the previous extent) is
	// taken, so physical neighbours never merge either.
	var offs []int64
	var err error
	for i := int64(0); ; i++ {
		off := i * 2 * bs * 1024
		if _, err = f.WriteAt(tagged(1, int(bs), uint64(i)), off); err != nil {
			break
		}
		offs = append(offs, off)
	}
	wantErrno(t, "scattered 4 KiB writes", err, unix.ENOSPC)
	info := tc.store.Info()
	t.Logf("full: %d blocks written, %d extents, %d blocks free, %d checkpoints", len(offs), info.Extents, info.FreeBlocks, tc.store.Counters().Checkpoints)
	ckpts := tc.store.Counters().Checkpoints
	for i := 0; tc.store.Counters().Checkpoints < ckpts+3; i++ {
		if i > 200 {
			t.Fatalf("no checkpoints after %d fsyncs", i)
		}
		k := i % len(offs)
		if _, err := f.WriteAt(tagged(1, int(bs), uint64(k)), offs[k]); err != nil {
			t.Fatalf("overwrite in place on a full store: %v", err)
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync %d on a full store (after %d checkpoints at full): %v", i, tc.store.Counters().Checkpoints-ckpts, err)
		}
	}
	f.Close()
	tc.remount()
	p := directio.AlignedBlock(int(bs))
	f = tc.openFile("frag.raw", os.O_RDONLY|syscall.O_DIRECT, 0)
	for i, off := range offs {
		if _, err := f.ReadAt(p, off); err != nil || !bytes.Equal(p, tagged(1, int(bs), uint64(i))) {
			t.Fatalf("block %d after a remount: %v", i, err)
		}
	}
}
