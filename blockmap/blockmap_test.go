package blockmap

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

const maxU = math.MaxUint64

// mapOf builds a map by inserting exts in order.
func mapOf(t *testing.T, exts ...Extent) *Map {
	t.Helper()
	m := New()
	for _, e := range exts {
		if freed := m.Insert(e, nil); len(freed) != 0 {
			t.Fatalf("building the map: Insert(%+v) freed %v", e, freed)
		}
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	return m
}

// wantMap fails unless m passes Check and holds exactly want.
func wantMap(t *testing.T, m *Map, want []Extent) {
	t.Helper()
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	if got := collect(m); !slices.Equal(got, want) {
		t.Fatalf("map holds %v, want %v", got, want)
	}
	var blocks uint64
	for _, e := range want {
		blocks += e.Len
	}
	if m.Blocks() != blocks || m.Len() != len(want) {
		t.Fatalf("Blocks() = %d, Len() = %d; want %d, %d", m.Blocks(), m.Len(), blocks, len(want))
	}
}

func TestInsert(t *testing.T) {
	tests := []struct {
		name   string
		before []Extent
		insert Extent
		want   []Extent
		freed  []Extent
	}{
		{
			name:   "into empty",
			insert: Extent{Virt: 10, Phys: 100, Len: 5},
			want:   []Extent{{Virt: 10, Phys: 100, Len: 5}},
		},
		{
			name:   "exact overlap",
			before: []Extent{{Virt: 10, Phys: 100, Len: 5}},
			insert: Extent{Virt: 10, Phys: 200, Len: 5},
			want:   []Extent{{Virt: 10, Phys: 200, Len: 5}},
			freed:  []Extent{{Virt: 10, Phys: 100, Len: 5}},
		},
		{
			name:   "overlaps the head of an extent",
			before: []Extent{{Virt: 10, Phys: 100, Len: 10}},
			insert: Extent{Virt: 5, Phys: 200, Len: 10},
			want:   []Extent{{Virt: 5, Phys: 200, Len: 10}, {Virt: 15, Phys: 105, Len: 5}},
			freed:  []Extent{{Virt: 10, Phys: 100, Len: 5}},
		},
		{
			name:   "overlaps the tail of an extent",
			before: []Extent{{Virt: 10, Phys: 100, Len: 10}},
			insert: Extent{Virt: 15, Phys: 200, Len: 10},
			want:   []Extent{{Virt: 10, Phys: 100, Len: 5}, {Virt: 15, Phys: 200, Len: 10}},
			freed:  []Extent{{Virt: 15, Phys: 105, Len: 5}},
		},
		{
			name:   "inside an extent splits it in three",
			before: []Extent{{Virt: 10, Phys: 100, Len: 10}},
			insert: Extent{Virt: 12, Phys: 200, Len: 3},
			want:   []Extent{{Virt: 10, Phys: 100, Len: 2}, {Virt: 12, Phys: 200, Len: 3}, {Virt: 15, Phys: 105, Len: 5}},
			freed:  []Extent{{Virt: 12, Phys: 102, Len: 3}},
		},
		{
			name:   "spans several extents and holes",
			before: []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 6, Phys: 200, Len: 4}, {Virt: 12, Phys: 300, Len: 4}},
			insert: Extent{Virt: 2, Phys: 500, Len: 12},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 2}, {Virt: 2, Phys: 500, Len: 12}, {Virt: 14, Phys: 302, Len: 2}},
			freed:  []Extent{{Virt: 2, Phys: 102, Len: 2}, {Virt: 6, Phys: 200, Len: 4}, {Virt: 12, Phys: 300, Len: 2}},
		},
		{
			name:   "merges left",
			before: []Extent{{Virt: 0, Phys: 100, Len: 4}},
			insert: Extent{Virt: 4, Phys: 104, Len: 4},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 8}},
		},
		{
			name:   "merges right",
			before: []Extent{{Virt: 4, Phys: 104, Len: 4}},
			insert: Extent{Virt: 0, Phys: 100, Len: 4},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 8}},
		},
		{
			name:   "merges both sides",
			before: []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 8, Phys: 108, Len: 4}},
			insert: Extent{Virt: 4, Phys: 104, Len: 4},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 12}},
		},
		{
			name:   "replaces the middle and merges both sides",
			before: []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 4, Phys: 500, Len: 4}, {Virt: 8, Phys: 108, Len: 4}},
			insert: Extent{Virt: 4, Phys: 104, Len: 4},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 12}},
			freed:  []Extent{{Virt: 4, Phys: 500, Len: 4}},
		},
		{
			name:   "no merge when only virtually contiguous",
			before: []Extent{{Virt: 0, Phys: 100, Len: 4}},
			insert: Extent{Virt: 4, Phys: 200, Len: 4},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 4, Phys: 200, Len: 4}},
		},
		{
			name:   "no merge when only physically contiguous",
			before: []Extent{{Virt: 0, Phys: 100, Len: 4}},
			insert: Extent{Virt: 5, Phys: 104, Len: 4},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 5, Phys: 104, Len: 4}},
		},
		{
			// The range was mapped to the same blocks: they are reported
			// as freed all the same (see Insert's doc).
			name:   "rewrite of the same mapping",
			before: []Extent{{Virt: 0, Phys: 100, Len: 10}},
			insert: Extent{Virt: 3, Phys: 103, Len: 2},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 10}},
			freed:  []Extent{{Virt: 3, Phys: 103, Len: 2}},
		},
		{
			name:   "zero length does nothing",
			before: []Extent{{Virt: 0, Phys: 100, Len: 10}},
			insert: Extent{Virt: 3, Phys: 500, Len: 0},
			want:   []Extent{{Virt: 0, Phys: 100, Len: 10}},
		},
		{
			name:   "reaches the top of both spaces",
			before: []Extent{{Virt: maxU - 8, Phys: maxU - 8, Len: 4}},
			insert: Extent{Virt: maxU - 4, Phys: maxU - 4, Len: 4},
			want:   []Extent{{Virt: maxU - 8, Phys: maxU - 8, Len: 8}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mapOf(t, tt.before...)
			freed := m.Insert(tt.insert, nil)
			if !slices.Equal(freed, tt.freed) {
				t.Errorf("freed %v, want %v", freed, tt.freed)
			}
			wantMap(t, m, tt.want)
		})
	}
}

