package image

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/blockmap"
)

// TestMillionExtents builds a store whose one disk maps a million
// non-mergeable extents (what a fully random 4 KiB write workload leaves),
// then measures what the project's targets name: opening it (checkpoint
// load; target ≤ 2 s), the heap it takes (target ≤ 64 B per extent of map),
// and Check. The extents are made white-box (straight into the map and the
// allocator, then a checkpoint), so no data is written: the store is a
// sparse file. Skipped with -short.
func TestMillionExtents(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a million-extent store")
	}
	const extents = 1 << 20
	path := filepath.Join(t.TempDir(), "big.store")
	if err := FormatPath(path, 16<<30, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := OpenPath(path, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("frag.raw", 2*extents*4096, Attr{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	d := s.mu.names["frag.raw"]
	// Every other virtual block, physical blocks in reverse order: no two
	// extents merge.
	for i := uint64(0); i < extents; i++ {
		phys := extents - 1 - i
		if err := s.mu.alloc.Take(pext{Start: phys, Len: 1}); err != nil {
			t.Fatal(err)
		}
		d.m.Insert(blockmap.Extent{Virt: 2 * i, Phys: phys, Len: 1}, nil)
	}
	s.mu.extents = d.m.Len()
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("close (checkpoint of %d extents): %v", extents, time.Since(start))

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start = time.Now()
	s, err = OpenPath(path, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	openTime := time.Since(start)
	defer s.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	perExtent := float64(after.HeapAlloc-before.HeapAlloc) / extents
	info, _ := s.Stat("frag.raw")
	if info.Extents != extents {
		t.Fatalf("%d extents after reopen, want %d", info.Extents, extents)
	}
	start = time.Now()
	rep := s.Check()
	checkTime := time.Since(start)
	if !rep.Clean() {
		t.Fatalf("check: %v", rep.Findings[:min(3, len(rep.Findings))])
	}
	st, _ := os.Stat(path)
	t.Logf("open with %d extents: %v (includes Check at open); heap %.1f B per extent (store, maps and allocator); Check %v; checkpoint %d bytes; store file %d bytes apparent",
		extents, openTime, perExtent, checkTime, s.Info().CkptBytes, st.Size())
	if perExtent > 128 {
		t.Errorf("%.1f B of heap per extent; the map's own target is 64 B (blockmap's benchmark measures 28-44 B)", perExtent)
	}
}
