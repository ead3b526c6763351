package blkdisk

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// TestModel runs random writes, reads, discards, write-zeroes and
// flushes of random sizes and alignments on both queues at once (each
// queue on its own half of the disk, with several requests in flight),
// against a model of the disk's bytes: every read must match it, and at
// the end the disk must hold it. The seed is logged; VDISK_SEED replays
// one.
func TestModel(t *testing.T) {
	seed := testutil.Seed(t)
	tc := newFileCase(t, varTmp(t))
	d := tc.dial(frontend.Options{MaxSegments: 64})
	model := make([]byte, diskSize)
	half := diskSize / 2
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for qi, q := range d.Queues() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(qi)))
			errs[qi] = runModel(d, q, rng, model[qi*half:(qi+1)*half], uint64(qi*half/512))
		}()
	}
	wg.Wait()
	for qi, err := range errs {
		if err != nil {
			t.Fatalf("queue %d: %v", qi, err)
		}
	}
	got := make([]byte, diskSize)
	if _, err := tc.disk.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("the disk differs from the model at byte %d", i)
	}
	st := tc.srv.Stats()
	t.Logf("plan declines %v", tc.store.Counters().PlanDeclines)
	t.Logf("reads %d writes %d discards %d write-zeroes %d flushes %d; fallbacks %d, held %d",
		st.Read.Requests, st.Write.Requests, st.Discard.Requests, st.WriteZeroes.Requests, st.Flush.Requests, st.Fallbacks, st.Held)
}

// modelReq is one request in flight in runModel.
type modelReq struct {
	typ         uint32
	off, n      int
	buf         frontend.Buffer
	segs        []frontend.Buffer
	want        []byte // a read's expected bytes, taken when it was issued
	unmapZeroes bool
}

// runModel issues random requests on q over the part of the disk that
// starts at sector base and that model mirrors, at most 8 at once on
// ranges that do not overlap, and checks every completion.
func runModel(d *frontend.Device, q *frontend.Queue, rng *rand.Rand, model []byte, base uint64) error {
	const ops, depth = 400, 8
	inflight := map[uint64]*modelReq{}
	busy := func(off, n int) bool {
		for _, r := range inflight {
			if off < r.off+r.n && r.off < off+n {
				return true
			}
		}
		return false
	}
	issued, tag := 0, uint64(0)
	var fail error
	for issued < ops || len(inflight) > 0 {
		for issued < ops && len(inflight) < depth {
			r := &modelReq{}
			// Sizes and offsets: 512-byte multiples, often 4 KiB ones.
			unit := 512
			if rng.IntN(2) == 0 {
				unit = 4096
			}
			r.n = unit * (1 + rng.IntN(64))
			r.off = unit * rng.IntN((len(model)-r.n)/unit)
			if busy(r.off, r.n) {
				break
			}
			switch k := rng.IntN(20); {
			case k < 8:
				r.typ = proto.BlkTOut
			case k < 16:
				r.typ = proto.BlkTIn
			case k < 17:
				r.typ = proto.BlkTDiscard
			case k < 19:
				r.typ, r.unmapZeroes = proto.BlkTWriteZeroes, rng.IntN(2) == 0
			default:
				r.typ, r.n = proto.BlkTFlush, 0
			}
			var err error
			switch r.typ {
			case proto.BlkTOut, proto.BlkTIn:
				if r.buf, err = d.Alloc(r.n, 4096); err != nil {
					return err
				}
				// A random cut into segments, at most 60 of them.
				least := (r.n/60 + 511) &^ 511
				for off := 0; off < r.n; {
					k := min(r.n-off, max(least, 512*(1+rng.IntN(16))))
					r.segs = append(r.segs, r.buf.Slice(off, k))
					off += k
				}
				if r.typ == proto.BlkTOut {
					for i := range r.buf.Bytes {
						r.buf.Bytes[i] = byte(rng.Uint32())
					}
					copy(model[r.off:], r.buf.Bytes) // the range is ours until it completes
				} else {
					r.want = append([]byte(nil), model[r.off:r.off+r.n]...)
				}
			case proto.BlkTDiscard, proto.BlkTWriteZeroes:
				flags := uint32(0)
				if r.unmapZeroes {
					flags = proto.BlkSegFlagUnmap
				}
				if r.buf, err = d.Segments(proto.BlkSeg{Sector: base + uint64(r.off/512), NumSectors: uint32(r.n / 512), Flags: flags}); err != nil {
					return err
				}
				r.segs = []frontend.Buffer{r.buf}
				clear(model[r.off : r.off+r.n]) // a discard reads back zeros here
			}
			tag++
			inflight[tag] = r
			if err := q.Submit(frontend.Request{Type: r.typ, Sector: base + uint64(r.off/512), Data: r.segs, Tag: tag}); err != nil {
				return err
			}
			issued++
		}
		if err := q.Kick(); err != nil {
			return err
		}
		n, err := q.Poll(func(c frontend.Completion) {
			r := inflight[c.Tag]
			delete(inflight, c.Tag)
			switch {
			case c.Status != proto.BlkSOK:
				fail = fmt.Errorf("request %d (type %d, %d bytes at %d): status %d", c.Tag, r.typ, r.n, r.off, c.Status)
			case r.typ == proto.BlkTIn && !bytes.Equal(r.buf.Bytes, r.want):
				fail = fmt.Errorf("read of %d bytes at %d differs from the model at byte %d", r.n, r.off, firstDiff(r.buf.Bytes, r.want))
			}
			if r.buf.Bytes != nil {
				d.Free(r.buf)
			}
		})
		if err != nil {
			return err
		}
		if fail != nil {
			return fail
		}
		if n == 0 && len(inflight) > 0 {
			if _, err := q.Wait(wait); err != nil {
				return err
			}
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
