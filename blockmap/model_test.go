package blockmap

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// This file holds the reference model and the harness shared by the property
// test (TestAgainstModel) and the fuzz target (FuzzMapOps): every operation is
// applied to both a Map and a naive per-block model, and after each one all
// the Map's answers are compared with the model's.

// model is the naive reference: one entry per block of a window
// [base, base+len(mapped)) of virtual space. Blocks outside the window are
// never mapped. Keeping the window small makes overlaps frequent; placing it
// at the top of uint64 exercises the overflow edges.
type model struct {
	base     uint64
	mapped   []bool
	phys     []uint64 // phys[i] is valid when mapped[i]
	tweakOff []uint64 // tweakOff[i] is valid when mapped[i]
}

func newModel(base uint64, size int) *model {
	return &model{base: base, mapped: make([]bool, size), phys: make([]uint64, size), tweakOff: make([]uint64, size)}
}

// windowEnd is the first virtual block after the window.
func (md *model) windowEnd() uint64 { return md.base + uint64(len(md.mapped)) }

// at returns the mapping of virtual block v.
func (md *model) at(v uint64) (phys uint64, ok bool) {
	phys, _, ok = md.atTweak(v)
	return phys, ok
}

// atTweak returns the mapping of virtual block v with its tweak offset.
func (md *model) atTweak(v uint64) (phys, tweakOff uint64, ok bool) {
	if v < md.base || v >= md.windowEnd() {
		return 0, 0, false
	}
	i := v - md.base
	return md.phys[i], md.tweakOff[i], md.mapped[i]
}

// extentsIn returns the mappings of [virt, end) as maximal extents: runs of
// blocks contiguous in both spaces with one tweak offset. This is exactly what the Map must hold
// (for the whole window) and what Insert and Punch must report as freed (for
// the range they change), since a Map never holds two mergeable neighbours.
func (md *model) extentsIn(virt, end uint64) []Extent {
	var out []Extent
	for v := max(virt, md.base); v < min(end, md.windowEnd()); v++ {
		p, off, ok := md.atTweak(v)
		if !ok {
			continue
		}
		if n := len(out); n > 0 && out[n-1].End() == v && out[n-1].PhysEnd() == p && out[n-1].TweakOff == off {
			out[n-1].Len++
			continue
		}
		out = append(out, Extent{Virt: v, Phys: p, Len: 1, TweakOff: off})
	}
	return out
}

func (md *model) extents() []Extent { return md.extentsIn(md.base, md.windowEnd()) }

// set maps [virt, virt+n) to phys onwards with tweakOff (or unmaps it
// when unmap). The range must lie in the window.
func (md *model) set(virt, n uint64, phys, tweakOff uint64, unmap bool) {
	for k := uint64(0); k < n; k++ {
		i := virt - md.base + k
		md.mapped[i] = !unmap
		md.phys[i] = phys + k
		md.tweakOff[i] = tweakOff
	}
}

func (md *model) blocks() uint64 {
	var n uint64
	for _, ok := range md.mapped {
		if ok {
			n++
		}
	}
	return n
}

// lookup is the reference for Map.Lookup: block by block, merging holes with
// holes and data with data that follows on physically and in tweaks.
func (md *model) lookup(virt, n uint64) []Segment {
	var out []Segment
	for k := uint64(0); k < n; k++ {
		v := virt + k
		p, off, ok := md.atTweak(v)
		if i := len(out) - 1; i >= 0 {
			last := &out[i]
			if !ok && last.Hole || ok && !last.Hole && last.Phys+last.Len == p && last.Tweak+last.Len == v+off {
				last.Len++
				continue
			}
		}
		if ok {
			out = append(out, Segment{Virt: v, Len: 1, Phys: p, Tweak: v + off})
		} else {
			out = append(out, Segment{Virt: v, Len: 1, Hole: true})
		}
	}
	return out
}

func (md *model) nextData(virt uint64) (uint64, bool) {
	for v := max(virt, md.base); v < md.windowEnd(); v++ {
		if _, ok := md.at(v); ok {
			return v, true
		}
	}
	return 0, false
}

