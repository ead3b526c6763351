package coalesce

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vdiskfs/vdiskfs/blockmap"
)

// data and hole build lookup segments for tables.
func data(virt, n, phys uint64) blockmap.Segment {
	return blockmap.Segment{Virt: virt, Len: n, Phys: phys}
}

func hole(virt, n uint64) blockmap.Segment {
	return blockmap.Segment{Virt: virt, Len: n, Hole: true}
}

func TestRunsTable(t *testing.T) {
	const bs = 4096
	tests := []struct {
		name      string
		segs      []blockmap.Segment
		base      uint64
		maxBlocks uint64
		want      []Run
	}{
		{"no segments", nil, 0, 0, nil},
		{"all holes", []blockmap.Segment{hole(10, 5), hole(15, 1)}, 10, 0, nil},
		{"one segment", []blockmap.Segment{data(10, 4, 100)}, 10, 0,
			[]Run{{Phys: 100, Blocks: 4, BufOff: 0, Virt: 10}}},
		{"two contiguous segments", []blockmap.Segment{data(10, 4, 100), data(14, 2, 104)}, 10, 0,
			[]Run{{Phys: 100, Blocks: 6, BufOff: 0, Virt: 10}}},
		{"not contiguous", []blockmap.Segment{data(10, 4, 100), data(14, 2, 200)}, 10, 0,
			[]Run{{Phys: 100, Blocks: 4, Virt: 10}, {Phys: 200, Blocks: 2, BufOff: 4 * bs, Virt: 14}}},
		{"physically backwards", []blockmap.Segment{data(0, 2, 50), data(2, 2, 48)}, 0, 0,
			[]Run{{Phys: 50, Blocks: 2, Virt: 0}, {Phys: 48, Blocks: 2, BufOff: 2 * bs, Virt: 2}}},
		{"hole in the middle", []blockmap.Segment{data(0, 2, 100), hole(2, 3), data(5, 1, 300)}, 0, 0,
			[]Run{{Phys: 100, Blocks: 2, Virt: 0}, {Phys: 300, Blocks: 1, BufOff: 5 * bs, Virt: 5}}},
		// The physical blocks after the hole follow on, but the buffer does
		// not: the hole's bytes sit between them. Two runs.
		{"hole between physically contiguous data", []blockmap.Segment{data(0, 2, 100), hole(2, 1), data(3, 2, 102)}, 0, 0,
			[]Run{{Phys: 100, Blocks: 2, Virt: 0}, {Phys: 102, Blocks: 2, BufOff: 3 * bs, Virt: 3}}},
		{"leading and trailing holes", []blockmap.Segment{hole(7, 1), data(8, 3, 9), hole(11, 2)}, 7, 0,
			[]Run{{Phys: 9, Blocks: 3, BufOff: 1 * bs, Virt: 8}}},
		{"split at maxBlocks exactly", []blockmap.Segment{data(0, 4, 100), data(4, 4, 104)}, 0, 4,
			[]Run{{Phys: 100, Blocks: 4, Virt: 0}, {Phys: 104, Blocks: 4, BufOff: 4 * bs, Virt: 4}}},
		{"split at maxBlocks with remainder", []blockmap.Segment{data(0, 3, 100), data(3, 7, 103)}, 0, 4,
			[]Run{
				{Phys: 100, Blocks: 4, Virt: 0},
				{Phys: 104, Blocks: 4, BufOff: 4 * bs, Virt: 4},
				{Phys: 108, Blocks: 2, BufOff: 8 * bs, Virt: 8},
			}},
		{"one long segment split", []blockmap.Segment{data(0, 9, 100)}, 0, 4,
			[]Run{
				{Phys: 100, Blocks: 4, Virt: 0},
				{Phys: 104, Blocks: 4, BufOff: 4 * bs, Virt: 4},
				{Phys: 108, Blocks: 1, BufOff: 8 * bs, Virt: 8},
			}},
		{"maxBlocks 1", []blockmap.Segment{data(0, 3, 100)}, 0, 1,
			[]Run{
				{Phys: 100, Blocks: 1, Virt: 0},
				{Phys: 101, Blocks: 1, BufOff: bs, Virt: 1},
				{Phys: 102, Blocks: 1, BufOff: 2 * bs, Virt: 2},
			}},
		{"zero-length segment is harmless", []blockmap.Segment{data(0, 2, 100), data(2, 0, 999), data(2, 2, 102)}, 0, 0,
			[]Run{{Phys: 100, Blocks: 4, Virt: 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Runs(nil, tt.segs, tt.base, bs, tt.maxBlocks)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Runs(%+v, base=%d, max=%d)\n got %+v\nwant %+v", tt.segs, tt.base, tt.maxBlocks, got, tt.want)
			}
		})
	}
}

