package fs

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// TestOwnerIOEncrypted: on the io_uring transport, the queue owners serve
// an encrypted disk's READs and WRITEs, and hand each large read, its I/O
// done, to a worker that decrypts it and replies (fuseuring's workerEnd).
// Many concurrent 1 MiB and 128 KiB O_DIRECT reads, more than a queue
// has entries, must read what was written, while a writer overwrites
// blocks of the upper half with stamps: a churned block reads either as
// first written or as one whole stamp, never torn (the range stays held
// until the worker has decrypted). It fails if no READ was served by an
// owner.
func TestOwnerIOEncrypted(t *testing.T) {
	requireFUSE(t)
	requireIOURing(t)
	tc := newTestCase(t, withMountOptions(Options{Transport: TransportIOURing}))
	if tc.srv.ring == nil {
		t.Fatalf("mount serves over %q, want io_uring", tc.srv.Transport())
	}
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
	buf := directio.AlignedBlock(1 << 20)
	for off := int64(0); off < blocks*bs; off += int64(len(buf)) {
		for i := range buf {
			buf[i] = want((off + int64(i)) / bs)
		}
		if _, err := df.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	reads0, _ := tc.srv.ring.OwnerIO()

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
	readers.Wait()
	stop.Store(true)
	churn.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	reads, _ := tc.srv.ring.OwnerIO()
	t.Logf("queue owners served %d READs of the encrypted disk", reads-reads0)
	if reads == reads0 {
		t.Error("no READ of the encrypted disk was served by a queue owner")
	}
}