func TestPunch(t *testing.T) {
	three := []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 6, Phys: 200, Len: 4}, {Virt: 12, Phys: 300, Len: 4}}
	tests := []struct {
		name    string
		before  []Extent
		virt, n uint64
		want    []Extent
		freed   []Extent
	}{
		{
			name:   "inside one extent splits it",
			before: []Extent{{Virt: 10, Phys: 100, Len: 10}},
			virt:   12,
			n:      3,
			want:   []Extent{{Virt: 10, Phys: 100, Len: 2}, {Virt: 15, Phys: 105, Len: 5}},
			freed:  []Extent{{Virt: 12, Phys: 102, Len: 3}},
		},
		{
			name:   "spans several extents",
			before: three,
			virt:   2,
			n:      12,
			want:   []Extent{{Virt: 0, Phys: 100, Len: 2}, {Virt: 14, Phys: 302, Len: 2}},
			freed:  []Extent{{Virt: 2, Phys: 102, Len: 2}, {Virt: 6, Phys: 200, Len: 4}, {Virt: 12, Phys: 300, Len: 2}},
		},
		{
			name:   "exactly one extent",
			before: three,
			virt:   6,
			n:      4,
			want:   []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 12, Phys: 300, Len: 4}},
			freed:  []Extent{{Virt: 6, Phys: 200, Len: 4}},
		},
		{
			name:   "the holes around an extent too",
			before: three,
			virt:   4,
			n:      8,
			want:   []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 12, Phys: 300, Len: 4}},
			freed:  []Extent{{Virt: 6, Phys: 200, Len: 4}},
		},
		{
			name:   "head of an extent",
			before: []Extent{{Virt: 10, Phys: 100, Len: 10}},
			virt:   10,
			n:      3,
			want:   []Extent{{Virt: 13, Phys: 103, Len: 7}},
			freed:  []Extent{{Virt: 10, Phys: 100, Len: 3}},
		},
		{
			name:   "tail of an extent",
			before: []Extent{{Virt: 10, Phys: 100, Len: 10}},
			virt:   17,
			n:      3,
			want:   []Extent{{Virt: 10, Phys: 100, Len: 7}},
			freed:  []Extent{{Virt: 17, Phys: 107, Len: 3}},
		},
		{
			name:   "a hole",
			before: []Extent{{Virt: 10, Phys: 100, Len: 10}},
			virt:   30,
			n:      5,
			want:   []Extent{{Virt: 10, Phys: 100, Len: 10}},
		},
		{
			name:   "zero length",
			before: []Extent{{Virt: 10, Phys: 100, Len: 10}},
			virt:   12,
			n:      0,
			want:   []Extent{{Virt: 10, Phys: 100, Len: 10}},
		},
		{
			name:   "to the end as MaxUint64-virt",
			before: three,
			virt:   7,
			n:      maxU - 7,
			want:   []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 6, Phys: 200, Len: 1}},
			freed:  []Extent{{Virt: 7, Phys: 201, Len: 3}, {Virt: 12, Phys: 300, Len: 4}},
		},
		{
			name:   "to the end as MaxUint64",
			before: three,
			virt:   7,
			n:      maxU,
			want:   []Extent{{Virt: 0, Phys: 100, Len: 4}, {Virt: 6, Phys: 200, Len: 1}},
			freed:  []Extent{{Virt: 7, Phys: 201, Len: 3}, {Virt: 12, Phys: 300, Len: 4}},
		},
		{
			name:   "everything",
			before: three,
			virt:   0,
			n:      maxU,
			freed:  three,
		},
		{
			name:   "at the top of the space",
			before: []Extent{{Virt: maxU - 10, Phys: 0, Len: 10}},
			virt:   maxU - 5,
			n:      5,
			want:   []Extent{{Virt: maxU - 10, Phys: 0, Len: 5}},
			freed:  []Extent{{Virt: maxU - 5, Phys: 5, Len: 5}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mapOf(t, tt.before...)
			freed := m.Punch(tt.virt, tt.n, nil)
			if !slices.Equal(freed, tt.freed) {
				t.Errorf("freed %v, want %v", freed, tt.freed)
			}
			wantMap(t, m, tt.want)
		})
	}
}

