package coalesce

import (
	"fmt"
	"sync"
	"testing"

	"github.com/vdiskfs/vdiskfs/internal/hugepage"
)

const testMax = 1 << 20 // the pool size used by these tests: FUSE's MaxWrite

func TestPoolGet(t *testing.T) {
	p := NewPool(testMax)
	for _, n := range []int{0, 1, 511, 4095, 4096, 4097, 8192, 12288, 100_000, testMax - 1, testMax, testMax + 1, 3 * testMax} {
		b := p.Get(n)
		if len(b) != n {
			t.Errorf("Get(%d): len %d", n, len(b))
		}
		if !IsAligned(b) {
			t.Errorf("Get(%d): not aligned", n)
		}
		if c := cap(b); c < int(RoundUp(uint64(n), 4096)) || c%4096 != 0 || c == 0 {
			t.Errorf("Get(%d): cap %d, want a non-zero multiple of 4096 holding n", n, c)
		}
		if n <= testMax && cap(b) != classSizeFor(n) {
			t.Errorf("Get(%d): cap %d, want the class size %d", n, cap(b), classSizeFor(n))
		}
		// The whole capacity is usable memory.
		full := b[:cap(b)]
		full[0], full[len(full)-1] = 1, 2
		p.Put(b)
	}
}

// classSizeFor is the expected class: the smallest power of two >= n, at least 4 KiB.
func classSizeFor(n int) int {
	size := 4096
	for size < n {
		size *= 2
	}
	return size
}

func TestPoolReuse(t *testing.T) {
	p := NewPool(testMax)
	for _, n := range []int{4096, 5000, 65536, testMax} {
		b := p.Get(n)
		p.Put(b)
		b = p.Get(n)
		if len(b) != n || !IsAligned(b) || cap(b) != classSizeFor(n) {
			t.Errorf("Get(%d) after Put: len %d cap %d aligned %v", n, len(b), cap(b), IsAligned(b))
		}
		// A buffer put back under one length serves another length of the same class.
		p.Put(b[:1])
		b = p.Get(classSizeFor(n))
		if !IsAligned(b) || len(b) != classSizeFor(n) {
			t.Errorf("Get(%d) after Put of a short slice: len %d aligned %v", classSizeFor(n), len(b), IsAligned(b))
		}
	}
}

func TestPoolSizes(t *testing.T) {
	tests := []struct{ maxSize, largest int }{
		{0, 4096},
		{-1, 4096},
		{4096, 4096},
		{4097, 8192},
		{1 << 20, 1 << 20},
		{1<<20 + 1, 2 << 20},
		{1 << 62, 1 << 30}, // capped
	}
	for _, tt := range tests {
		p := NewPool(tt.maxSize)
		if got := p.classes[len(p.classes)-1].size; got != tt.largest {
			t.Errorf("NewPool(%d): largest class %d, want %d", tt.maxSize, got, tt.largest)
		}
		for i := range p.classes {
			if p.classes[i].size != 4096<<i {
				t.Errorf("NewPool(%d): class %d has size %d", tt.maxSize, i, p.classes[i].size)
			}
		}
	}
}

// TestPoolPutForeign checks that Put drops what it cannot hand out again
// safely: buffers above the largest class, odd capacities, unaligned memory.
func TestPoolPutForeign(t *testing.T) {
	p := NewPool(64 << 10)
	p.Put(nil)
	p.Put(make([]byte, 0))
	p.Put(p.Get(1 << 20))         // above the largest class
	p.Put(make([]byte, 12288))    // not a class size
	unaligned := p.Get(16384)[1:] // cap 16383
	p.Put(unaligned)
	misaligned := p.Get(16384)[4096-512 : 4096-512+8192 : 4096-512+8192] // class-sized cap, misaligned
	if IsAligned(misaligned) {
		t.Fatal("test setup: slice should be misaligned")
	}
	p.Put(misaligned)
	for range 10 {
		for _, n := range []int{4096, 8192, 16384, 64 << 10} {
			if b := p.Get(n); !IsAligned(b) || len(b) != n || cap(b) != n {
				t.Fatalf("Get(%d): len %d cap %d aligned %v", n, len(b), cap(b), IsAligned(b))
			}
		}
	}
}

func TestPoolGetNegativePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Get(-1) did not panic")
		}
	}()
	NewPool(testMax).Get(-1)
}

func TestIsAligned(t *testing.T) {
	b := NewPool(8192).Get(8192)
	if !IsAligned(b) || !IsAligned(b[4096:]) || !IsAligned(b[:0]) {
		t.Error("aligned slices reported unaligned")
	}
	if IsAligned(b[1:]) || IsAligned(b[512:]) {
		t.Error("unaligned slices reported aligned")
	}
	if IsAligned(nil) {
		t.Error("nil reported aligned")
	}
}

