package image

import (
	"sync/atomic"
	"testing"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

// Benchmarks of the Disk I/O path on the memory backend, so regressions in
// the engine show without a mount. Memory copies dominate the backend here;
// compare allocs/op and ns/op between revisions, not against a device.

func benchDisk(b *testing.B, size int64) (*memStore, *Disk) {
	ms := newMemStore(b, size, FormatOptions{})
	d := mustCreate(b, ms.s, "bench.raw", 0)
	b.Cleanup(func() { d.Close() })
	return ms, d
}

// benchFilledDisk is benchDisk with the first 64 MiB written, so 4 KiB
// requests inside it overwrite or read mapped blocks.
func benchFilledDisk(b *testing.B) *Disk {
	_, d := benchDisk(b, 256<<20)
	return fillBench(b, d)
}

// benchFilledEncrypted is benchFilledDisk for an encrypted disk.
func benchFilledEncrypted(b *testing.B) *Disk {
	ms := newMemStore(b, 256<<20, FormatOptions{})
	d := mustCreateEncrypted(b, ms.s, "bench.raw", 0, 1)
	b.Cleanup(func() { d.Close() })
	return fillBench(b, d)
}

func fillBench(b *testing.B, d *Disk) *Disk {
	fill := directio.AlignedBlock(1 << 20)
	for off := int64(0); off < 64<<20; off += 1 << 20 {
		if _, err := d.WriteAt(fill, off); err != nil {
			b.Fatal(err)
		}
	}
	return d
}

func BenchmarkWrite1MiBFresh(b *testing.B) {
	ms, d := benchDisk(b, 1<<30)
	buf := directio.AlignedBlock(1 << 20)
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	var off int64
	for b.Loop() {
		if off+1<<20 > 900<<20 {
			b.StopTimer()
			d.Truncate(0)
			ms.s.Commit()
			off = 0
			b.StartTimer()
		}
		if _, err := d.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		off += 1 << 20
	}
}

func BenchmarkOverwrite4KiB(b *testing.B) {
	d := benchFilledDisk(b)
	buf := directio.AlignedBlock(4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	i := int64(0)
	for b.Loop() {
		if _, err := d.WriteAt(buf, (i*7919%16384)*4096); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkRead4KiB(b *testing.B) {
	d := benchFilledDisk(b)
	buf := directio.AlignedBlock(4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	i := int64(0)
	for b.Loop() {
		if _, err := d.ReadAt(buf, (i*7919%16384)*4096); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkUnalignedWrite(b *testing.B) {
	_, d := benchDisk(b, 256<<20)
	buf := make([]byte, 1000)
	d.WriteAt(directio.AlignedBlock(16<<20), 0)
	b.SetBytes(1000)
	b.ReportAllocs()
	i := int64(0)
	for b.Loop() {
		if _, err := d.WriteAt(buf, (i*7919)%(16<<20-1000)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// The parallel variants run the 4 KiB paths from every P at once, as FUSE
// does: they show what shared state (the store's counters, the disk's
// locks) costs when two CPUs touch it.

// nullData is a backend whose data region does no I/O: reads leave the
// buffer as it is, writes are dropped. Metadata (below from) goes to the
// wrapped backend. With it a benchmark measures the engine alone: map
// lookup, range lock, counters, coalescing.
type nullData struct {
	backend.Backend
	from int64
}

func (n nullData) ReadAt(p []byte, off int64) (int, error) {
	if off >= n.from {
		return len(p), nil
	}
	return n.Backend.ReadAt(p, off)
}

func (n nullData) WriteAt(p []byte, off int64) (int, error) {
	if off >= n.from {
		return len(p), nil
	}
	return n.Backend.WriteAt(p, off)
}

// benchEngineDisk is benchFilledDisk with its data I/O sent to nullData.
func benchEngineDisk(b *testing.B) *Disk {
	d := benchFilledDisk(b)
	s := d.d.s
	s.be = nullData{Backend: s.be, from: s.dataOff}
	return d
}

func BenchmarkRead4KiBParallel(b *testing.B) {
	benchParallel(b, benchFilledDisk(b), false)
}

func BenchmarkOverwrite4KiBParallel(b *testing.B) {
	benchParallel(b, benchFilledDisk(b), true)
}

func BenchmarkEngineRead4KiBParallel(b *testing.B) {
	benchParallel(b, benchEngineDisk(b), false)
}

func BenchmarkEngineOverwrite4KiBParallel(b *testing.B) {
	benchParallel(b, benchEngineDisk(b), true)
}

// benchParallel issues 4 KiB reads or overwrites at scattered offsets of
// the first 64 MiB of d from every P.
func benchParallel(b *testing.B, d *Disk, write bool) {
	b.SetBytes(4096)
	b.ReportAllocs()
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		buf := directio.AlignedBlock(4096)
		i := next.Add(1) * 1000
		for pb.Next() {
			off := (i * 7919 % 16384) * 4096
			var err error
			if write {
				_, err = d.WriteAt(buf, off)
			} else {
				_, err = d.ReadAt(buf, off)
			}
			if err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkHistogramObserveParallel is one histogram observed from every
// P: the cost of sharing it, which the store's sharded counters avoid.
func BenchmarkHistogramObserveParallel(b *testing.B) {
	var h Histogram
	h.initSize()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.Observe(4096)
		}
	})
}

// BenchmarkPlanDo4KiB is the queue-thread path on a memory backend: plan a
// 4 KiB read or overwrite, perform its I/O through the submission seam
// (IOPlan.Do: backend.Mem in memory), finish, on a plain and on an
// encrypted disk. It must not allocate.
func BenchmarkPlanDo4KiB(b *testing.B) {
	for _, enc := range []bool{false, true} {
		for _, write := range []bool{false, true} {
			name := "read"
			if write {
				name = "overwrite"
			}
			filled := benchFilledDisk
			if enc {
				name, filled = "encrypted_"+name, benchFilledEncrypted
			}
			b.Run(name, func(b *testing.B) { benchPlanDo(b, filled(b), write) })
		}
	}
}

// benchPlanDo plans, performs and finishes 4 KiB requests of d.
func benchPlanDo(b *testing.B, d *Disk, write bool) {
	p := directio.AlignedBlock(4096)
	var pl IOPlan
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		off := int64(i%16384) * 4096
		ok := false
		if write {
			ok = d.PlanWrite(&pl, p, off, 8)
		} else {
			ok = d.PlanRead(&pl, p, off, 8)
		}
		if !ok {
			b.Fatal("not planned")
		}
		for k := range pl.IOs {
			if err := pl.Do(k); err != nil {
				b.Fatal(err)
			}
		}
		pl.Finish()
	}
}

// BenchmarkPlanPrepareSQE4KiB is the queue-thread path's CPU cost on a
// file: plan a 4 KiB read, have the File backend prepare its io_uring
// entry (not submitted), finish. It must not allocate.
func BenchmarkPlanPrepareSQE4KiB(b *testing.B) {
	path := b.TempDir() + "/store.img"
	if err := FormatPath(path, 256<<20, FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	s, err := OpenPath(path, testOptions())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	d := mustCreate(b, s, "bench.raw", 0)
	defer d.Close()
	fill := directio.AlignedBlock(1 << 20)
	for off := int64(0); off < 16<<20; off += 1 << 20 {
		if _, err := d.WriteAt(fill, off); err != nil {
			b.Fatal(err)
		}
	}
	p := directio.AlignedBlock(4096)
	var pl IOPlan
	var sqe iouring.SQE
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if !d.PlanRead(&pl, p, int64(i%4096)*4096, 8) {
			b.Fatal("not planned")
		}
		sqe = iouring.SQE{}
		if !prepareSQE(&pl, &sqe, 0) {
			b.Fatal("not prepared")
		}
		pl.Finish()
	}
}