// TestRunsSeedBug is the lesson the project started from: a 1 MiB write to
// 256 contiguous 4 KiB blocks is one backend I/O, not 256, however the map
// happens to cut the range into segments.
func TestRunsSeedBug(t *testing.T) {
	segs := make([]blockmap.Segment, 256)
	for i := range segs {
		segs[i] = data(1000+uint64(i), 1, 5000+uint64(i))
	}
	for _, maxBlocks := range []uint64{0, 256, 1024} {
		got := Runs(nil, segs, 1000, 4096, maxBlocks)
		want := []Run{{Phys: 5000, Blocks: 256, BufOff: 0, Virt: 1000}}
		if !slices.Equal(got, want) {
			t.Errorf("maxBlocks=%d: 256 contiguous blocks gave %d runs %+v, want %+v", maxBlocks, len(got), got, want)
		}
	}
}

// TestRunsKeepsCallerRuns checks that Runs appends after what dst holds and
// never grows a run the caller already had, even one that the first segment
// continues.
func TestRunsKeepsCallerRuns(t *testing.T) {
	prior := Run{Phys: 96, Blocks: 4, Virt: 6}
	dst := []Run{prior}
	got := Runs(dst, []blockmap.Segment{data(10, 2, 100)}, 10, 4096, 0)
	want := []Run{prior, {Phys: 100, Blocks: 2, Virt: 10}}
	if !slices.Equal(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestRunsPanicsOnGaps(t *testing.T) {
	tests := []struct {
		name string
		segs []blockmap.Segment
	}{
		{"first segment not at base", []blockmap.Segment{data(11, 1, 0)}},
		{"gap between segments", []blockmap.Segment{data(10, 1, 0), data(12, 1, 1)}},
		{"overlapping segments", []blockmap.Segment{data(10, 2, 0), hole(11, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("Runs(%+v, base=10) did not panic", tt.segs)
				}
			}()
			Runs(nil, tt.segs, 10, 4096, 0)
		})
	}
}

func TestRunsDoesNotAllocate(t *testing.T) {
	segs := randomSegments(rand.New(rand.NewPCG(1, 2)), 0, 200)
	dst := make([]Run, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() { dst = Runs(dst[:0], segs, 0, 4096, 8) })
	if allocs != 0 {
		t.Errorf("Runs allocates %v times per call with room in dst, want 0", allocs)
	}
}

// randomSegments returns n consecutive lookup segments from block base: a
// mix of holes, data that continues the previous data physically (also across
// a hole, which must not merge), and data elsewhere.
func randomSegments(r *rand.Rand, base uint64, n int) []blockmap.Segment {
	segs := make([]blockmap.Segment, 0, n)
	virt := base
	physEnd := uint64(1000) // physical end of the last data segment
	for range n {
		l := 1 + r.Uint64N(8)
		if r.IntN(4) == 0 {
			l = 1 + r.Uint64N(100) // now and then a long one, to split at maxBlocks
		}
		var s blockmap.Segment
		switch k := r.IntN(10); {
		case k < 2:
			s = hole(virt, l)
		case k < 7:
			s = data(virt, l, physEnd) // continues the previous data physically
		default:
			s = data(virt, l, r.Uint64N(1<<20))
		}
		if !s.Hole {
			physEnd = s.Phys + s.Len
		}
		segs = append(segs, s)
		virt += l
	}
	return segs
}

// modelRuns is the naive reference: expand the segments to one entry per
// data block, then walk the blocks and start a new run whenever a block does
// not continue the current one in both spaces, or the current one is full.
func modelRuns(segs []blockmap.Segment, base, bs, maxBlocks uint64) []Run {
	type block struct{ virt, phys uint64 }
	var blocks []block
	for _, s := range segs {
		for i := range s.Len {
			if !s.Hole {
				blocks = append(blocks, block{s.Virt + i, s.Phys + i})
			}
		}
	}
	var runs []Run
	for _, b := range blocks {
		if n := len(runs); n > 0 {
			last := &runs[n-1]
			if last.Virt+last.Blocks == b.virt && last.Phys+last.Blocks == b.phys &&
				(maxBlocks == 0 || last.Blocks < maxBlocks) {
				last.Blocks++
				continue
			}
		}
		runs = append(runs, Run{Phys: b.phys, Blocks: 1, BufOff: (b.virt - base) * bs, Virt: b.virt})
	}
	return runs
}

// checkRuns verifies the promises of Runs on its own terms, independently of
// the model: exact coverage of the data blocks, contiguity, the size limit,
// buffer offsets and a minimal number of runs.
func checkRuns(segs []blockmap.Segment, base, bs, maxBlocks uint64, runs []Run) error {
	// Which virtual block maps to which physical block, from the segments.
	want := map[uint64]uint64{}
	for _, s := range segs {
		for i := range s.Len {
			if !s.Hole {
				want[s.Virt+i] = s.Phys + i
			}
		}
	}

	// Each run is contiguous by construction of its fields; check that what
	// it claims matches the segments block by block, once each.
	got := map[uint64]uint64{}
	for i, r := range runs {
		if r.Blocks == 0 {
			return fmt.Errorf("run %d is empty: %+v", i, r)
		}
		if maxBlocks != 0 && r.Blocks > maxBlocks {
			return fmt.Errorf("run %d has %d blocks, more than %d: %+v", i, r.Blocks, maxBlocks, r)
		}
		if r.BufOff != (r.Virt-base)*bs {
			return fmt.Errorf("run %d BufOff %d, want %d: %+v", i, r.BufOff, (r.Virt-base)*bs, r)
		}
		if i > 0 && runs[i-1].Virt+runs[i-1].Blocks > r.Virt {
			return fmt.Errorf("run %d is not after run %d: %+v, %+v", i, i-1, runs[i-1], r)
		}
		for j := range r.Blocks {
			v := r.Virt + j
			p, ok := want[v]
			if !ok {
				return fmt.Errorf("run %d covers block %d, which is a hole or outside the segments", i, v)
			}
			if p != r.Phys+j {
				return fmt.Errorf("run %d maps block %d to %d, segments say %d", i, v, r.Phys+j, p)
			}
			if _, dup := got[v]; dup {
				return fmt.Errorf("block %d is in two runs", v)
			}
			got[v] = p
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("runs cover %d data blocks, segments have %d", len(got), len(want))
	}

	// Minimal: every maximal stretch of blocks contiguous in both spaces
	// needs ceil(len/maxBlocks) runs (1 without a limit), and no more are
	// allowed. Walk the virtual blocks in order; a stretch ends at a hole or
	// where the physical block does not follow on.
	minimal, stretch := uint64(0), uint64(0)
	endStretch := func() {
		if stretch > 0 && maxBlocks == 0 {
			minimal++
		} else if stretch > 0 {
			minimal += (stretch + maxBlocks - 1) / maxBlocks
		}
		stretch = 0
	}
	for v := base; v < endOf(segs, base); v++ {
		p, isData := want[v]
		switch {
		case !isData:
			endStretch()
		case stretch > 0 && want[v-1]+1 == p: // v-1 is data: the stretch runs on
			stretch++
		default:
			endStretch()
			stretch = 1
		}
	}
	endStretch()
	if uint64(len(runs)) != minimal {
		return fmt.Errorf("%d runs, the minimum is %d", len(runs), minimal)
	}
	return nil
}

// endOf returns the virtual block after the last segment.
func endOf(segs []blockmap.Segment, base uint64) uint64 {
	if len(segs) == 0 {
		return base
	}
	last := segs[len(segs)-1]
	return last.Virt + last.Len
}

func TestRunsProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 7))
	for it := range 2000 {
		base := r.Uint64N(1 << 40)
		segs := randomSegments(r, base, r.IntN(40))
		bs := uint64(512) << r.IntN(4)
		maxBlocks := []uint64{0, 1, 2, 3, 5, 8, 64, 256}[r.IntN(8)]

		// Start with some runs in dst, to check they are kept as they are.
		prior := make([]Run, r.IntN(3))
		for i := range prior {
			prior[i] = Run{Phys: r.Uint64N(100), Blocks: 1 + r.Uint64N(4), Virt: base - 1}
		}
		runs := Runs(slices.Clone(prior), segs, base, bs, maxBlocks)

		if !slices.Equal(runs[:len(prior)], prior) {
			t.Fatalf("iteration %d: the caller's runs changed: %+v, were %+v", it, runs[:len(prior)], prior)
		}
		runs = runs[len(prior):]
		if err := checkRuns(segs, base, bs, maxBlocks, runs); err != nil {
			t.Fatalf("iteration %d: base=%d bs=%d max=%d segs=%+v\nruns=%+v\n%v", it, base, bs, maxBlocks, segs, runs, err)
		}
		if want := modelRuns(segs, base, bs, maxBlocks); !slices.Equal(runs, want) {
			t.Fatalf("iteration %d: base=%d bs=%d max=%d segs=%+v\n got %+v\nwant %+v", it, base, bs, maxBlocks, segs, runs, want)
		}
	}
}

func BenchmarkRuns(b *testing.B) {
	// 256 one-block segments, as a map that was never merged would return
	// them: contiguous (the seed case, one run) and scattered (256 runs).
	contiguous := make([]blockmap.Segment, 256)
	scattered := make([]blockmap.Segment, 256)
	for i := range contiguous {
		contiguous[i] = data(uint64(i), 1, 1000+uint64(i))
		scattered[i] = data(uint64(i), 1, 1000+2*uint64(i))
	}
	for _, bc := range []struct {
		name string
		segs []blockmap.Segment
	}{{"contiguous", contiguous}, {"scattered", scattered}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]Run, 0, 256)
			for b.Loop() {
				dst = Runs(dst[:0], bc.segs, 0, 4096, 256)
			}
			b.ReportMetric(float64(len(dst)), "runs")
		})
	}
}