func TestLookup(t *testing.T) {
	// 10..15 and 15..20 touch virtually but not physically; 20..25 is a hole.
	exts := []Extent{{Virt: 10, Phys: 100, Len: 5}, {Virt: 15, Phys: 200, Len: 5}, {Virt: 25, Phys: 300, Len: 5}}
	hole := func(v, n uint64) Segment { return Segment{Virt: v, Len: n, Hole: true} }
	// The extents here have tweak offset 0 (a plain disk's): a block's tweak
	// is its virtual block.
	data := func(v, n, p uint64) Segment { return Segment{Virt: v, Len: n, Phys: p, Tweak: v} }
	tests := []struct {
		name    string
		exts    []Extent
		virt, n uint64
		want    []Segment
	}{
		{name: "n is zero", exts: exts, virt: 12, n: 0, want: nil},
		{name: "hole at the start", exts: exts, virt: 5, n: 10, want: []Segment{hole(5, 5), data(10, 5, 100)}},
		{name: "hole in the middle", exts: exts, virt: 18, n: 10, want: []Segment{data(18, 2, 203), hole(20, 5), data(25, 3, 300)}},
		{name: "hole at the end", exts: exts, virt: 27, n: 10, want: []Segment{data(27, 3, 302), hole(30, 7)}},
		{name: "only a hole", exts: exts, virt: 100, n: 5, want: []Segment{hole(100, 5)}},
		{name: "inside one extent", exts: exts, virt: 11, n: 2, want: []Segment{data(11, 2, 101)}},
		{name: "one block", exts: exts, virt: 14, n: 1, want: []Segment{data(14, 1, 104)}},
		{name: "virtually touching extents stay apart", exts: exts, virt: 10, n: 10, want: []Segment{data(10, 5, 100), data(15, 5, 200)}},
		{name: "everything", exts: exts, virt: 0, n: 40, want: []Segment{hole(0, 10), data(10, 5, 100), data(15, 5, 200), hole(20, 5), data(25, 5, 300), hole(30, 10)}},
		{name: "empty map", virt: 3, n: 4, want: []Segment{hole(3, 4)}},
		{name: "up to the top", exts: []Extent{{Virt: maxU - 2, Phys: 7, Len: 2}}, virt: maxU - 4, n: 4, want: []Segment{hole(maxU-4, 2), data(maxU-2, 2, 7)}},
		// Contiguous in both spaces but not in tweaks: two extents, two
		// segments, each with its own tweaks; the tweaks wrap modulo 2^64.
		{name: "tweaks that do not follow on", exts: []Extent{{Virt: 10, Phys: 100, Len: 5, TweakOff: 3}, {Virt: 15, Phys: 105, Len: 5, TweakOff: maxU}},
			virt: 12, n: 6, want: []Segment{{Virt: 12, Len: 3, Phys: 102, Tweak: 15}, {Virt: 15, Len: 3, Phys: 105, Tweak: 14}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mapOf(t, tt.exts...)
			got := m.Lookup(nil, tt.virt, tt.n)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Lookup(%d, %d) = %v, want %v", tt.virt, tt.n, got, tt.want)
			}
			for i := 1; i < len(got); i++ {
				if got[i].Virt != got[i-1].End() {
					t.Errorf("segment %v does not start at the End of %v", got[i], got[i-1])
				}
			}
		})
	}
}