// TestPoolConcurrent hands buffers around between goroutines under -race.
// Each goroutine stamps its buffer and checks the stamp before Put: a
// buffer handed out twice at once would show another goroutine's stamp.
func TestPoolConcurrent(t *testing.T) {
	p := NewPool(64 << 10)
	sizes := []int{1, 4096, 5000, 8192, 30000, 64 << 10, 100_000}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				n := sizes[(g+i)%len(sizes)]
				b := p.Get(n)
				if len(b) != n || !IsAligned(b) {
					errs <- fmt.Errorf("Get(%d): len %d aligned %v", n, len(b), IsAligned(b))
					return
				}
				stamp := byte(g*31 + i)
				for j := 0; j < len(b); j += 512 {
					b[j] = stamp
				}
				for j := 0; j < len(b); j += 512 {
					if b[j] != stamp {
						errs <- fmt.Errorf("goroutine %d: buffer changed under it at byte %d", g, j)
						return
					}
				}
				p.Put(b)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestPoolNoAllocs checks the promise of the hot path: once warm, a Get/Put
// pair allocates nothing, for every size class. Under -race sync.Pool drops
// Puts at random on purpose, so the count means nothing there.
func TestPoolNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	p := NewPool(testMax)
	for size := 4096; size <= testMax; size *= 2 {
		for _, n := range []int{size, size/2 + 1} {
			p.Put(p.Get(n)) // warm the class
			allocs := testing.AllocsPerRun(100, func() { p.Put(p.Get(n)) })
			if allocs != 0 {
				t.Errorf("Get(%d)/Put: %v allocations per pair, want 0", n, allocs)
			}
		}
	}
}

func BenchmarkPoolGetPut(b *testing.B) {
	p := NewPool(testMax)
	b.Run("1MiB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p.Put(p.Get(1 << 20))
		}
	})
	b.Run("1MiB-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p.Put(p.Get(1 << 20))
			}
		})
	})
}

// TestPoolSlabHugePages checks that large classes come from huge-page
// slabs: /proc/self/smaps says a touched 1 MiB buffer's mapping has huge
// pages behind it, so the device sees it as one segment, not 256.
func TestPoolSlabHugePages(t *testing.T) {
	if !hugepage.Available() {
		t.Skip("no transparent huge pages on this kernel")
	}
	p := NewPool(testMax)
	defer closePool(t, p)
	b := p.Get(testMax)
	defer p.Put(b)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	m, err := hugepage.Lookup(b)
	if err != nil {
		t.Fatal(err)
	}
	if !m.THPEligible || m.AnonHugePages == 0 {
		t.Errorf("1 MiB pool buffer at %p: %+v, want THP-eligible with huge pages", &b[0], m)
	}
}

// TestPoolSlabLimit checks the bound on slab memory: past the limit Get
// still serves (from the heap), Put keeps only slab buffers, the pool maps
// no more than the limit, and every buffer handed out at once is distinct.
func TestPoolSlabLimit(t *testing.T) {
	p := NewPool(4 << 20)
	p.slabs.limit = 2 * hugepage.Size
	defer closePool(t, p)
	var held [][]byte
	for _, n := range []int{1 << 20, 1 << 20, 1 << 20, 64 << 10, 4 << 20, 1 << 20, 1 << 20} {
		b := p.Get(n)
		if len(b) != n || !IsAligned(b) || cap(b) != classSizeFor(n) {
			t.Fatalf("Get(%d): len %d cap %d aligned %v", n, len(b), cap(b), IsAligned(b))
		}
		for i := range b {
			b[i] = byte(len(held))
		}
		held = append(held, b)
	}
	for i, b := range held {
		for j := 0; j < len(b); j += 4096 {
			if b[j] != byte(i) {
				t.Fatalf("buffer %d: byte %d is %d: handed out twice", i, j, b[j])
			}
		}
	}
	p.slabs.mu.Lock()
	mapped, out := p.slabs.mu.mapped, p.slabs.mu.out
	p.slabs.mu.Unlock()
	if mapped > p.slabs.limit || out == 0 || out == len(held) {
		t.Errorf("mapped %d (limit %d), %d of %d buffers from slabs; want within the limit, some from slabs and some not", mapped, p.slabs.limit, out, len(held))
	}
	for _, b := range held {
		p.Put(b)
	}
	p.slabs.mu.Lock()
	out = p.slabs.mu.out
	p.slabs.mu.Unlock()
	if out != 0 {
		t.Errorf("%d slab buffers out after every Put", out)
	}
}

// TestPoolClose checks that Close unmaps nothing while a slab buffer is
// out, and unmaps everything once it is back; Get still serves afterwards.
func TestPoolClose(t *testing.T) {
	p := NewPool(testMax)
	b := p.Get(testMax)
	if err := p.Close(); err == nil {
		t.Error("Close with a buffer out succeeded")
	}
	b[0], b[len(b)-1] = 1, 2 // still mapped
	p.Put(b)
	closePool(t, p)
	p.slabs.mu.Lock()
	mapped := p.slabs.mu.mapped
	p.slabs.mu.Unlock()
	if mapped != 0 {
		t.Errorf("%d bytes mapped after Close", mapped)
	}
	b = p.Get(testMax)
	if len(b) != testMax || !IsAligned(b) {
		t.Errorf("Get after Close: len %d aligned %v", len(b), IsAligned(b))
	}
	b[0], b[len(b)-1] = 1, 2
	p.Put(b)
}

func closePool(t *testing.T, p *Pool) {
	t.Helper()
	if err := p.Close(); err != nil {
		t.Error(err)
	}
}
