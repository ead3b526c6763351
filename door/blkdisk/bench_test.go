package blkdisk

import (
	"fmt"
	"testing"

	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// BenchmarkIO drives reads and writes through the Go frontend on one
// queue against a disk of a file store on /var/tmp (O_DIRECT, the owner's
// io_uring path), in the shapes: 4 KiB at iodepth 1 and 32, 1 MiB
// at 1, 8 (also in scattered pieces) and 16, 256 KiB at 64. The disk is
// written whole first, so that writes overwrite mapped blocks.
func BenchmarkIO(b *testing.B) {
	tc := newFileCase(b, varTmp(b))
	d := tc.dial(frontend.Options{MaxSegments: 256})
	q := d.Queues()[0]
	fill := alloc(b, d, 1<<20, 4096)
	for s := uint64(0); s < diskSize/512; s += 2048 {
		mustOK(b, q, frontend.Request{Type: proto.BlkTOut, Sector: s, Data: []frontend.Buffer{fill}})
	}
	mustOK(b, q, frontend.Request{Type: proto.BlkTFlush})
	// frag: the request's data is every other 8 KiB of a buffer (a
	// guest's scattered pages), one descriptor each: 128 pieces a MiB.
	for _, c := range []struct {
		size, depth int
		frag        bool
	}{{4096, 1, false}, {4096, 32, false}, {1 << 20, 1, false}, {1 << 20, 8, false}, {1 << 20, 8, true},
		{256 << 10, 64, false}, {1 << 20, 16, false}} {
		for _, typ := range []uint32{proto.BlkTIn, proto.BlkTOut} {
			name := map[uint32]string{proto.BlkTIn: "read", proto.BlkTOut: "write"}[typ]
			frag := map[bool]string{true: "/frag"}[c.frag]
			b.Run(fmt.Sprintf("%s/%dk/depth%d%s", name, c.size>>10, c.depth, frag), func(b *testing.B) {
				bufs := make([]frontend.Buffer, c.depth)
				data := make([][]frontend.Buffer, c.depth)
				for i := range bufs {
					if !c.frag {
						bufs[i] = alloc(b, d, c.size, 4096)
						data[i] = []frontend.Buffer{bufs[i]}
						continue
					}
					bufs[i] = alloc(b, d, 2*c.size, 4096)
					for off := 0; off < 2*c.size; off += 16384 {
						data[i] = append(data[i], bufs[i].Slice(off, 8192))
					}
				}
				blocks := diskSize / c.size
				next := 0
				submit := func(tag int) {
					sector := uint64((next*7919)%blocks) * uint64(c.size/512)
					next++
					if err := q.Submit(frontend.Request{Type: typ, Sector: sector, Data: data[tag], Tag: uint64(tag)}); err != nil {
						b.Fatal(err)
					}
				}
				before := tc.srv.Stats()
				b.SetBytes(int64(c.size))
				b.ReportAllocs()
				b.ResetTimer()
				pipeline(b, q, c.depth, submit)
				b.StopTimer()
				after := tc.srv.Stats()
				b.ReportMetric(float64(after.Fallbacks-before.Fallbacks)/float64(b.N), "fallbacks/op")
				b.ReportMetric(float64(after.Held-before.Held)/float64(b.N), "held/op")
				for _, buf := range bufs {
					d.Free(buf)
				}
			})
		}
	}
}

// BenchmarkFreshWrite writes 4 KiB at depth 32 into holes (a disk never
// written): every write allocates, so each waits for a group commit
// before it is returned (Restartable).
func BenchmarkFreshWrite(b *testing.B) {
	tc := newFileCase(b, varTmp(b))
	const depth, size, fresh = 32, 4096, 1 << 30
	if err := tc.disk.Truncate(fresh); err != nil { // holes to write into
		b.Fatal(err)
	}
	d := tc.dial(frontend.Options{})
	q := d.Queues()[0]
	bufs := make([]frontend.Buffer, depth)
	for i := range bufs {
		bufs[i] = alloc(b, d, size, 4096)
	}
	next := uint64(0)
	submit := func(tag int) {
		// Every other block, so that no write extends its neighbour's run.
		sector := next * 2 * size / 512
		if sector >= fresh/512 {
			b.Fatal("no holes left to write into")
		}
		next++
		if err := q.Submit(frontend.Request{Type: proto.BlkTOut, Sector: sector, Data: []frontend.Buffer{bufs[tag]}, Tag: uint64(tag)}); err != nil {
			b.Fatal(err)
		}
	}
	before := tc.srv.Stats()
	b.SetBytes(size)
	b.ResetTimer()
	pipeline(b, q, depth, submit)
	b.StopTimer()
	after := tc.srv.Stats()
	b.ReportMetric(float64(after.Held-before.Held)/float64(b.N), "held/op")
	b.ReportMetric(float64(after.Fallbacks-before.Fallbacks)/float64(b.N), "fallbacks/op")
}

// pipeline runs b.N requests on q, depth at a time: submit(tag) submits
// the next request with tag (a slot below depth), reused once its
// completion (which must be OK) is polled.
func pipeline(b *testing.B, q *frontend.Queue, depth int, submit func(tag int)) {
	issued, done := 0, 0
	for ; issued < min(depth, b.N); issued++ {
		submit(issued)
	}
	q.Kick()
	for done < b.N {
		n, err := q.Poll(func(cp frontend.Completion) {
			if cp.Status != proto.BlkSOK {
				b.Fatalf("status %d", cp.Status)
			}
			done++
			if issued < b.N {
				submit(int(cp.Tag))
				issued++
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		if n > 0 {
			q.Kick()
		} else if _, err := q.Wait(wait); err != nil {
			b.Fatal(err)
		}
	}
}