func (md *model) nextHole(virt uint64) uint64 {
	v := virt
	for {
		if _, ok := md.at(v); !ok {
			return v // the loop ends at windowEnd at the latest
		}
		v++
	}
}

// before is the reference for Map.Before, on the model's maximal extents.
func before(exts []Extent, virt uint64) (Extent, bool) {
	for i := len(exts) - 1; i >= 0; i-- {
		if exts[i].Virt < virt {
			return exts[i], true
		}
	}
	return Extent{}, false
}

// overlapping is the reference for Map.AscendRange.
func overlapping(exts []Extent, virt, end uint64) []Extent {
	var out []Extent
	if virt >= end {
		return nil // an empty range overlaps nothing
	}
	for _, e := range exts {
		if e.Virt < end && e.End() > virt {
			out = append(out, e)
		}
	}
	return out
}

// frozen is a clone taken earlier with the model state it must still match,
// however the map it was cloned from changed since.
type frozen struct {
	m    *Map
	want []Extent
}

// harness applies operations to a Map and a model and compares them.
type harness struct {
	tb     testing.TB
	label  string // printed with every failure: the seed, to reproduce it
	m      *Map
	md     *model
	physLo uint64 // physical addresses are drawn from [physLo, physHi)
	physHi uint64
	frozen []frozen
	ops    int
}

func newHarness(tb testing.TB, label string, base uint64, size int, physLo, physHi uint64) *harness {
	return &harness{tb: tb, label: label, m: New(), md: newModel(base, size), physLo: physLo, physHi: physHi}
}

func (h *harness) fatalf(format string, args ...any) {
	h.tb.Helper()
	h.tb.Fatalf("%s, op %d: %s", h.label, h.ops, fmt.Sprintf(format, args...))
}

// sentinel is put in front of the freed slice passed to Insert and Punch, to
// check that they append rather than overwrite.
var sentinel = Extent{Virt: 0xdead, Phys: 0xbeef, Len: 7}

func (h *harness) checkFreed(what string, got []Extent, want []Extent) {
	h.tb.Helper()
	if len(got) == 0 || got[0] != sentinel {
		h.fatalf("%s: freed lost its prefix: %v", what, got)
	}
	if !slices.Equal(got[1:], want) {
		h.fatalf("%s: freed %v, want %v", what, got[1:], want)
	}
}

// insert applies Insert(e); e must lie inside the model's window.
func (h *harness) insert(e Extent) {
	h.tb.Helper()
	h.ops++
	want := h.md.extentsIn(e.Virt, e.End())
	got := h.m.Insert(e, []Extent{sentinel})
	h.md.set(e.Virt, e.Len, e.Phys, e.TweakOff, false)
	h.checkFreed(fmt.Sprintf("Insert(%+v)", e), got, want)
}

// punch applies Punch(virt, n), n possibly huge.
func (h *harness) punch(virt, n uint64) {
	h.tb.Helper()
	h.ops++
	end := virt + min(n, math.MaxUint64-virt)
	want := h.md.extentsIn(virt, end)
	got := h.m.Punch(virt, n, []Extent{sentinel})
	lo, hi := max(virt, h.md.base), min(end, h.md.windowEnd())
	if lo < hi {
		h.md.set(lo, hi-lo, 0, 0, true)
	}
	h.checkFreed(fmt.Sprintf("Punch(%d, %d)", virt, n), got, want)
}

// cloneKeepOriginal clones the map, goes on with the original and freezes the
// clone; cloneKeepClone does the opposite. Both directions must be isolated.
func (h *harness) cloneKeepOriginal() {
	h.ops++
	h.frozen = append(h.frozen, frozen{m: h.m.Clone(), want: h.md.extents()})
}

func (h *harness) cloneKeepClone() {
	h.ops++
	c := h.m.Clone()
	h.frozen = append(h.frozen, frozen{m: h.m, want: h.md.extents()})
	h.m = c
}

func (h *harness) dropFrozen(i int) {
	h.checkFrozen(i)
	h.frozen = slices.Delete(h.frozen, i, i+1)
}

