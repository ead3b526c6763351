package image

import (
	"testing"

	"github.com/ncw/directio"
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
