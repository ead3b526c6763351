package backend

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ncw/directio"
)

// The hand-written tests below draw images as one letter per 512-byte sector:
// "dcaa" is sector 0 full of 'd', sector 1 of 'c', and so on; '0' stands for
// zeros and '?' for a sector that mixes several values.

func image(sectors string) []byte {
	var b []byte
	for _, s := range []byte(sectors) {
		if s == '0' {
			s = 0
		}
		b = append(b, bytes.Repeat([]byte{s}, 512)...)
	}
	return b
}

func draw(img []byte) string {
	var sb strings.Builder
	for s := range slices.Chunk(img, 512) {
		switch {
		case bytes.Count(s, s[:1]) != len(s):
			sb.WriteByte('?')
		case s[0] == 0:
			sb.WriteByte('0')
		default:
			sb.WriteByte(s[0])
		}
	}
	return sb.String()
}

// writeSector writes sector i full of letter.
func writeSector(t *testing.T, c *Crash, i int, letter byte) {
	t.Helper()
	mustWrite(t, c, image(string(letter)), int64(i*512))
}

func mustFlush(t *testing.T, b Backend) {
	t.Helper()
	if err := b.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// handLog builds the log the hand-computed tests use:
//
//	op 1: write sector 0 'b'
//	op 2: flush
//	op 3: write sector 1 'c'
//	op 4: write sector 0 'd'
//	op 5: flush
//	op 6: write sector 2 'e'
//	op 7: discard sector 3
func handLog(t *testing.T) *Crash {
	c := NewCrashFrom(image("aaaa"))
	writeSector(t, c, 0, 'b')
	mustFlush(t, c)
	writeSector(t, c, 1, 'c')
	writeSector(t, c, 0, 'd')
	mustFlush(t, c)
	writeSector(t, c, 2, 'e')
	if err := c.Discard(3*512, 512); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCrashDropUnflushedByHand(t *testing.T) {
	c := handLog(t)
	if c.OpCount() != 7 || c.FlushCount() != 2 || !slices.Equal(c.FlushOps(), []int{2, 5}) {
		t.Fatalf("OpCount %d, FlushCount %d, FlushOps %v; want 7, 2, [2 5]", c.OpCount(), c.FlushCount(), c.FlushOps())
	}
	if got := draw(c.Bytes()); got != "dce0" {
		t.Errorf("live image %s, want dce0", got)
	}
	want := []string{"aaaa", "aaaa", "baaa", "baaa", "baaa", "dcaa", "dcaa", "dcaa"}
	// Ask in an order that moves the cache backwards as well as forwards.
	for _, op := range []int{7, 0, 1, 2, 3, 4, 5, 6, 7, 3, 6, 2} {
		if got := draw(c.StateAt(op, nil, DropUnflushed)); got != want[op] {
			t.Errorf("StateAt(%d, DropUnflushed) = %s, want %s", op, got, want[op])
		}
	}
}

// statesOver returns the set of states StateAt(op, ·, mode) produced over
// many seeds, drawn.
func statesOver(c *Crash, op int, mode CrashMode, seeds int) []string {
	seen := map[string]bool{}
	for seed := range uint64(seeds) {
		seen[draw(c.StateAt(op, rand.New(rand.NewPCG(seed, 1)), mode))] = true
	}
	states := make([]string, 0, len(seen))
	for s := range seen {
		states = append(states, s)
	}
	sort.Strings(states)
	return states
}

func TestCrashRandomSubsetByHand(t *testing.T) {
	c := handLog(t)
	for _, tc := range []struct {
		op   int
		want []string
	}{
		{0, []string{"aaaa"}},
		{1, []string{"aaaa", "baaa"}},
		{2, []string{"baaa"}},
		{3, []string{"baaa", "bcaa"}},
		{4, []string{"baaa", "bcaa", "daaa", "dcaa"}},
		{5, []string{"dcaa"}},
		{7, []string{"dca0", "dcaa", "dce0", "dcea"}},
	} {
		// Single-sector writes cannot tear: Torn gives the same states.
		for _, mode := range []CrashMode{RandomSubset, Torn} {
			if got := statesOver(c, tc.op, mode, 200); !slices.Equal(got, tc.want) {
				t.Errorf("StateAt(%d, %v) gives %v, want %v", tc.op, mode, got, tc.want)
			}
		}
	}
}

func TestCrashLaterWriteWinsWhenBothKept(t *testing.T) {
	// Two unflushed writes to one sector: the sector holds the old value or
	// either write, and both kept means the later one.
	c := NewCrashFrom(image("a"))
	mustFlush(t, c)
	writeSector(t, c, 0, 'x')
	writeSector(t, c, 0, 'y')
	if got, want := statesOver(c, 3, RandomSubset, 200), []string{"a", "x", "y"}; !slices.Equal(got, want) {
		t.Errorf("states %v, want %v", got, want)
	}
}

func TestCrashDurableWriteSurvivesEveryCut(t *testing.T) {
	// An unflushed write x, a durable (FUA) write d over another sector,
	// then an unflushed write y over d's sector: after d, every state holds
	// d or y in its sector, never the old byte; x may or may not be there.
	c := NewCrashFrom(image("aa"))
	mustFlush(t, c)
	writeSector(t, c, 0, 'x')
	if _, err := c.WriteAtDurable(image("d"), 512); err != nil {
		t.Fatal(err)
	}
	if got, want := draw(c.StateAt(3, nil, DropUnflushed)), "ad"; got != want {
		t.Errorf("DropUnflushed right after the durable write: %s, want %s", got, want)
	}
	for _, mode := range []CrashMode{RandomSubset, Torn} {
		if got, want := statesOver(c, 3, mode, 200), []string{"ad", "xd"}; !slices.Equal(got, want) {
			t.Errorf("%v right after the durable write gives %v, want %v", mode, got, want)
		}
	}
	writeSector(t, c, 1, 'y')
	if got, want := statesOver(c, 4, RandomSubset, 200), []string{"ad", "ay", "xd", "xy"}; !slices.Equal(got, want) {
		t.Errorf("a later write over it gives %v, want %v", got, want)
	}
	if got := statesOver(c, 2, RandomSubset, 200); !slices.Equal(got, []string{"aa", "xa"}) {
		t.Errorf("before the durable write: %v, want [aa xa]", got)
	}
}

func TestCrashTornWrites(t *testing.T) {
	c := NewCrashFrom(image("oooo"))
	mustFlush(t, c)
	mustWrite(t, c, image("nnnn"), 0)

	if got, want := statesOver(c, 2, RandomSubset, 100), []string{"nnnn", "oooo"}; !slices.Equal(got, want) {
		t.Errorf("RandomSubset gives %v, want %v", got, want)
	}
	// Torn: every one of the 16 sector-granular mixes, and nothing else (a
	// '?' would be a sector mixing old and new bytes).
	var want []string
	for mask := range 16 {
		s := []byte("oooo")
		for i := range 4 {
			if mask&(1<<i) != 0 {
				s[i] = 'n'
			}
		}
		want = append(want, string(s))
	}
	sort.Strings(want)
	if got := statesOver(c, 2, Torn, 600); !slices.Equal(got, want) {
		t.Errorf("Torn gives %v, want the 16 mixes %v", got, want)
	}
}

func TestCrashTornUnalignedWrite(t *testing.T) {
	// Without alignment checks a write may straddle sectors; it tears at
	// sector boundaries: [256, 512) and [512, 768) independently.
	c := NewCrashFrom(image("oo"))
	mustWrite(t, c, bytes.Repeat([]byte{'n'}, 512), 256)
	seen := map[[2]bool]bool{}
	for seed := range uint64(200) {
		img := c.StateAt(1, rand.New(rand.NewPCG(seed, 2)), Torn)
		first, second := img[256:512], img[512:768]
		for _, piece := range [][]byte{first, second} {
			if bytes.Count(piece, piece[:1]) != len(piece) {
				t.Fatalf("seed %d: a piece mixes old and new bytes", seed)
			}
		}
		if bytes.Count(img[:256], []byte{'o'}) != 256 || bytes.Count(img[768:], []byte{'o'}) != 256 {
			t.Fatalf("seed %d: bytes outside the write changed", seed)
		}
		seen[[2]bool{first[0] == 'n', second[0] == 'n'}] = true
	}
	if len(seen) != 4 {
		t.Errorf("saw %d of the 4 ways to tear the write: %v", len(seen), seen)
	}
}

func TestCrashTearsAtCheckedSectorSize(t *testing.T) {
	c := NewCrash(8192)
	c.CheckAlignment(4096)
	mustWrite(t, c, aligned(8192, 1), 0)
	for seed := range uint64(100) {
		img := c.StateAt(1, rand.New(rand.NewPCG(seed, 3)), Torn)
		want := aligned(8192, 1)
		for i := 0; i < 8192; i += 4096 {
			got := img[i : i+4096]
			if !bytes.Equal(got, make([]byte, 4096)) && !bytes.Equal(got, want[i:i+4096]) {
				t.Fatalf("seed %d: 4 KiB sector at %d is torn", seed, i)
			}
		}
	}
	_, err := c.WriteAt(aligned(512, 1), 0)
	wantErrIs(t, "512-byte write with 4 KiB sectors", err, ErrUnaligned)
}

func TestCrashFailedFlushMakesNothingDurable(t *testing.T) {
	c := NewCrash(2048)
	c.SetFault(FailNth(OpFlush, 1, syscall.EIO))
	writeSector(t, c, 0, 'x')
	err := c.Flush()
	wantErrIs(t, "the failing Flush", err, syscall.EIO)
	if c.FlushCount() != 0 || c.OpCount() != 1 {
		t.Fatalf("after a failed flush: FlushCount %d, OpCount %d; want 0, 1", c.FlushCount(), c.OpCount())
	}
	if got := draw(c.StateAt(c.OpCount(), nil, DropUnflushed)); got != "0000" {
		t.Errorf("durable image %s after a failed flush, want 0000", got)
	}
	if got := draw(c.Bytes()); got != "x000" {
		t.Errorf("live image %s, want x000", got)
	}

	mustFlush(t, c) // the second flush is not failed
	if got := draw(c.StateAt(c.OpCount(), nil, DropUnflushed)); got != "x000" {
		t.Errorf("durable image %s after a good flush, want x000", got)
	}
}

func TestCrashFailNthOnce(t *testing.T) {
	c := NewCrash(4 * 512)
	var seen []Op
	fail := FailNth(OpWrite, 2, syscall.ENOSPC)
	c.SetFault(func(op Op) error {
		seen = append(seen, op)
		c.OpCount() // the fault function may call back into c
		return fail(op)
	})

	var errs []error
	for i := range 4 {
		_, err := c.WriteAt(image(string(rune('a'+i))), int64(i*512))
		errs = append(errs, err)
	}
	for i, err := range errs {
		if i == 1 {
			wantErrIs(t, "second write", err, syscall.ENOSPC)
			if !strings.Contains(err.Error(), "write 512 bytes at 512") {
				t.Errorf("error %q does not say what failed", err)
			}
		} else if err != nil {
			t.Errorf("write %d: %v", i+1, err)
		}
	}
	if got := draw(c.Bytes()); got != "a0cd" {
		t.Errorf("live image %s, want a0cd: the failed write must not be applied", got)
	}
	if c.OpCount() != 3 {
		t.Errorf("OpCount %d, want 3: the failed write must not be recorded", c.OpCount())
	}
	for i, op := range seen {
		want := Op{Kind: OpWrite, Off: int64(i * 512), Len: 512, N: i + 1}
		if op != want {
			t.Errorf("fault function saw %+v, want %+v", op, want)
		}
	}

	// Every kind counts its own calls.
	c.SetFault(FailNth(OpRead, 1, syscall.EIO))
	_, err := c.ReadAt(make([]byte, 512), 0)
	wantErrIs(t, "first read", err, syscall.EIO)
	if _, err := c.ReadAt(make([]byte, 512), 0); err != nil {
		t.Errorf("second read: %v", err)
	}
	c.SetFault(FailNth(OpDiscard, 1, ErrUnsupported))
	wantErrIs(t, "first discard", c.Discard(0, 512), ErrUnsupported)
	c.SetFault(FailNth(OpWriteZeroes, 1, syscall.EIO))
	wantErrIs(t, "first write zeroes", c.WriteZeroes(0, 512), syscall.EIO)
	c.SetFault(nil)
	if err := c.WriteZeroes(0, 512); err != nil {
		t.Errorf("write zeroes after SetFault(nil): %v", err)
	}
	if s := c.Stats(); s.Writes != 3 || s.Reads != 1 || s.Discards != 0 || s.WriteZeroes != 1 {
		t.Errorf("Stats() = %+v; failed calls must not count", s)
	}
}

// TestCrashAgainstModel runs random writes, discards and flushes, keeping a
// plain model: the image at every flush and what each op wrote. Every op
// index, asked in random order (so the cache of durable images moves both
// ways and uses its snapshots), must give the model's durable image for
// DropUnflushed, and for the other modes only sectors that are durable or
// written after the last flush.
func TestCrashAgainstModel(t *testing.T) {
	const size, sector = 64 << 10, 512
	rng := rand.New(rand.NewPCG(42, 42))
	c := NewCrash(size)
	c.CheckAlignment(sector)

	model := make([]byte, size)
	durable := [][]byte{nil} // durable[op]: the durable image after op
	durable[0] = slices.Clone(model)
	type write struct{ off, n int64 }
	writes := []write{{}} // writes[op]: the range op wrote (n == 0 for a flush)
	lastFlush := []int{0} // lastFlush[op]: the last flush at or before op
	var images [][]byte   // images[op]: the live image after op
	images = append(images, slices.Clone(model))

	for range 500 {
		off := int64(rng.IntN(size/sector)) * sector
		n := min(int64(1+rng.IntN(32))*sector, size-off)
		switch r := rng.IntN(20); {
		case r < 2:
			mustFlush(t, c)
			writes = append(writes, write{})
		case r < 4:
			if err := c.Discard(off, n); err != nil {
				t.Fatal(err)
			}
			clear(model[off : off+n])
			writes = append(writes, write{off, n})
		default:
			p := directio.AlignedBlock(int(n))
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			mustWrite(t, c, p, off)
			copy(model[off:], p)
			writes = append(writes, write{off, n})
		}
		op := len(writes) - 1
		images = append(images, slices.Clone(model))
		if writes[op].n == 0 {
			durable = append(durable, slices.Clone(model))
			lastFlush = append(lastFlush, op)
		} else {
			durable = append(durable, durable[op-1])
			lastFlush = append(lastFlush, lastFlush[op-1])
		}
	}
	if c.OpCount() != len(writes)-1 {
		t.Fatalf("OpCount %d, want %d", c.OpCount(), len(writes)-1)
	}
	if !bytes.Equal(c.Bytes(), model) {
		t.Fatal("live image differs from the model")
	}

	ops := rng.Perm(c.OpCount() + 1)
	dst := make([]byte, size)
	for _, op := range ops {
		c.StateAtInto(dst, op, nil, DropUnflushed)
		if !bytes.Equal(dst, durable[op]) {
			t.Fatalf("StateAt(%d, DropUnflushed) differs from the model", op)
		}
		for _, mode := range []CrashMode{RandomSubset, Torn} {
			c.StateAtInto(dst, op, rng, mode)
			for s := int64(0); s < size; s += sector {
				got := dst[s : s+sector]
				ok := bytes.Equal(got, durable[op][s:s+sector])
				for w := lastFlush[op] + 1; w <= op && !ok; w++ {
					if writes[w].off <= s && s < writes[w].off+writes[w].n {
						ok = bytes.Equal(got, images[w][s:s+sector])
					}
				}
				if !ok {
					t.Fatalf("StateAt(%d, %v): sector at %d holds data that is neither durable nor written after op %d",
						op, mode, s, lastFlush[op])
				}
			}
		}
	}
	if n := len(c.mu.history.snapshots); n < 2 {
		t.Errorf("%d snapshots: the test did not exercise them", n)
	}
}

func TestCrashMemAtAndCrashAt(t *testing.T) {
	c := handLog(t)
	for op := range c.OpCount() + 1 {
		for _, mode := range []CrashMode{DropUnflushed, RandomSubset, Torn} {
			want := c.StateAt(op, rand.New(rand.NewPCG(uint64(op), 9)), mode)
			m := c.MemAt(op, rand.New(rand.NewPCG(uint64(op), 9)), mode)
			if !bytes.Equal(m.Bytes(), want) {
				t.Errorf("MemAt(%d, %v) differs from StateAt with the same seed", op, mode)
			}
			cc := c.CrashAt(op, rand.New(rand.NewPCG(uint64(op), 9)), mode)
			if !bytes.Equal(cc.Bytes(), want) || !bytes.Equal(cc.StateAt(0, nil, DropUnflushed), want) {
				t.Errorf("CrashAt(%d, %v) differs from StateAt with the same seed", op, mode)
			}
		}
	}

	// The Mem and the Crash share pages with c but writes stay apart.
	m := c.MemAt(5, nil, DropUnflushed)
	writeSector(t, c, 1, 'p')
	mustWrite(t, m, image("m"), 512)
	cc := c.CrashAt(5, nil, DropUnflushed)
	mustWrite(t, cc, image("q"), 512)
	mustFlush(t, cc)
	if got := draw(m.Bytes()); got != "dmaa" {
		t.Errorf("Mem after its own write: %s, want dmaa", got)
	}
	if got := draw(c.Bytes()); got != "dpe0" {
		t.Errorf("parent live image: %s, want dpe0", got)
	}
	if got := draw(c.StateAt(5, nil, DropUnflushed)); got != "dcaa" {
		t.Errorf("parent state at 5: %s, want dcaa", got)
	}
	if got := draw(cc.StateAt(cc.OpCount(), nil, DropUnflushed)); got != "dqaa" {
		t.Errorf("second-generation crash state: %s, want dqaa", got)
	}

	// Settings are inherited.
	c2 := NewCrash(8192)
	c2.CheckAlignment(4096)
	m2 := c2.MemAt(0, nil, DropUnflushed)
	if m2.SectorSize() != 4096 {
		t.Errorf("MemAt of a 4 KiB-sector Crash has %d-byte sectors", m2.SectorSize())
	}
	_, err := m2.WriteAt(image("x"), 0)
	wantErrIs(t, "512-byte write to MemAt of a 4 KiB-sector Crash", err, ErrUnaligned)
}

func TestCrashConcurrent(t *testing.T) {
	c := NewCrash(1 << 20)
	c.CheckAlignment(4096)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			data := aligned(4096, byte(w))
			for i := range 50 {
				off := int64((w*50 + i) * 4096)
				if _, err := c.WriteAt(data, off); err != nil {
					t.Error(err)
					return
				}
				if _, err := c.ReadAt(directio.AlignedBlock(4096), off); err != nil {
					t.Error(err)
					return
				}
				if i%10 == 9 {
					if err := c.Flush(); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 1))
		for range 20 {
			c.StateAt(c.OpCount(), rng, Torn)
			c.FlushOps()
		}
	})
	wg.Wait()
	mustFlush(t, c)
	if c.OpCount() != 4*50+4*5+1 {
		t.Errorf("OpCount %d, want %d", c.OpCount(), 4*50+4*5+1)
	}
	if !bytes.Equal(c.StateAt(c.OpCount(), nil, DropUnflushed), c.Bytes()) {
		t.Error("after a final flush the durable image differs from the live one")
	}
}

