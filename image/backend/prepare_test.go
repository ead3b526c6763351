package backend

import "testing"

// TestFilePrepared: a File's chunks start unprepared; MarkPrepared marks
// one; a Discard unmarks every chunk it punches a hole in, and only those.
func TestFilePrepared(t *testing.T) {
	const size = 3 * PrepareChunk
	b := mustOpen(t, newStoreFile(t, size), OpenOptions{})
	p, ok := b.(Preparer)
	if !ok {
		t.Fatalf("%T is not a Preparer", b)
	}
	if p.PrepareChunk() != PrepareChunk || PrepareChunk%int64(b.SectorSize()) != 0 {
		t.Fatalf("chunk %d, sector %d", p.PrepareChunk(), b.SectorSize())
	}
	for c := range int64(3) {
		if p.Prepared(c) {
			t.Fatalf("chunk %d prepared after open", c)
		}
		p.MarkPrepared(c)
	}
	if err := b.Discard(PrepareChunk-MiB, 2*MiB); err != nil { // the end of 0, the start of 1
		t.Fatal(err)
	}
	if p.Prepared(0) || p.Prepared(1) || !p.Prepared(2) {
		t.Errorf("after a Discard across chunks 0 and 1: prepared %v %v %v, want false false true", p.Prepared(0), p.Prepared(1), p.Prepared(2))
	}
	if p.Prepared(3) || p.Prepared(1<<40) {
		t.Error("a chunk past the end is prepared")
	}
}