func (h *harness) checkFrozen(i int) {
	h.tb.Helper()
	f := h.frozen[i]
	if err := f.m.Check(); err != nil {
		h.fatalf("frozen map %d: %v", i, err)
	}
	if got := collect(f.m); !slices.Equal(got, f.want) {
		h.fatalf("frozen map %d changed:\n got %v\nwant %v", i, got, f.want)
	}
}

// verify compares the whole map with the model and asks the point queries
// at each of points and the range queries over each [points[i], points[i+1]).
func (h *harness) verify(points []uint64) {
	h.tb.Helper()
	m, md := h.m, h.md
	if err := m.Check(); err != nil {
		h.fatalf("%v", err)
	}
	want := md.extents()
	if got := collect(m); !slices.Equal(got, want) {
		h.fatalf("extents:\n got %v\nwant %v", got, want)
	}
	if m.Len() != len(want) {
		h.fatalf("Len() = %d, want %d", m.Len(), len(want))
	}
	if m.Blocks() != md.blocks() {
		h.fatalf("Blocks() = %d, want %d", m.Blocks(), md.blocks())
	}
	last, ok := m.Last()
	if wantOK := len(want) > 0; ok != wantOK || ok && last != want[len(want)-1] {
		h.fatalf("Last() = %+v, %v; want %v", last, ok, want)
	}

	for _, v := range points {
		gotD, gotOK := m.NextData(v)
		wantD, wantOK := md.nextData(v)
		if gotD != wantD || gotOK != wantOK {
			h.fatalf("NextData(%d) = %d, %v; want %d, %v", v, gotD, gotOK, wantD, wantOK)
		}
		if got, w := m.NextHole(v), md.nextHole(v); got != w {
			h.fatalf("NextHole(%d) = %d, want %d", v, got, w)
		}
		gotB, gotOK := m.Before(v)
		wantB, wantOK := before(want, v)
		if gotB != wantB || gotOK != wantOK {
			h.fatalf("Before(%d) = %+v, %v; want %+v, %v", v, gotB, gotOK, wantB, wantOK)
		}
	}

	var buf [64]Segment
	for i := 0; i+1 < len(points); i++ {
		virt, end := min(points[i], points[i+1]), max(points[i], points[i+1])
		n := end - virt
		// Lookup appends after what dst already holds.
		prefix := Segment{Virt: 1, Len: 2, Phys: 3}
		got := m.Lookup(append(buf[:0], prefix), virt, n)
		if got[0] != prefix {
			h.fatalf("Lookup(%d, %d) overwrote dst[0]: %v", virt, n, got)
		}
		if w := md.lookup(virt, n); !slices.Equal(got[1:], w) {
			h.fatalf("Lookup(%d, %d):\n got %v\nwant %v", virt, n, got[1:], w)
		}
		var gotR []Extent
		m.AscendRange(virt, n, func(e Extent) bool {
			gotR = append(gotR, e)
			return true
		})
		if w := overlapping(want, virt, end); !slices.Equal(gotR, w) {
			h.fatalf("AscendRange(%d, %d):\n got %v\nwant %v", virt, n, gotR, w)
		}
	}
}

func collect(m *Map) []Extent {
	var out []Extent
	m.Ascend(func(e Extent) bool {
		out = append(out, e)
		return true
	})
	return out
}

// tweakOffs are the tweak offsets inserts use: few, so that neighbours
// share one often and differ often; 0 is a plain disk's, and the largest
// puts tweaks at the wrap of uint64.
var tweakOffs = []uint64{0, 0, 5, math.MaxUint64}

