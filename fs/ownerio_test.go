package fs

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// TestOwnerIO: on the io_uring transport, the READs and WRITEs the queue
// owners serve themselves (ownerIO) keep the disk's bytes right: reads of
// written blocks, holes and punched ranges, 4 KiB and 1 MiB, from more
// readers than a queue has entries, while other goroutines overwrite and
// punch blocks of the same disk (overwrites of mapped blocks go through
// the owners too; no read may see a torn block) and another disk is
// written and removed over and over (its blocks freed and reused: none of
// its bytes may show). Requests the owners decline (unaligned, the partial
// last block) come back right through go-fuse. It fails if no READ or no
// WRITE was served by an owner, so it also guards the node-id mapping
// (ExternalNodeID).
func TestOwnerIO(t *testing.T) {
	tc := newRingTestCase(t)
	const (
		bs     = 4096
		blocks = 4096 // a 16 MiB disk
		stable = blocks / 2
	)
	name := tc.path("a.raw")
	f := tc.openFile("a.raw", os.O_RDWR|os.O_CREATE, 0o644)
	f.Close()
	if err := os.Truncate(name, blocks*bs); err != nil {
		t.Fatal(err)
	}
	df, err := directio.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()

	// Blocks [0, stable) hold a fixed pattern, except a punched range;
	// blocks [stable, blocks) are churned below: each holds either zeros
	// or a block of the writers' stamp.
	want := func(b int64) byte {
		if b >= 100 && b < 164 {
			return 0 // punched
		}
		return byte(b%251 + 1)
	}
	buf := directio.AlignedBlock(1 << 20)
	for off := int64(0); off < stable*bs; off += int64(len(buf)) {
		for i := range buf {
			buf[i] = want((off + int64(i)) / bs)
		}
		if _, err := df.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Fallocate(int(df.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 100*bs, 64*bs); err != nil {
		t.Fatal(err)
	}
	reads0, writes0 := tc.srv.ring.OwnerIO()

	var stop atomic.Bool
	errs := make(chan error, 256)
	var churn, readers sync.WaitGroup
	// Overwrite and punch the churned half.
	for w := range 2 {
		churn.Go(func() {
			p := directio.AlignedBlock(64 << 10)
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for !stop.Load() {
				b := stable + r.Int64N(blocks-stable-16)
				if r.IntN(3) == 0 {
					if err := unix.Fallocate(int(df.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, b*bs, 16*bs); err != nil {
						errs <- fmt.Errorf("punch: %w", err)
						return
					}
					continue
				}
				fillStamp(p)
				if _, err := df.WriteAt(p, b*bs); err != nil {
					errs <- fmt.Errorf("write: %w", err)
					return
				}
			}
		})
	}
	// Another disk written and removed over and over: its blocks are freed
	// and reused; none of its bytes (0xEE) may show in a.raw.
	churn.Go(func() {
		other := tc.path("b.raw")
		p := directio.AlignedBlock(1 << 20)
		for i := range p {
			p[i] = 0xEE
		}
		for !stop.Load() {
			g, err := directio.OpenFile(other, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				errs <- err
				return
			}
			for off := int64(0); off < 4<<20; off += 1 << 20 {
				if _, err := g.WriteAt(p, off); err != nil {
					errs <- err
				}
			}
			g.Close()
			if err := os.Remove(other); err != nil {
				errs <- err
				return
			}
		}
	})

	for r := range 96 {
		readers.Go(func() {
			size := bs
			if r%8 == 0 {
				size = 1 << 20
			}
			p := directio.AlignedBlock(size)
			rnd := rand.New(rand.NewPCG(uint64(r), 2))
			for range 150 {
				b := rnd.Int64N(blocks - int64(size/bs) + 1)
				if _, err := df.ReadAt(p, b*bs); err != nil {
					errs <- fmt.Errorf("read %d at block %d: %w", size, b, err)
					return
				}
				for i := 0; i < size; i += bs {
					blk := b + int64(i/bs)
					got := p[i : i+bs]
					if blk < stable {
						if !allBytes(got, want(blk)) {
							errs <- fmt.Errorf("block %d reads %x..., want %x", blk, got[:8], want(blk))
							return
						}
					} else if !isZero(got) && !isStamp(got) {
						errs <- fmt.Errorf("churned block %d reads %x..., neither zeros nor a stamped block", blk, got[:8])
						return
					}
				}
			}
		})
	}
	stopChurn(t, &readers, &churn, &stop, errs)
	reads, writes := tc.srv.ring.OwnerIO()
	reads, writes = reads-reads0, writes-writes0
	t.Logf("queue owners served %d READs and %d WRITEs", reads, writes)
	if reads == 0 || writes == 0 {
		t.Errorf("queue owners served %d READs and %d WRITEs, want some of each", reads, writes)
	}

	// An overwrite through the owners is what every path reads back, and
	// it moves the mtime.
	mtime := stat(t, name).Mtim
	over := directio.AlignedBlock(bs)
	for b := int64(0); b < 64; b++ {
		for i := range over {
			over[i] = 0x7F
		}
		if _, err := df.WriteAt(over, b*bs); err != nil {
			t.Fatal(err)
		}
	}
	if got := readAll(t, name)[:64*bs]; !allBytes(got, 0x7F) {
		t.Fatal("overwritten blocks do not read back")
	}
	if st := stat(t, name); st.Mtim == mtime {
		t.Errorf("mtime %v unchanged by overwrites", mtime)
	}
	oldWant := want
	want = func(b int64) byte {
		if b < 64 {
			return 0x7F
		}
		return oldWant(b)
	}

	// Declined reads take go-fuse's path: unaligned, and the partial last
	// block of a disk whose size is not a block multiple.
	if err := os.Truncate(name, blocks*bs+100); err != nil {
		t.Fatal(err)
	}
	bf, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer bf.Close()
	got := make([]byte, 3*bs)
	if n, err := bf.ReadAt(got, 7*bs+10); err != nil || n != len(got) {
		t.Fatalf("unaligned read: %d, %v", n, err)
	}
	for i := range got {
		if w := want((7*bs + 10 + int64(i)) / bs); got[i] != w {
			t.Fatalf("unaligned read: byte %d is %x, want %x", i, got[i], w)
		}
	}
	tail := directio.AlignedBlock(2 * bs)
	if n, _ := df.ReadAt(tail, (blocks-1)*bs); n != bs+100 || !bytes.Equal(tail[bs:bs+100], make([]byte, 100)) {
		t.Fatalf("read across the end: %d bytes, want %d, zeros past the old end", n, bs+100)
	}
}

// newRingTestCase is a mount on the io_uring transport, whose queue owners
// serve READs and WRITEs themselves.
func newRingTestCase(t *testing.T) *testCase {
	t.Helper()
	requireFUSE(t)
	requireIOURing(t)
	tc := newTestCase(t, withMountOptions(Options{Transport: TransportIOURing}))
	if tc.srv.ring == nil {
		t.Fatalf("mount serves over %q, want io_uring", tc.srv.Transport())
	}
	return tc
}

// stopChurn waits for the readers, then stops the churners and waits for
// them, and fails t with every error any of them sent on errs.
func stopChurn(t *testing.T, readers, churn *sync.WaitGroup, stop *atomic.Bool, errs chan error) {
	t.Helper()
	readers.Wait()
	stop.Store(true)
	churn.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// fillStamp fills p with 4 KiB blocks that each carry the same byte,
// 0x80 or above (the stable blocks hold 1..251 and the other disk 0xEE).
func fillStamp(p []byte) {
	for b := 0; b < len(p); b += 4096 {
		v := byte(0x80 + rand.IntN(0x60))
		for i := b; i < b+4096; i++ {
			p[i] = v
		}
	}
}

func isStamp(b []byte) bool { return b[0] >= 0x80 && b[0] < 0xE0 && allBytes(b, b[0]) }

func allBytes(b []byte, v byte) bool {
	for _, c := range b {
		if c != v {
			return false
		}
	}
	return true
}

// TestOwnerIOAsync: on a backend whose I/O the queue owners start and reap
// themselves (backend.AsyncSubmitter; here backend.Async over the store
// file, the RBD backend's shape without Ceph), the owners serve READs and
// WRITEs through their completion queues: what 16 goroutines write in 4
// KiB and 1 MiB pieces reads back right, and both kinds took the owner
// path. While every started I/O fails, the requests still succeed: each
// goes to a worker, whose ReadAt or WriteAt (not through the completion
// queue) retries it, and is counted as an owner retry. Unmounting after
// all that does not hang (the cleanup's unmount is bounded by the test's
// timeout, and the queues close their completion queues on the way out).
func TestOwnerIOAsync(t *testing.T) {
	requireFUSE(t)
	requireIOURing(t)
	var ab *backend.Async
	tc := newTestCase(t, withMountOptions(Options{Transport: TransportIOURing}),
		withBackend(func(b backend.Backend) backend.Backend { ab = backend.NewAsync(b); return ab }))
	if tc.srv.ring == nil {
		t.Fatalf("mount serves over %q, want io_uring", tc.srv.Transport())
	}
	const size = 16 << 20
	name := tc.path("a.raw")
	f := tc.openFile("a.raw", os.O_RDWR|os.O_CREATE, 0o644)
	f.Close()
	if err := os.Truncate(name, size); err != nil {
		t.Fatal(err)
	}
	df, err := directio.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()

	// Goroutine g owns [g MiB, (g+1) MiB): a 1 MiB write, then 4 KiB
	// overwrites of some of its blocks, then reads of all of it.
	pattern := func(g, blk, gen int) byte { return byte(g*16 + blk%7 + gen*100 + 1) }
	check := func(what string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for g := range 16 {
			wg.Go(func() {
				p := directio.AlignedBlock(1 << 20)
				for i := range p {
					p[i] = pattern(g, i/4096, 0)
				}
				base := int64(g) << 20
				if _, err := df.WriteAt(p, base); err != nil {
					errs <- fmt.Errorf("%s: write 1 MiB at %d: %w", what, base, err)
					return
				}
				small := directio.AlignedBlock(4096)
				for blk := 0; blk < 256; blk += 5 {
					for i := range small {
						small[i] = pattern(g, blk, 1)
					}
					if _, err := df.WriteAt(small, base+int64(blk)*4096); err != nil {
						errs <- fmt.Errorf("%s: write 4 KiB at block %d: %w", what, blk, err)
						return
					}
				}
				for blk := range 256 {
					if _, err := df.ReadAt(small, base+int64(blk)*4096); err != nil {
						errs <- fmt.Errorf("%s: read 4 KiB at block %d: %w", what, blk, err)
						return
					}
					want := pattern(g, blk, 0)
					if blk%5 == 0 {
						want = pattern(g, blk, 1)
					}
					if !allBytes(small, want) {
						errs <- fmt.Errorf("%s: goroutine %d block %d reads %x..., want %x", what, g, blk, small[:8], want)
						return
					}
				}
				if _, err := df.ReadAt(p, base); err != nil {
					errs <- fmt.Errorf("%s: read 1 MiB at %d: %w", what, base, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	check("through the completion queues")
	if r, w := tc.srv.ring.OwnerIO(); r == 0 || w == 0 {
		t.Errorf("queue owners served %d READs and %d WRITEs, want some of each", r, w)
	} else {
		t.Logf("queue owners served %d READs and %d WRITEs", r, w)
	}

	retries := tc.ownerRetries()
	ab.SetFault(func(backend.IO) error { return syscall.EIO })
	check("every started I/O failing")
	ab.SetFault(nil)
	if got := tc.ownerRetries() - retries; got == 0 {
		t.Error("no owner request was retried by a worker while every started I/O failed")
	} else {
		t.Logf("%d owner requests retried by a worker", got)
	}
}

// TestOwnerIOEncrypted: on the io_uring transport, the queue owners serve
// an encrypted disk's READs and small WRITEs, leave its large WRITEs to
// workers (ownerMaxCipherWrite), and hand each large read, its I/O done,
// to a worker that decrypts it and replies (fuseuring's bigCipher).
// Many concurrent 1 MiB and 128 KiB O_DIRECT reads, more than a queue
// has entries, must read what was written, while a writer overwrites
// blocks of the upper half with stamps: a churned block reads either as
// first written or as one whole stamp, never torn (the range stays held
// until the worker has decrypted). It fails if no READ was served by an
// owner.
func TestOwnerIOEncrypted(t *testing.T) {
	tc := newRingTestCase(t)
	key, err := crypt.KeyFileSecret(bytes.Repeat([]byte{9}, 32))
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	const (
		bs     = 4096
		blocks = 4096 // a 16 MiB disk
		stable = blocks / 2
	)
	if _, err := tc.srv.CreateEncrypted("e.raw", blocks*bs, image.Attr{Mode: 0o600}, key); err != nil {
		t.Fatal(err)
	}
	df, err := directio.OpenFile(tc.path("e.raw"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()
	want := func(b int64) byte { return byte(b%127 + 1) } // below every stamp
	_, writes0 := tc.srv.ring.OwnerIO()
	buf := directio.AlignedBlock(1 << 20)
	for off := int64(0); off < blocks*bs; off += int64(len(buf)) {
		for i := range buf {
			buf[i] = want((off + int64(i)) / bs)
		}
		if _, err := df.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	reads0, writes1 := tc.srv.ring.OwnerIO()
	if writes1 != writes0 {
		t.Errorf("the owners served %d of the 1 MiB writes of an encrypted disk, want none", writes1-writes0)
	}
	small := directio.AlignedBlock(bs)
	for i := range small {
		small[i] = want(0)
	}
	if _, err := df.WriteAt(small, 0); err != nil {
		t.Fatal(err)
	}
	if _, writes2 := tc.srv.ring.OwnerIO(); writes2 == writes1 {
		t.Error("a 4 KiB write of an encrypted disk was not served by an owner")
	}

	seed := testutil.Seed(t)
	var stop atomic.Bool
	errs := make(chan error, 64)
	var churn, readers sync.WaitGroup
	churn.Go(func() {
		p := directio.AlignedBlock(64 << 10)
		r := rand.New(rand.NewPCG(seed, 1))
		for !stop.Load() {
			fillStamp(p)
			if _, err := df.WriteAt(p, (stable+r.Int64N(blocks-stable-16))*bs); err != nil {
				errs <- fmt.Errorf("write: %w", err)
				return
			}
		}
	})
	for g := range 24 {
		readers.Go(func() {
			size := 1 << 20
			if g%3 == 0 {
				size = 128 << 10
			}
			p := directio.AlignedBlock(size)
			r := rand.New(rand.NewPCG(seed, uint64(g)+2))
			for range 40 {
				b := r.Int64N(blocks - int64(size/bs) + 1)
				if _, err := df.ReadAt(p, b*bs); err != nil {
					errs <- fmt.Errorf("read %d at block %d: %w", size, b, err)
					return
				}
				for i := 0; i < size; i += bs {
					blk, got := b+int64(i/bs), p[i:i+bs]
					if !allBytes(got, want(blk)) && (blk < stable || !isStamp(got)) {
						errs <- fmt.Errorf("block %d reads %x..., want %x throughout (or a stamp past block %d)", blk, got[:8], want(blk), stable)
						return
					}
				}
			}
		})
	}
	stopChurn(t, &readers, &churn, &stop, errs)
	reads, _ := tc.srv.ring.OwnerIO()
	t.Logf("queue owners served %d READs of the encrypted disk", reads-reads0)
	if reads == reads0 {
		t.Error("no READ of the encrypted disk was served by a queue owner")
	}
}
