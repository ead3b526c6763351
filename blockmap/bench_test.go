package blockmap

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// The benchmarks use maps of a million extents: a 4 TiB disk written in
// random 4 MiB pieces, or a heavily fragmented smaller one.
const benchExtents = 1 << 20

// benchLookup runs random lookups of n blocks over a map built by bigMap.
func benchLookup(b *testing.B, m *Map, n uint64) {
	rng := rand.New(rand.NewPCG(1, 1))
	// Precomputed offsets keep the random generator out of the measurement.
	offs := make([]uint64, 4096)
	for i := range offs {
		offs[i] = rng.Uint64N(uint64(m.Len()) * 64)
	}
	dst := make([]Segment, 0, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		dst = m.Lookup(dst[:0], offs[i%len(offs)], n)
		i++
	}
}

func BenchmarkLookup(b *testing.B) {
	m := bigMap(benchExtents)
	b.Run("1block", func(b *testing.B) { benchLookup(b, m, 1) })
	b.Run("256blocks", func(b *testing.B) { benchLookup(b, m, 256) })
}

func BenchmarkInsert(b *testing.B) {
	// A sequential write: each piece continues the previous one in both
	// spaces, so the map stays one extent and every Insert merges.
	b.Run("sequential", func(b *testing.B) {
		m := New()
		freed := make([]Extent, 0, 16)
		b.ReportAllocs()
		var v uint64
		for b.Loop() {
			freed = m.Insert(Extent{Virt: v, Phys: 1000 + v, Len: 256}, freed[:0])
			v += 256
		}
	})
	// Sequential virtually but physically scattered: the map grows by one
	// extent per Insert, at its right edge.
	b.Run("sequential-fragmented", func(b *testing.B) {
		m := New()
		freed := make([]Extent, 0, 16)
		b.ReportAllocs()
		var v uint64
		for b.Loop() {
			freed = m.Insert(Extent{Virt: v, Phys: 2 * v, Len: 256}, freed[:0])
			v += 256
		}
	})
	// Random overwrites of 1 to 256 blocks in a map of a million extents:
	// they split, replace and free extents, and the map size stays steady.
	b.Run("random", func(b *testing.B) {
		m := bigMap(benchExtents)
		rng := rand.New(rand.NewPCG(2, 2))
		freed := make([]Extent, 0, 16)
		b.ReportAllocs()
		for b.Loop() {
			e := Extent{Virt: rng.Uint64N(benchExtents * 64), Phys: rng.Uint64N(1 << 40), Len: 1 + rng.Uint64N(256)}
			freed = m.Insert(e, freed[:0])
		}
	})
}

// heapPerExtent builds a map of n extents that never merge, in sequential or
// random Virt order, and returns the heap it takes divided by n.
func heapPerExtent(n int, d int, random bool) float64 {
	order := make([]uint64, n)
	for i := range order {
		order[i] = uint64(i)
	}
	if random {
		rng := rand.New(rand.NewPCG(3, 3))
		rng.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := newWithDegree(d)
	for _, i := range order {
		// Virtually contiguous, physically not: one extent each.
		m.Insert(Extent{Virt: i, Phys: 2 * i, Len: 1}, nil)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if m.Len() != n {
		panic(fmt.Sprintf("built %d extents, want %d", m.Len(), n))
	}
	runtime.KeepAlive(m)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// BenchmarkMemoryPerExtent reports the heap a map of a million extents takes
// per extent (the project's target is at most 64 B). The time per op is that
// of building the map and means little.
func BenchmarkMemoryPerExtent(b *testing.B) {
	for _, order := range []string{"sequential", "random"} {
		b.Run(order, func(b *testing.B) {
			var perExtent float64
			for b.Loop() {
				perExtent = heapPerExtent(benchExtents, degree, order == "random")
			}
			b.ReportMetric(perExtent, "B/extent")
		})
	}
}

// BenchmarkDegree is how the B-tree degree was chosen: lookup and insert
// speed and memory per extent for a few degrees. Run it with
// -bench=Degree -benchtime=... as needed; see degree in blockmap.go.
func BenchmarkDegree(b *testing.B) {
	for _, d := range []int{8, 16, 32, 64, 128} {
		b.Run(fmt.Sprintf("d=%d/lookup256", d), func(b *testing.B) {
			benchLookup(b, bigMapDegree(benchExtents, d), 256)
		})
		// Inserts between checkpoints: every cloneEvery inserts the map is
		// cloned (and the clone dropped, as a checkpoint writer would once
		// done), so the first write to each node afterwards copies it.
		for _, cloneEvery := range []int{0, 1000} {
			b.Run(fmt.Sprintf("d=%d/insert-random-clone%d", d, cloneEvery), func(b *testing.B) {
				m := bigMapDegree(benchExtents, d)
				rng := rand.New(rand.NewPCG(2, 2))
				freed := make([]Extent, 0, 16)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if i++; cloneEvery > 0 && i%cloneEvery == 0 {
						m.Clone()
					}
					e := Extent{Virt: rng.Uint64N(benchExtents * 64), Phys: rng.Uint64N(1 << 40), Len: 1 + rng.Uint64N(256)}
					freed = m.Insert(e, freed[:0])
				}
			})
		}
		for _, order := range []string{"sequential", "random"} {
			b.Run(fmt.Sprintf("d=%d/memory-%s", d, order), func(b *testing.B) {
				var perExtent float64
				for b.Loop() {
					perExtent = heapPerExtent(benchExtents, d, order == "random")
				}
				b.ReportMetric(perExtent, "B/extent")
			})
		}
	}
}
