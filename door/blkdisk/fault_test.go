package blkdisk

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/vdiskfs/vdiskfs/door"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/internal/iouring"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// faultDisk is a Disk whose owners' ring I/O and blocking path fail on
// demand: the next failRing ring entries (counted down as they are
// prepared; one owner prepares them) are
// given a file descriptor that does not exist, so the kernel fails them
// with EBADF; while failBlocking is set, ReadAt and WriteAt fail.
type faultDisk struct {
	*Disk
	failRing     atomic.Int32
	failBlocking atomic.Bool
}

var errInjected = errors.New("injected failure")

func (f *faultDisk) NewIO(cq door.Completions) blk.IO {
	return &faultIO{IO: f.Disk.NewIO(cq), f: f}
}

func (f *faultDisk) ReadAt(p []byte, off int64) (int, error) {
	if f.failBlocking.Load() {
		return 0, errInjected
	}
	return f.Disk.ReadAt(p, off)
}

func (f *faultDisk) WriteAt(p []byte, off int64) (int, error) {
	if f.failBlocking.Load() {
		return 0, errInjected
	}
	return f.Disk.WriteAt(p, off)
}

type faultIO struct {
	blk.IO
	f *faultDisk
}

func (io *faultIO) Plan() door.Plan { return faultPlan{Plan: io.IO.Plan(), f: io.f} }

type faultPlan struct {
	door.Plan
	f *faultDisk
}

func (p faultPlan) PrepareSQE(sqe *iouring.SQE, i int) bool {
	if !p.Plan.PrepareSQE(sqe, i) {
		return false
	}
	if p.f.failRing.Load() > 0 {
		p.f.failRing.Add(-1)
		sqe.Fd = 1 << 30 // above any descriptor limit: EBADF
	}
	return true
}

// TestFailedBackingIO fails the backing I/O a queue owner issued for a
// read or a write — a request of one piece, planned straight into guest
// memory, and a scattered one of large pieces, vectored — and checks that
// the blocking path serves it again: the guest gets OK and the right
// bytes, and the store's check (at cleanup) finds no block the failed
// attempt left behind. When the blocking path fails too, the guest gets
// IOERR, the write maps none of the blocks it was given, and the next
// request is served as usual.
func TestFailedBackingIO(t *testing.T) {
	tc := newFileCase(t, varTmp(t))
	if err := tc.srv.Close(); err != nil {
		t.Fatal(err)
	}
	fd := &faultDisk{Disk: New(tc.store, tc.disk)}
	srv, err := blk.Serve(fd, blk.Config{Socket: tc.socket, ID: "vm0", Queues: 1, SocketGroup: -1, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	tc.srv = srv
	d := tc.dial(frontend.Options{MaxSegments: 254})
	q := d.Queues()[0]
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 3))

	for i, sh := range []struct {
		name     string
		n, seg   int
		sector   uint64
		vectored bool
	}{
		{"one piece", 256 << 10, 256 << 10, 2048, false},
		{"scattered", 1 << 20, 256 << 10, 8192, true},
	} {
		var segs []frontend.Buffer
		for off := 0; off < sh.n; off += sh.seg {
			segs = append(segs, alloc(t, d, sh.seg, 4096), alloc(t, d, 4096, 4096)) // a page between pieces
		}
		pieces := make([]frontend.Buffer, 0, len(segs)/2)
		for k := 0; k < len(segs); k += 2 {
			pieces = append(pieces, segs[k])
		}
		fill := func() []byte {
			want := make([]byte, 0, sh.n)
			for _, b := range pieces {
				for j := range b.Bytes {
					b.Bytes[j] = byte(rng.Uint32())
				}
				want = append(want, b.Bytes...)
			}
			return want
		}
		joined := func() (b []byte) {
			for _, p := range pieces {
				b = append(b, p.Bytes...)
			}
			return b
		}
		// served checks that one request since before fell back, and
		// went vectored if the shape does.
		served := func(what string, before blk.Stats) {
			t.Helper()
			if left := fd.failRing.Load(); left > 0 {
				t.Fatalf("%s, %s: the ring I/O was never prepared (%d faults left)", sh.name, what, left)
			}
			st := tc.srv.Stats()
			if got := st.Fallbacks - before.Fallbacks; got != 1 {
				t.Errorf("%s, %s: %d requests served again on the blocking path, want 1", sh.name, what, got)
			}
			if sh.vectored && st.Vectored == before.Vectored {
				t.Errorf("%s, %s: not vectored", sh.name, what)
			}
		}

		want := fill()
		fd.failRing.Store(1) // the first ring entry fails
		before := tc.srv.Stats()
		mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: sh.sector, Data: pieces, Tag: uint64(i)})
		served("write", before)
		got := make([]byte, sh.n)
		if _, err := tc.disk.ReadAt(got, int64(sh.sector*512)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: after a failed ring write served again, the disk holds other bytes (%v)", sh.name, err)
		}

		for _, b := range pieces {
			clear(b.Bytes)
		}
		fd.failRing.Store(1)
		before = tc.srv.Stats()
		mustOK(t, q, frontend.Request{Type: proto.BlkTIn, Sector: sh.sector, Data: pieces, Tag: uint64(i)})
		served("read", before)
		if !bytes.Equal(joined(), want) {
			t.Fatalf("%s: a failed ring read served again returned other bytes", sh.name)
		}

		// Both paths fail: the guest is told, a failed write to a range
		// never written maps none of the blocks it was given (they hold
		// no data of its own), and the queue goes on.
		fresh := uint64(diskSize/512/2 + i*(sh.n/512))
		fill()
		fd.failRing.Store(1)
		fd.failBlocking.Store(true)
		before = tc.srv.Stats()
		for _, r := range []frontend.Request{
			{Type: proto.BlkTOut, Sector: fresh, Data: pieces},
			{Type: proto.BlkTIn, Sector: sh.sector, Data: pieces}, // data: a read of holes issues no I/O
		} {
			if c := do(t, q, r); c.Status != proto.BlkSIOErr {
				t.Errorf("%s: request type %d failing on both paths: status %d, want IOERR", sh.name, r.Type, c.Status)
			}
			if left := fd.failRing.Load(); left > 0 {
				t.Errorf("%s: request type %d failing on both paths: the ring I/O was never prepared", sh.name, r.Type)
			}
			fd.failRing.Store(1)
		}
		fd.failBlocking.Store(false)
		fd.failRing.Store(0)
		if st := tc.srv.Stats(); st.Write.Errors-before.Write.Errors != 1 || st.Read.Errors-before.Read.Errors != 1 {
			t.Errorf("%s: %d write and %d read errors counted, want 1 each", sh.name,
				st.Write.Errors-before.Write.Errors, st.Read.Errors-before.Read.Errors)
		}
		if at, err := tc.disk.SeekData(int64(fresh * 512)); !errors.Is(err, image.ErrNoData) && at < int64(fresh*512)+int64(sh.n) {
			t.Errorf("%s: the write that failed on both paths mapped data at %d (%v)", sh.name, at, err)
		}
		want = fill()
		mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: fresh, Data: pieces})
		if _, err := tc.disk.ReadAt(got, int64(fresh*512)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: a write after the failures left other bytes (%v)", sh.name, err)
		}
		for _, b := range segs {
			d.Free(b)
		}
	}
}