func TestQueries(t *testing.T) {
	// 10..15 and 15..20 touch virtually but not physically; 20..25 is a hole.
	m := mapOf(t, Extent{Virt: 10, Phys: 100, Len: 5}, Extent{Virt: 15, Phys: 200, Len: 5}, Extent{Virt: 25, Phys: 300, Len: 5})
	for _, tt := range []struct {
		virt     uint64
		data     uint64
		dataOK   bool
		hole     uint64
		before   Extent
		beforeOK bool
	}{
		{virt: 0, data: 10, dataOK: true, hole: 0},
		{virt: 10, data: 10, dataOK: true, hole: 20},
		{virt: 11, data: 11, dataOK: true, hole: 20, before: Extent{Virt: 10, Phys: 100, Len: 5}, beforeOK: true},
		{virt: 15, data: 15, dataOK: true, hole: 20, before: Extent{Virt: 10, Phys: 100, Len: 5}, beforeOK: true},
		{virt: 20, data: 25, dataOK: true, hole: 20, before: Extent{Virt: 15, Phys: 200, Len: 5}, beforeOK: true},
		{virt: 29, data: 29, dataOK: true, hole: 30, before: Extent{Virt: 25, Phys: 300, Len: 5}, beforeOK: true},
		{virt: 30, data: 0, dataOK: false, hole: 30, before: Extent{Virt: 25, Phys: 300, Len: 5}, beforeOK: true},
		{virt: maxU, data: 0, dataOK: false, hole: maxU, before: Extent{Virt: 25, Phys: 300, Len: 5}, beforeOK: true},
	} {
		if v, ok := m.NextData(tt.virt); v != tt.data || ok != tt.dataOK {
			t.Errorf("NextData(%d) = %d, %v; want %d, %v", tt.virt, v, ok, tt.data, tt.dataOK)
		}
		if v := m.NextHole(tt.virt); v != tt.hole {
			t.Errorf("NextHole(%d) = %d, want %d", tt.virt, v, tt.hole)
		}
		if e, ok := m.Before(tt.virt); e != tt.before || ok != tt.beforeOK {
			t.Errorf("Before(%d) = %+v, %v; want %+v, %v", tt.virt, e, ok, tt.before, tt.beforeOK)
		}
	}
	if e, ok := m.Last(); !ok || e != (Extent{Virt: 25, Phys: 300, Len: 5}) {
		t.Errorf("Last() = %+v, %v", e, ok)
	}
	var got []Extent
	m.AscendRange(14, 12, func(e Extent) bool { got = append(got, e); return true })
	if want := collect(m); !slices.Equal(got, want) {
		t.Errorf("AscendRange(14, 12) = %v, want %v", got, want)
	}

	// The one unmapped block no map can cover is MaxUint64 itself.
	top := mapOf(t, Extent{Virt: maxU - 3, Phys: 0, Len: 3})
	if v := top.NextHole(maxU - 3); v != maxU {
		t.Errorf("NextHole(MaxUint64-3) = %d, want MaxUint64", v)
	}
	empty := New()
	if _, ok := empty.Last(); ok {
		t.Error("Last() of an empty map is ok")
	}
	if _, ok := empty.NextData(0); ok {
		t.Error("NextData(0) of an empty map is ok")
	}
}

