package fs

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// TestIsolationAfterDelete: disk A fills a small store with a recognisable
// pattern (tag 0xA in every byte's high nibble) and is fsynced; A is
// deleted and B created, and B writes partial blocks (buffered pieces,
// single O_DIRECT sectors, pieces straddling two blocks) into more blocks
// than the store has besides A's, so B must get A's old blocks. B must read
// zeros everywhere it did not write: through the mount, after a remount,
// and in every state a power cut (at each flush, and at random points with
// torn writes) can leave, where in addition A, while it still exists,
// holds exactly what it held.
func TestIsolationAfterDelete(t *testing.T) {
	const tagA, tagB = 0xA, 0xB
	size := int64(8 << 20)
	if testing.Short() {
		size = 4 << 20
	}
	c := backend.NewCrash(size)
	c.CheckAlignment(512)
	tc := newTestCase(t, withMemBackend(c), withFormatOptions(image.FormatOptions{JournalSize: 64 << 10}),
		withStoreOptions(image.Options{CommitInterval: -1, Strict: true, Logger: quietLogger()}),
		withMountOptions(Options{Logger: quietLogger()}))
	bs := int64(tc.store.BlockSize())
	capacity := tc.store.Info().CapacityBytes

	// A: fill the store, fsync.
	af := tc.openFile("a.raw", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	aData, err := fillDisk(af, 0, 64<<10, tagA, 1)
	wantErrno(t, "filling the store with a.raw", err, unix.ENOSPC)
	more, err := fillDisk(af, int64(len(aData)), int(bs), tagA, 1<<20)
	wantErrno(t, "filling the store with a.raw", err, unix.ENOSPC)
	aData = append(aData, more...)
	if err := af.Sync(); err != nil {
		t.Fatal(err)
	}
	aAlloc, _ := tc.allocated("a.raw")
	aSynced := c.OpCount()
	af.Close()

	// Delete A (not fsynced: the allocator commits the removal when it
	// needs A's blocks), create B over the same space.
	if err := os.Remove(tc.path("a.raw")); err != nil {
		t.Fatal(err)
	}
	// close(2) does not wait for FUSE's RELEASE: until it arrives, a.raw
	// is unlinked-but-open and keeps its blocks. Wait for them to be
	// freed (they are still in quarantine then: B's writes need the
	// allocator to commit the removal before it reuses them).
	eventually(t, "a.raw's blocks freed after the unlink", func() bool { return tc.store.Info().FreeBytes >= aAlloc })
	// B spans 7/8 of the store, in whole groups of four blocks (the
	// pattern below writes across a block's end into the next one).
	bSize := capacity * 7 / 8 / (4 * bs) * (4 * bs)
	bf := tc.openFile("b.raw", os.O_RDWR|os.O_CREATE, 0o600)
	bd := tc.openFile("b.raw", os.O_RDWR|syscall.O_DIRECT, 0)
	if err := bf.Truncate(bSize); err != nil {
		t.Fatal(err)
	}
	model := make([]byte, bSize) // what B reads
	ever := make([]byte, bSize)  // the one value each byte of B was ever written with, or 0
	r := rand.New(rand.NewPCG(3, 4))
	put := func(f *os.File, p []byte, off int64) {
		t.Helper()
		if _, err := f.WriteAt(p, off); err != nil {
			t.Fatalf("write %d bytes at %d into b.raw: %v", len(p), off, err)
		}
		copy(model[off:], p)
		for i, b := range p {
			if ever[off+int64(i)] != 0 {
				t.Fatalf("test bug: byte %d of b.raw written twice", off+int64(i))
			}
			ever[off+int64(i)] = b
		}
	}
	sector := directio.AlignedBlock(512)
	for blk := int64(0); blk < bSize/bs; blk++ {
		base := blk * bs
		switch blk % 4 {
		case 0: // a small buffered piece inside the block
			put(bf, tagged(tagB, 100+r.IntN(200), uint64(blk)), base+1000+r.Int64N(1000))
		case 1: // one O_DIRECT sector
			copy(sector, tagged(tagB, 512, uint64(blk)))
			put(bd, sector, base+512*(1+r.Int64N(6)))
		case 2: // a piece straddling this block's end and the next one's start
			n := 100 + r.Int64N(300)
			put(bf, tagged(tagB, int(n), uint64(blk)), base+bs-n/2)
		case 3: // only the straddling piece's tail lands here
		}
	}
	bAlloc, _ := tc.allocated("b.raw")
	if aAlloc+bAlloc <= capacity {
		t.Fatalf("a.raw had %d bytes and b.raw has %d of a %d-byte store: B may not have reused A's blocks", aAlloc, bAlloc, capacity)
	}
	check := func(when string) {
		t.Helper()
		got := readAll(t, tc.path("b.raw"))
		if err := isolated(got, 0, tagB); err != nil {
			t.Fatalf("%s: b.raw %v", when, err)
		}
		if !bytes.Equal(got, model) {
			for i := range got {
				if got[i] != model[i] {
					t.Fatalf("%s: b.raw byte %d (block %d, offset %d in it) is %#x, want %#x", when, i, int64(i)/bs, int64(i)%bs, got[i], model[i])
				}
			}
			t.Fatalf("%s: b.raw has %d bytes, want %d", when, len(got), len(model))
		}
	}
	check("written")

	// Shrinking into a block and growing again, and punching partial
	// ranges, read zeros too.
	if err := bf.Truncate(bSize/2 + 1234); err != nil {
		t.Fatal(err)
	}
	if err := bf.Truncate(bSize); err != nil {
		t.Fatal(err)
	}
	clear(model[bSize/2+1234:])
	if err := unix.Fallocate(int(bf.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1010, 3*bs); err != nil {
		t.Fatal(err)
	}
	clear(model[1010 : 1010+3*bs])
	check("truncated and punched")
	if err := bf.Sync(); err != nil {
		t.Fatal(err)
	}
	bSynced := c.OpCount()
	bf.Close()
	bd.Close()
	tc.remount()
	check("after a remount")
	tc.closeStore()

	// Power cuts from A's fsync on.
	type cut struct {
		op   int
		mode backend.CrashMode
	}
	var cuts []cut
	for _, f := range c.FlushOps() {
		if f >= aSynced {
			cuts = append(cuts, cut{f, backend.DropUnflushed}, cut{f - 1, backend.RandomSubset}, cut{f - 1, backend.Torn})
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	end := c.OpCount()
	for range 60 {
		cuts = append(cuts, cut{aSynced + rng.IntN(end-aSynced+1), backend.Torn})
	}
	for _, k := range cuts {
		if err := verifyIsolationCut(c, k.op, k.mode, rng, aData, ever, model, k.op >= bSynced); err != nil {
			t.Fatalf("power cut after op %d of %d (%s): %v", k.op, end, k.mode, err)
		}
	}
	t.Logf("%d power-cut states checked (a.raw %d KiB, b.raw %d KiB allocated of %d KiB)", len(cuts), aAlloc>>10, bAlloc>>10, capacity>>10)
}

// verifyIsolationCut opens the state after a power cut right after op: A,
// if it still exists, holds exactly aData; B shows only zeros and bytes it
// was written with at that very place, and after B's fsync exactly bSynced.
func verifyIsolationCut(c *backend.Crash, op int, mode backend.CrashMode, rng *rand.Rand, aData, ever, bSynced []byte, afterBSync bool) error {
	s, err := image.Open(c.MemAt(op, rng, mode), image.Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer s.Close()
	if rep := s.Check(); !rep.Clean() {
		return fmt.Errorf("check: %v", rep.Findings)
	}
	if got, err := readDisk(s, "a.raw"); err == nil {
		if !bytes.Equal(got, aData) {
			return errors.New("a.raw exists and differs from what was fsynced")
		}
	} else if !errors.Is(err, image.ErrNotExist) {
		return err
	}
	got, err := readDisk(s, "b.raw")
	if errors.Is(err, image.ErrNotExist) && !afterBSync {
		return nil
	}
	if err != nil {
		return err
	}
	if afterBSync && !bytes.Equal(got, bSynced) {
		return errors.New("b.raw differs from what was fsynced")
	}
	if len(got) > len(ever) {
		return fmt.Errorf("b.raw has %d bytes, more than it ever had", len(got))
	}
	// A block at a time (this runs over every byte of every state, also
	// under the race detector): all as written, or all zeros, is fine;
	// only a mix needs a look at each byte.
	zero := make([]byte, 4096)
	for i := 0; i < len(got); i += len(zero) {
		j := min(i+len(zero), len(got))
		if bytes.Equal(got[i:j], ever[i:j]) || bytes.Equal(got[i:j], zero[:j-i]) {
			continue
		}
		for k := i; k < j; k++ {
			if b := got[k]; b != 0 && b != ever[k] {
				return fmt.Errorf("b.raw byte %d is %#x, which b.raw never wrote there (tag %#x)", k, b, b>>4)
			}
		}
	}
	return nil
}
