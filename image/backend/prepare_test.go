package backend

import (
	"bytes"
	"testing"
)

// TestFilePrepare: Prepare allocates whole chunks of a sparse store file
// ahead of writes without changing a byte, Prepared then says so for any
// range inside them, and a Discard makes the chunks it touched unprepared
// again (the punch left a hole there).
func TestFilePrepare(t *testing.T) {
	const size = 3 * PrepareChunk / 2 // a whole chunk and a half one at the end
	path := newStoreFile(t, size)
	b := mustOpen(t, path, OpenOptions{})
	p, ok := b.(Preparer)
	if !ok {
		t.Fatalf("%T is not a Preparer", b)
	}
	data := aligned(MiB, 7)
	mustWrite(t, b, data, PrepareChunk-MiB) // the last MiB of chunk 0
	if p.Prepared(0, 4096) || p.Prepared(PrepareChunk, 4096) {
		t.Fatal("Prepared before any Prepare")
	}
	before := allocatedBytes(t, path)
	if err := p.Prepare(PrepareChunk-4096, 8192); err != nil { // both chunks
		t.Fatal(err)
	}
	if after := allocatedBytes(t, path); after < size {
		t.Errorf("after Prepare of both chunks the file takes %d bytes (before %d), want at least %d", after, before, int64(size))
	}
	for _, r := range [][2]int64{{0, 4096}, {PrepareChunk - MiB, 2 * MiB}, {size - 4096, 4096}} {
		if !p.Prepared(r[0], r[1]) {
			t.Errorf("Prepared(%d, %d) false after Prepare", r[0], r[1])
		}
	}
	if got := readBack(t, b, PrepareChunk-MiB, MiB); !bytes.Equal(got, data) {
		t.Error("Prepare changed data written before it")
	}
	wantZeros(t, "prepared range never written", readBack(t, b, 0, MiB))

	if err := b.Discard(PrepareChunk+MiB, MiB); err != nil {
		t.Fatal(err)
	}
	if p.Prepared(PrepareChunk, 4096) {
		t.Error("chunk 1 still prepared after a Discard in it")
	}
	if !p.Prepared(0, PrepareChunk) {
		t.Error("chunk 0 unprepared by a Discard in chunk 1")
	}
	if err := p.Prepare(PrepareChunk, 4096); err != nil || !p.Prepared(PrepareChunk+MiB, MiB) {
		t.Errorf("Prepare again after the Discard: %v, prepared %v", err, p.Prepared(PrepareChunk+MiB, MiB))
	}
}