// A 1 GiB sequential write in 1 MiB pieces of 4 KiB blocks, each piece
// allocated right after the previous one, must leave a single extent: the
// property that keeps large I/O large. The pieces are also inserted in
// reverse and in random order, which must end the same way.
func TestSequentialWriteIsOneExtent(t *testing.T) {
	const (
		pieces   = 256 // 1 GiB / 1 MiB
		perPiece = 256 // 1 MiB / 4 KiB
		phys0    = 1 << 20
	)
	orders := map[string][]int{
		"forward": make([]int, pieces),
		"reverse": make([]int, pieces),
		"random":  rand.New(rand.NewPCG(1, 2)).Perm(pieces),
	}
	for i := range pieces {
		orders["forward"][i] = i
		orders["reverse"][i] = pieces - 1 - i
	}
	for name, order := range orders {
		t.Run(name, func(t *testing.T) {
			m := New()
			for _, i := range order {
				v := uint64(i) * perPiece
				if freed := m.Insert(Extent{Virt: v, Phys: phys0 + v, Len: perPiece}, nil); len(freed) != 0 {
					t.Fatalf("piece %d freed %v", i, freed)
				}
			}
			wantMap(t, m, []Extent{{Virt: 0, Phys: phys0, Len: pieces * perPiece}})
		})
	}
}

// Check must catch every kind of broken map. The maps are broken by writing
// to the B-tree directly, as only a bug in this package could.
func TestCheckFindsViolations(t *testing.T) {
	tests := []struct {
		name   string
		exts   []Extent
		blocks uint64 // 0: the true sum
		msg    string
	}{
		{name: "empty extent", exts: []Extent{{Virt: 1, Phys: 1, Len: 0}}, msg: "{Virt:1 Phys:1 Len:0 TweakOff:0} is empty"},
		{name: "overlap", exts: []Extent{{Virt: 0, Phys: 0, Len: 5}, {Virt: 4, Phys: 100, Len: 5}}, msg: "{Virt:0 Phys:0 Len:5 TweakOff:0} and {Virt:4 Phys:100 Len:5 TweakOff:0} overlap"},
		{name: "not merged", exts: []Extent{{Virt: 0, Phys: 0, Len: 5}, {Virt: 5, Phys: 5, Len: 5}}, msg: "not merged"},
		{name: "not merged, one tweak offset", exts: []Extent{{Virt: 0, Phys: 0, Len: 5, TweakOff: 9}, {Virt: 5, Phys: 5, Len: 5, TweakOff: 9}}, msg: "not merged"},
		{name: "virtual overflow", exts: []Extent{{Virt: maxU - 1, Phys: 0, Len: 2}}, msg: "Virt+Len overflows"},
		{name: "physical overflow", exts: []Extent{{Virt: 0, Phys: maxU, Len: 1}}, msg: "Phys+Len overflows"},
		{name: "wrong block count", exts: []Extent{{Virt: 0, Phys: 0, Len: 5}}, blocks: 6, msg: "Blocks() is 6 but the extents hold 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New()
			var sum uint64
			for _, e := range tt.exts {
				m.tree.ReplaceOrInsert(e)
				sum += e.Len
			}
			m.blocks = sum
			if tt.blocks != 0 {
				m.blocks = tt.blocks
			}
			err := m.Check()
			if !errors.Is(err, ErrInvariant) {
				t.Fatalf("Check() = %v, want ErrInvariant", err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Check() = %q, want it to mention %q", err, tt.msg)
			}
		})
	}
}

func TestOverflowPanics(t *testing.T) {
	m := mapOf(t, Extent{Virt: 0, Phys: 0, Len: 1})
	for name, f := range map[string]func(){
		"Insert past the virtual top":  func() { m.Insert(Extent{Virt: maxU - 1, Phys: 0, Len: 2}, nil) },
		"Insert past the physical top": func() { m.Insert(Extent{Virt: 0, Phys: maxU, Len: 1}, nil) },
		"Lookup past the top":          func() { m.Lookup(nil, 1, maxU) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("did not panic")
				}
			}()
			f()
		})
	}
	wantMap(t, m, []Extent{{Virt: 0, Phys: 0, Len: 1}})
}

// bigMap returns a map of n extents of 48 blocks every 64 blocks, each
// physically apart from the others, so none merge and lookups meet holes.
func bigMap(n int) *Map {
	return bigMapDegree(n, degree)
}

func bigMapDegree(n, d int) *Map {
	m := newWithDegree(d)
	for i := range uint64(n) {
		m.Insert(Extent{Virt: i * 64, Phys: i * 100, Len: 48}, nil)
	}
	return m
}

