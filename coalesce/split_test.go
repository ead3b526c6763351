package coalesce

import (
	"fmt"
	"math"
	"testing"
)

// checkSplit verifies every promise of Split and BlockRange for one range.
// It returns "" when all hold, so that sweeps over millions of ranges stay
// cheap and report the first broken range.
func checkSplit(off, n, bs uint64) string {
	s := Split(off, n, bs)
	spans := s.All()
	first, count := BlockRange(off, n, bs)

	if n == 0 {
		if len(spans) != 0 || first != 0 || count != 0 {
			return fmt.Sprintf("n=0: spans %s, BlockRange (%d,%d)", dump(s), first, count)
		}
		return ""
	}
	if len(spans) == 0 || len(spans) > 3 {
		return fmt.Sprintf("%d spans: %s", len(spans), dump(s))
	}

	pos := off // next byte the spans must cover
	wholeSpans := 0
	for i, sp := range spans {
		switch {
		case sp.Len == 0 || sp.Blocks == 0:
			return fmt.Sprintf("span %d empty: %s", i, dump(s))
		case sp.Off >= bs:
			return fmt.Sprintf("span %d Off %d >= bs: %s", i, sp.Off, dump(s))
		case sp.Block*bs+sp.Off != pos:
			return fmt.Sprintf("span %d starts at byte %d, want %d: %s", i, sp.Block*bs+sp.Off, pos, dump(s))
		case sp.BufOff != pos-off:
			return fmt.Sprintf("span %d BufOff %d, want %d: %s", i, sp.BufOff, pos-off, dump(s))
		case sp.Off != 0 && i != 0:
			return fmt.Sprintf("span %d starts inside a block but is not the head: %s", i, dump(s))
		}
		coversWholeBlocks := sp.Off == 0 && sp.Len == sp.Blocks*bs
		if sp.Partial == coversWholeBlocks {
			return fmt.Sprintf("span %d Partial=%v but covers whole blocks=%v: %s", i, sp.Partial, coversWholeBlocks, dump(s))
		}
		if sp.Partial {
			if sp.Blocks != 1 || sp.Off+sp.Len > bs {
				return fmt.Sprintf("partial span %d is not within one block: %s", i, dump(s))
			}
			// Partial spans are the head (first) or the tail (last) only.
			if i != 0 && i != len(spans)-1 {
				return fmt.Sprintf("partial span %d in the middle: %s", i, dump(s))
			}
		} else {
			wholeSpans++
		}
		pos += sp.Len
	}
	if pos != off+n {
		return fmt.Sprintf("spans end at %d, want %d: %s", pos, off+n, dump(s))
	}
	if wholeSpans > 1 {
		return fmt.Sprintf("%d whole-block spans, want at most 1: %s", wholeSpans, dump(s))
	}
	if len(spans) == 3 && !(spans[0].Partial && !spans[1].Partial && spans[2].Partial) {
		return fmt.Sprintf("3 spans are not head, middle, tail: %s", dump(s))
	}
	if len(spans) == 2 && spans[0].Partial == spans[1].Partial && spans[0].Block+1 != spans[1].Block {
		// Two partial spans are a head and a tail in adjacent blocks.
		return fmt.Sprintf("2 spans not a head+middle, middle+tail or head+tail pair: %s", dump(s))
	}
	if off/bs == (off+n-1)/bs && len(spans) != 1 {
		return fmt.Sprintf("range within block %d gave %d spans: %s", off/bs, len(spans), dump(s))
	}

	// BlockRange agrees with the spans and with plain arithmetic on the
	// first and last byte.
	last := spans[len(spans)-1]
	if first != spans[0].Block || first+count != last.Block+last.Blocks {
		return fmt.Sprintf("BlockRange (%d,%d) disagrees with spans %s", first, count, dump(s))
	}
	if first != off/bs || count != (off+n-1)/bs-off/bs+1 {
		return fmt.Sprintf("BlockRange (%d,%d), want (%d,%d)", first, count, off/bs, (off+n-1)/bs-off/bs+1)
	}
	return ""
}