// randomOp applies one random operation. Inserts are shaped so that overlaps,
// merges and identical rewrites all happen often.
func (h *harness) randomOp(rng *rand.Rand) {
	h.tb.Helper()
	md := h.md
	size := uint64(len(md.mapped))
	physSize := h.physHi - h.physLo
	// randLen returns 1..max, mostly short, sometimes long.
	randLen := func(max uint64) uint64 {
		l := 1 + rng.Uint64N(16)
		if rng.IntN(8) == 0 {
			l = 1 + rng.Uint64N(size/2)
		}
		return min(l, max)
	}
	switch r := rng.IntN(100); {
	case r < 30: // insert at a random place with a random physical address
		virt := md.base + rng.Uint64N(size)
		n := randLen(md.windowEnd() - virt)
		n = min(n, physSize)
		phys := h.physLo + rng.Uint64N(physSize-n+1)
		h.insert(Extent{Virt: virt, Phys: phys, Len: n, TweakOff: tweakOffs[rng.IntN(len(tweakOffs))]})
	case r < 45: // continue an extent in both spaces: a sequential write
		exts := md.extents()
		if len(exts) == 0 {
			return
		}
		prev := exts[rng.IntN(len(exts))]
		if prev.End() == md.windowEnd() || prev.PhysEnd() == h.physHi {
			return
		}
		n := randLen(min(md.windowEnd()-prev.End(), h.physHi-prev.PhysEnd()))
		off := prev.TweakOff // mostly a write that continues the tweaks too
		if rng.IntN(4) == 0 {
			off = tweakOffs[rng.IntN(len(tweakOffs))]
		}
		h.insert(Extent{Virt: prev.End(), Phys: prev.PhysEnd(), Len: n, TweakOff: off})
	case r < 52: // fill a hole back with what was there: merges on both sides
		exts := md.extents()
		if len(exts) == 0 {
			return
		}
		e := exts[rng.IntN(len(exts))]
		off := rng.Uint64N(e.Len)
		n := 1 + rng.Uint64N(e.Len-off)
		h.punch(e.Virt+off, n)
		h.insert(Extent{Virt: e.Virt + off, Phys: e.Phys + off, Len: n, TweakOff: e.TweakOff})
	case r < 57: // rewrite a mapped range with its own mapping
		exts := md.extents()
		if len(exts) == 0 {
			return
		}
		e := exts[rng.IntN(len(exts))]
		off := rng.Uint64N(e.Len)
		h.insert(Extent{Virt: e.Virt + off, Phys: e.Phys + off, Len: 1 + rng.Uint64N(e.Len-off), TweakOff: e.TweakOff})
	case r < 80: // punch a short range, possibly outside the window
		virt := md.base + rng.Uint64N(size)
		if rng.IntN(10) == 0 && md.base > 0 {
			virt = md.base - 1 - rng.Uint64N(min(md.base, 8))
		}
		h.punch(virt, rng.Uint64N(24))
	case r < 83: // punch to the end, in each spelling callers use
		virt := md.base + rng.Uint64N(size)
		switch rng.IntN(3) {
		case 0:
			h.punch(virt, math.MaxUint64-virt)
		case 1:
			h.punch(virt, math.MaxUint64)
		default:
			h.punch(virt, md.windowEnd()-virt)
		}
	case r < 88:
		h.cloneKeepOriginal()
	case r < 91:
		h.cloneKeepClone()
	case r < 96:
		if len(h.frozen) > 0 {
			h.dropFrozen(rng.IntN(len(h.frozen)))
		}
	default: // a fresh start now and then keeps the map from staying full
		if rng.IntN(4) == 0 {
			h.punch(0, math.MaxUint64)
		}
	}
	// Bound the number of live clones so each keeps being verified.
	for len(h.frozen) > 4 {
		h.dropFrozen(0)
	}
}

// randomPoints returns points in and around the window for verify.
func (h *harness) randomPoints(rng *rand.Rand, n int) []uint64 {
	md := h.md
	size := uint64(len(md.mapped))
	pts := make([]uint64, n)
	for i := range pts {
		// Mostly inside; a few just outside on each side where possible.
		lo := md.base - min(md.base, 4)
		hi := md.windowEnd() + min(math.MaxUint64-md.windowEnd(), 4)
		if rng.IntN(8) == 0 {
			pts[i] = lo + rng.Uint64N(hi-lo+1)
			if hi == math.MaxUint64 && rng.IntN(2) == 0 {
				pts[i] = math.MaxUint64
			}
		} else {
			pts[i] = md.base + rng.Uint64N(size)
		}
	}
	return pts
}

// modelConfig is one placement of the window in virtual and physical space.
type modelConfig struct {
	name   string
	base   uint64
	size   int
	physLo uint64
	physHi uint64
}