// The read path must not allocate when the caller provides the space.
func TestReadsDoNotAllocate(t *testing.T) {
	m := bigMap(10000)
	dst := make([]Segment, 0, 64)
	freed := make([]Extent, 0, 64)
	rng := rand.New(rand.NewPCG(3, 4))
	for name, f := range map[string]func(){
		"Lookup": func() { dst = m.Lookup(dst[:0], rng.Uint64N(700000), 1+rng.Uint64N(256)) },
		"NextData": func() {
			if _, ok := m.NextData(rng.Uint64N(9999 * 64)); !ok {
				panic("no data")
			}
		},
		"NextHole": func() { m.NextHole(rng.Uint64N(700000)) },
		"Before":   func() { m.Before(rng.Uint64N(700000)) },
		// A punch and insert of the same blocks, with room for freed,
		// leaves the map as it was and needs no new B-tree node.
		"Punch+Insert": func() {
			i := rng.Uint64N(10000)
			freed = m.Punch(i*64+8, 8, freed[:0])
			m.Insert(Extent{Virt: i*64 + 8, Phys: i*100 + 8, Len: 8}, freed[len(freed):])
		},
	} {
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", name, n)
		}
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
}

// The concurrency contract of the package doc: after Clone returns, the clone
// and the original may each be used by its own goroutine. Run with -race.
func TestCloneConcurrentUse(t *testing.T) {
	const n = 2000
	rounds := 5
	if testing.Short() {
		rounds = 1
	}
	mutate := func(m *Map, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, seed))
		for range 2000 {
			v := rng.Uint64N(n * 64)
			if rng.IntN(2) == 0 {
				m.Insert(Extent{Virt: v, Phys: rng.Uint64N(1 << 30), Len: 1 + rng.Uint64N(100)}, nil)
			} else {
				m.Punch(v, 1+rng.Uint64N(100), nil)
			}
		}
	}
	readAll := func(m *Map) {
		var dst []Segment
		for v := uint64(0); v < n*64; v += 500 {
			dst = m.Lookup(dst[:0], v, 500)
		}
	}
	for round := range rounds {
		for _, mode := range []string{"read clone, write original", "write clone, read original", "write both"} {
			t.Run(fmt.Sprintf("%s/%d", mode, round), func(t *testing.T) {
				orig := bigMap(n)
				want := collect(orig)
				clone := orig.Clone()
				var wg sync.WaitGroup
				switch mode {
				case "read clone, write original":
					// Two readers: reads may also run concurrently with each other.
					wg.Go(func() { readAll(clone) })
					wg.Go(func() { readAll(clone) })
					mutate(orig, uint64(round))
					wg.Wait()
					wantMap(t, clone, want)
				case "write clone, read original":
					wg.Go(func() { mutate(clone, uint64(round)) })
					readAll(orig)
					wg.Wait()
					wantMap(t, orig, want)
				case "write both":
					wg.Go(func() { mutate(clone, uint64(round)) })
					mutate(orig, uint64(round)+100)
					wg.Wait()
				}
				for _, m := range []*Map{orig, clone} {
					if err := m.Check(); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// Append builds the same map as Insert for extents in order, merges
// contiguous neighbours, and refuses anything out of order.
func TestAppend(t *testing.T) {
	m, ref := New(), New()
	// The last two continue {10, 100, 5} in both spaces but with another
	// tweak offset: they merge with each other only.
	exts := []Extent{{0, 10, 2, 0}, {2, 12, 3, 0}, {9, 50, 1, 0}, {10, 100, 5, 0}, {15, 105, 1, 7}, {16, 106, 2, 7}}
	for _, e := range exts {
		if err := m.Append(e); err != nil {
			t.Fatal(err)
		}
		ref.Insert(e, nil)
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	var got, want []Extent
	m.Ascend(func(e Extent) bool { got = append(got, e); return true })
	ref.Ascend(func(e Extent) bool { want = append(want, e); return true })
	if fmt.Sprint(got) != fmt.Sprint(want) || m.Blocks() != ref.Blocks() || len(got) != 4 {
		t.Fatalf("Append built %v (%d blocks), Insert %v (%d blocks)", got, m.Blocks(), want, ref.Blocks())
	}
	for _, bad := range []Extent{{17, 0, 1, 0}, {0, 0, 0, 0}, {20, math.MaxUint64, 2, 0}} {
		if err := m.Append(bad); !errors.Is(err, ErrInvariant) {
			t.Errorf("Append(%+v): %v, want ErrInvariant", bad, err)
		}
	}
	if n := m.Len(); n != 4 {
		t.Fatalf("refused appends changed the map: %d extents", n)
	}
}