// dump formats spans for a failure message. It takes a copy so that the
// caller's Spans does not escape to the heap on the fast path.
func dump(s Spans) string { return fmt.Sprintf("%+v", s.All()) }

// TestSplitSweep checks every offset in [0, 3*bs) with every length in
// [0, 3*bs] (the model is gocryptfs's contentenc offsets tests). For
// bs = 4096 that is 151 million ranges: too slow under -race, so there (and
// with -short) the 4096 sweep keeps only ranges with an edge near a block
// boundary or on a coarse lattice. Split has no dependence on bs beyond its
// boundaries, and the full 512 sweep always runs.
func TestSplitSweep(t *testing.T) {
	for _, bs := range []uint64{512, 4096} {
		t.Run(fmt.Sprint(bs), func(t *testing.T) {
			full := bs == 512 || !(raceEnabled || testing.Short())
			checked := 0
			for off := uint64(0); off < 3*bs; off++ {
				for n := uint64(0); n <= 3*bs; n++ {
					if !full && !nearEdge(off, bs) && !nearEdge(n, bs) && !nearEdge(off+n, bs) {
						continue
					}
					checked++
					if msg := checkSplit(off, n, bs); msg != "" {
						t.Fatalf("Split(off=%d, n=%d, bs=%d): %s", off, n, bs, msg)
					}
				}
			}
			t.Logf("bs=%d: %d ranges checked", bs, checked)
		})
	}
}

// nearEdge reports whether x is within 16 bytes of a multiple of bs, or on
// a lattice of 127 bytes that samples the rest.
func nearEdge(x, bs uint64) bool {
	r := x & (bs - 1)
	return r <= 16 || r >= bs-16 || x%127 == 0
}

// TestSplitLarge checks ranges near 2^62, 2^63 (the largest end callers
// accept) and 2^64 (where computing a rounded-up end would overflow).
func TestSplitLarge(t *testing.T) {
	ends := []uint64{1 << 62, 1<<62 + 1, 1<<62 + 4095, 1 << 63, 1<<63 - 1, math.MaxUint64, math.MaxUint64 - 4096}
	for _, bs := range []uint64{512, 4096, 1 << 20} {
		for _, end := range ends {
			for _, n := range []uint64{0, 1, 2, bs - 1, bs, bs + 1, 2*bs - 1, 3 * bs, 1000 * bs, 1000*bs + 7} {
				for _, shift := range []uint64{0, 1, bs - 1, bs, bs + 3} {
					e := end - shift // the range ends at e
					if n > e {
						continue
					}
					if msg := checkSplit(e-n, n, bs); msg != "" {
						t.Fatalf("Split(off=%d, n=%d, bs=%d): %s", e-n, n, bs, msg)
					}
				}
			}
		}
	}
	// A whole range ending exactly at 2^63: one span of whole blocks.
	s := Split(1<<62, 1<<62, 4096)
	want := Span{Block: 1 << 50, Blocks: 1 << 50, Len: 1 << 62}
	if s.N != 1 || s.S[0] != want {
		t.Errorf("Split(2^62, 2^62, 4096) = %+v, want [%+v]", s.All(), want)
	}
}