var modelConfigs = []modelConfig{
	// A small physical space makes accidental physical contiguity common.
	{name: "low", base: 0, size: 512, physLo: 0, physHi: 1024},
	{name: "top", base: math.MaxUint64 - 512, size: 512, physLo: math.MaxUint64 - 1024, physHi: math.MaxUint64},
}

var seedFlag = flag.Uint64("seed", 0, "seed for TestAgainstModel (0: a random one, printed on failure)")

// TestAgainstModel runs random operations against the map and the model,
// comparing them after every operation. The seed is random on each run and
// printed on failure; rerun with -seed=N to reproduce.
func TestAgainstModel(t *testing.T) {
	ops := 25000 // per configuration
	if testing.Short() {
		ops = 2000
	}
	for _, cfg := range modelConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			seed := *seedFlag
			if seed == 0 {
				seed = rand.Uint64()
			}
			rng := rand.New(rand.NewPCG(seed, seed))
			h := newHarness(t, fmt.Sprintf("seed %d (rerun with -run=TestAgainstModel/%s -seed=%d)", seed, cfg.name, seed),
				cfg.base, cfg.size, cfg.physLo, cfg.physHi)
			for h.ops < ops {
				h.randomOp(rng)
				h.verify(h.randomPoints(rng, 4))
				if len(h.frozen) > 0 {
					h.checkFrozen(rng.IntN(len(h.frozen)))
				}
			}
			for i := range h.frozen {
				h.checkFrozen(i)
			}
		})
	}
}

// FuzzMapOps decodes its input into operations on a small window and checks
// them against the model. The first byte picks the window placement; then
// every 4 bytes are one operation: opcode, a, b, c.
func FuzzMapOps(f *testing.F) {
	f.Add([]byte{0, 0, 10, 5, 100, 0, 15, 5, 105, 1, 12, 2, 0})              // merge, then split by punch
	f.Add([]byte{1, 0, 250, 6, 200, 0, 0, 255, 0, 2, 0, 0, 0, 1, 3, 255, 0}) // top of uint64, punch to the end
	f.Add([]byte{0, 0, 0, 8, 0, 0, 8, 8, 8, 0, 16, 8, 16, 3, 0, 0, 0, 0, 4, 8, 0})
	f.Add([]byte{0, 0, 1, 30, 40, 4, 0, 0, 0, 0, 5, 10, 200, 5, 0, 0, 0, 1, 0, 255, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		cfg := modelConfigs[int(data[0])%len(modelConfigs)]
		// The window is 256 blocks so that a byte addresses it.
		h := newHarness(t, fmt.Sprintf("fuzz input %x", data), cfg.base, 256, cfg.physHi-512, cfg.physHi)
		data = data[1:]
		points := []uint64{cfg.base, cfg.base + 255, cfg.base + 256}
		for ; len(data) >= 4; data = data[4:] {
			op, a, b, c := data[0], uint64(data[1]), uint64(data[2]), uint64(data[3])
			virt := cfg.base + a
			switch op % 6 {
			case 0: // insert at a, b+1 blocks (clipped to the window), at phys c
				n := min(b+1, 256-a)
				h.insert(Extent{Virt: virt, Phys: h.physLo + c, Len: n, TweakOff: tweakOffs[int(c)%len(tweakOffs)]})
			case 1: // punch a, len b, or to the end when b == 255
				n := b
				if b == 255 {
					n = math.MaxUint64 - virt
				}
				h.punch(virt, n)
			case 2:
				h.cloneKeepOriginal()
			case 3:
				h.cloneKeepClone()
			case 4: // continue the extent before a in both spaces, for b+1 blocks
				prev, ok := h.m.Before(virt)
				if n := min(b+1, h.md.windowEnd()-prev.End(), h.physHi-prev.PhysEnd()); ok && n > 0 {
					h.insert(Extent{Virt: prev.End(), Phys: prev.PhysEnd(), Len: n, TweakOff: tweakOffs[int(c)%len(tweakOffs)]})
				}
			case 5:
				if len(h.frozen) > 0 {
					h.dropFrozen(int(a) % len(h.frozen))
				}
			}
			points = append(points[:3], virt, cfg.base+b, cfg.base+c)
			h.verify(points)
		}
		for i := range h.frozen {
			h.checkFrozen(i)
		}
	})
}