func TestCrashMisuse(t *testing.T) {
	c := handLog(t)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"op past the end", func() { c.StateAt(8, nil, DropUnflushed) }},
		{"negative op", func() { c.StateAt(-1, nil, DropUnflushed) }},
		{"no rng", func() { c.StateAt(7, nil, Torn) }},
		{"short dst", func() { c.StateAtInto(make([]byte, 10), 7, nil, DropUnflushed) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: StateAt did not panic", tc.name)
				}
			}()
			tc.f()
		}()
	}

	c.Close()
	_, err := c.WriteAt(image("z"), 0)
	wantErrIs(t, "write after Close", err, ErrClosed)
	c.Reopen()
	writeSector(t, c, 0, 'z')
	if c.OpCount() != 8 {
		t.Errorf("OpCount %d after Reopen and a write, want 8", c.OpCount())
	}
}

// BenchmarkCrashStateAt measures producing one state of a 16 MiB store after
// 3000 ops (writes of 4 to 64 KiB, a flush every 8 ops): as a Mem (MemAt, the
// cheap way) and as bytes (StateAtInto, StateAt), cutting at flushes in order
// or at random, and torn at a random op.
func BenchmarkCrashStateAt(b *testing.B) {
	const size = 16 << 20
	rng := rand.New(rand.NewPCG(7, 7))
	c := NewCrash(size)
	data := make([]byte, 64<<10)
	for i := range data {
		data[i] = byte(i)
	}
	for i := range 3000 {
		if i%8 == 7 {
			c.Flush()
			continue
		}
		n := int64(1+rng.IntN(16)) * 4096
		off := int64(rng.IntN((size-int(n))/4096)) * 4096
		c.WriteAt(data[:n], off)
	}
	flushes := c.FlushOps()
	dst := make([]byte, size)
	b.Logf("%d ops, %d flushes, %d snapshots", c.OpCount(), len(flushes), len(c.mu.history.snapshots))

	b.Run("MemAt/flushes-in-order", func(b *testing.B) {
		i := 0
		for b.Loop() {
			c.MemAt(flushes[i%len(flushes)], nil, DropUnflushed)
			i++
		}
	})
	b.Run("MemAt/flushes-random", func(b *testing.B) {
		for b.Loop() {
			c.MemAt(flushes[rng.IntN(len(flushes))], nil, DropUnflushed)
		}
	})
	b.Run("MemAt/torn-random-op", func(b *testing.B) {
		for b.Loop() {
			c.MemAt(rng.IntN(c.OpCount()+1), rng, Torn)
		}
	})
	b.Run("StateAtInto/flushes-random", func(b *testing.B) {
		for b.Loop() {
			c.StateAtInto(dst, flushes[rng.IntN(len(flushes))], nil, DropUnflushed)
		}
	})
	b.Run("StateAt/flushes-random", func(b *testing.B) {
		for b.Loop() {
			_ = c.StateAt(flushes[rng.IntN(len(flushes))], nil, DropUnflushed)
		}
	})
}