// TestSplitExamples pins a few results in full, as documentation.
func TestSplitExamples(t *testing.T) {
	tests := []struct {
		off, n uint64
		want   []Span
	}{
		{0, 0, nil},
		{0, 4096, []Span{{Block: 0, Blocks: 1, Len: 4096}}},
		{100, 200, []Span{{Block: 0, Blocks: 1, Off: 100, Len: 200, Partial: true}}},
		{0, 100, []Span{{Block: 0, Blocks: 1, Len: 100, Partial: true}}},
		{4000, 96, []Span{{Block: 0, Blocks: 1, Off: 4000, Len: 96, Partial: true}}},
		{4000, 200, []Span{
			{Block: 0, Blocks: 1, Off: 4000, Len: 96, Partial: true},
			{Block: 1, Blocks: 1, Len: 104, BufOff: 96, Partial: true},
		}},
		{8192, 1 << 20, []Span{{Block: 2, Blocks: 256, Len: 1 << 20}}},
		{100, 3 * 4096, []Span{
			{Block: 0, Blocks: 1, Off: 100, Len: 3996, Partial: true},
			{Block: 1, Blocks: 2, Len: 8192, BufOff: 3996},
			{Block: 3, Blocks: 1, Len: 100, BufOff: 12188, Partial: true},
		}},
		{4096, 4096 + 1, []Span{
			{Block: 1, Blocks: 1, Len: 4096},
			{Block: 2, Blocks: 1, Len: 1, BufOff: 4096, Partial: true},
		}},
	}
	for _, tt := range tests {
		s := Split(tt.off, tt.n, 4096)
		got := s.All()
		if len(got) != len(tt.want) {
			t.Errorf("Split(%d, %d) = %+v, want %+v", tt.off, tt.n, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("Split(%d, %d) = %+v, want %+v", tt.off, tt.n, got, tt.want)
				break
			}
		}
	}
}

func TestSplitPanics(t *testing.T) {
	tests := []struct {
		name       string
		off, n, bs uint64
	}{
		{"bs 0", 0, 1, 0},
		{"bs not a power of two", 0, 1, 3000},
		{"range wraps", math.MaxUint64, 2, 4096},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, f := range []func(){
				func() { Split(tt.off, tt.n, tt.bs) },
				func() { BlockRange(tt.off, tt.n, tt.bs) },
			} {
				func() {
					defer func() {
						if recover() == nil {
							t.Errorf("no panic for off=%d n=%d bs=%d", tt.off, tt.n, tt.bs)
						}
					}()
					f()
				}()
			}
		})
	}
}

func TestSplitDoesNotAllocate(t *testing.T) {
	var sink Spans
	allocs := testing.AllocsPerRun(100, func() { sink = Split(100, 1<<20, 4096) })
	if allocs != 0 {
		t.Errorf("Split allocates %v times per call, want 0", allocs)
	}
	_ = sink
}

func TestHelpers(t *testing.T) {
	for _, tt := range []struct{ x, a, down, up uint64 }{
		{0, 4096, 0, 0},
		{1, 4096, 0, 4096},
		{4095, 4096, 0, 4096},
		{4096, 4096, 4096, 4096},
		{4097, 4096, 4096, 8192},
		{1<<63 - 1, 512, 1<<63 - 512, 1 << 63},
		{1000, 3, 999, 1002}, // not a power of two: still right
	} {
		if got := RoundDown(tt.x, tt.a); got != tt.down {
			t.Errorf("RoundDown(%d, %d) = %d, want %d", tt.x, tt.a, got, tt.down)
		}
		if got := RoundUp(tt.x, tt.a); got != tt.up {
			t.Errorf("RoundUp(%d, %d) = %d, want %d", tt.x, tt.a, got, tt.up)
		}
	}
	if got := BlockOf(8191, 4096); got != 1 {
		t.Errorf("BlockOf(8191, 4096) = %d, want 1", got)
	}
	if got := BlockOf(8192, 4096); got != 2 {
		t.Errorf("BlockOf(8192, 4096) = %d, want 2", got)
	}
	if got := BlockStart(3, 512); got != 1536 {
		t.Errorf("BlockStart(3, 512) = %d, want 1536", got)
	}
}

func BenchmarkSplit(b *testing.B) {
	b.ReportAllocs()
	var sink Spans
	for i := 0; b.Loop(); i++ {
		// An unaligned 1 MiB range: head, middle and tail.
		sink = Split(uint64(i)*4096+100, 1<<20, 4096)
	}
	_ = sink
}
