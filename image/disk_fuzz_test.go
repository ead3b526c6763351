package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// FuzzDiskOps runs a sequence of Disk API calls, decoded from the input,
// with extreme arguments (0, unaligned, near and past MaxDiskSize, near
// 2^63, negative, at and past the disk's size) on two disks of a small
// memory store, against a sparse model of each disk. Every call must
// either do what the model says or fail with the sentinel the model
// expects (ErrInvalid, ErrTooLarge, ErrNoSpace, ErrNoData, io.EOF): never
// a panic, never a hang, never another error. Syncs, handle reopens and
// store reopens are mixed in, and the store must Check clean at the end.
func FuzzDiskOps(f *testing.F) {
	for _, seed := range diskOpsSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, prog []byte) {
		runDiskOps(t, prog)
	})
}

// TestDiskOpsRandom runs random programs through the same harness (the
// fuzz target's seed corpus runs too, as part of FuzzDiskOps).
func TestDiskOpsRandom(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 60
	}
	seed := testutil.Seed(t)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range n {
		prog := make([]byte, 40+r.IntN(400))
		for j := range prog {
			prog[j] = byte(r.Uint32())
		}
		if !t.Run(fmt.Sprint(i), func(t *testing.T) { runDiskOps(t, prog) }) {
			t.Fatalf("program %x", prog)
		}
	}
}

// diskOpsSeeds are small hand-written programs: one of each op, and the
// extreme cases the fuzzer should start from.
func diskOpsSeeds() [][]byte {
	var seeds [][]byte
	for op := byte(0); op < numDiskOps; op++ {
		for _, v := range []byte{0, 2, 6, 7, 8, 9, 10, 11, 12, 13, 14} {
			// op, disk, offset selector, length selector, extra
			seeds = append(seeds, []byte{op, 0, v, v, 1, opWrite, 1, 15, 9, 3, op, 1, v, 4, 0})
		}
	}
	// Grow to MaxDiskSize, write at its very end, read across it.
	seeds = append(seeds, []byte{opTruncate, 0, 10, 0, 0, opWrite, 0, 9, 1, 0, opRead, 0, 9, 3, 0, opSync, 0, 0, 0, 0})
	// Fill the store, then overwrite and punch.
	seeds = append(seeds, []byte{opAllocate, 0, 0, 12, 0, opAllocate, 1, 0, 14, 0, opWrite, 0, 5, 8, 3, opPunch, 0, 0, 11, 0, opReopen, 0, 0, 0, 0})
	return seeds
}

// The ops of a program. Each is 5 bytes: op, disk, offset selector,
// length selector, extra (a flag or a small number).
const (
	opWrite byte = iota
	opRead
	opPunch
	opZeroRange
	opTruncate
	opAllocate
	opSeekData
	opSeekHole
	opSync
	opStat
	opReopenHandle
	opReopen
	numDiskOps
)

// sparseDisk is the model of one disk: its size and the contents of the
// 4 KiB pages that were ever written (all others read as zeros).
type sparseDisk struct {
	size  int64
	pages map[int64][]byte
}

const modelPage = 4096

func (m *sparseDisk) read(p []byte, off int64) {
	clear(p)
	for i := int64(0); i < int64(len(p)); {
		pg := (off + i) / modelPage
		in := (off + i) % modelPage
		n := min(int64(len(p))-i, modelPage-in)
		if b, ok := m.pages[pg]; ok {
			copy(p[i:i+n], b[in:in+n])
		}
		i += n
	}
}

func (m *sparseDisk) write(p []byte, off int64) {
	for i := int64(0); i < int64(len(p)); {
		pg := (off + i) / modelPage
		in := (off + i) % modelPage
		n := min(int64(len(p))-i, modelPage-in)
		b, ok := m.pages[pg]
		if !ok {
			b = make([]byte, modelPage)
			m.pages[pg] = b
		}
		copy(b[in:in+n], p[i:i+n])
		i += n
	}
}

// zero clears [lo, hi).
func (m *sparseDisk) zero(lo, hi int64) {
	for pg, b := range m.pages {
		s, e := max(lo, pg*modelPage), min(hi, (pg+1)*modelPage)
		if s < e {
			clear(b[s-pg*modelPage : e-pg*modelPage])
		}
	}
}

// zeroIn reports whether [lo, hi) reads as zeros.
func (m *sparseDisk) zeroIn(lo, hi int64) bool {
	for pg, b := range m.pages {
		s, e := max(lo, pg*modelPage), min(hi, (pg+1)*modelPage)
		if s < e && !isZeroBytes(b[s-pg*modelPage:e-pg*modelPage]) {
			return false
		}
	}
	return true
}

func (m *sparseDisk) truncate(size int64) {
	if size < m.size {
		m.zero(size, math.MaxInt64)
	}
	m.size = size
}

func isZeroBytes(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// progReader decodes a program; past its end it reads zeros.
type progReader struct {
	p []byte
	i int
}

func (r *progReader) byte() byte {
	if r.i >= len(r.p) {
		return 0
	}
	b := r.p[r.i]
	r.i++
	return b
}

func (r *progReader) more() bool { return r.i < len(r.p) }

// offset picks an offset: a boundary of the block, the disk or the
// format's limits, or a small one.
func offsetFor(sel, extra byte, size int64) int64 {
	switch sel % 16 {
	case 0:
		return 0
	case 1:
		return 1
	case 2:
		return 511
	case 3:
		return 4095
	case 4:
		return 4096
	case 5:
		return int64(extra) * 4096
	case 6:
		return size - 1
	case 7:
		return size
	case 8:
		return size + 1
	case 9:
		return MaxDiskSize - 1
	case 10:
		return MaxDiskSize
	case 11:
		return MaxDiskSize + 1
	case 12:
		return math.MaxInt64
	case 13:
		return -1
	case 14:
		return math.MinInt64
	default:
		return int64(extra)*1000 + int64(sel)
	}
}

// lengthFor picks a length of a range (punch, zero, allocate): small,
// block-sized, or extreme.
func lengthFor(sel, extra byte, size int64) int64 {
	switch sel % 16 {
	case 0:
		return 0
	case 1:
		return 1
	case 2:
		return 512
	case 3:
		return 4095
	case 4:
		return 4096
	case 5:
		return 4097
	case 6:
		return int64(extra)*4096 + 100
	case 7:
		return size
	case 8:
		return 1 << 20
	case 9:
		return MaxDiskSize - 1
	case 10:
		return MaxDiskSize
	case 11:
		return MaxDiskSize + 1
	case 12:
		return math.MaxInt64
	case 13:
		return -1
	case 14:
		return math.MinInt64
	default:
		return int64(extra) * 333
	}
}

// bufLen picks the length of a read or write buffer (at most 64 KiB).
func bufLen(sel, extra byte) int {
	switch sel % 8 {
	case 0:
		return 0
	case 1:
		return 1
	case 2:
		return 512
	case 3:
		return 4096
	case 4:
		return 4097
	case 5:
		return 3*4096 + 100
	case 6:
		return 64 << 10
	default:
		return int(extra) * 77
	}
}

// rangeErr is the error the model expects of checkRange(off, n).
func rangeErr(off, n int64) error {
	if off < 0 || n < 0 {
		return ErrInvalid
	}
	if off > MaxDiskSize || n > MaxDiskSize-off {
		return ErrTooLarge
	}
	return nil
}

func runDiskOps(t *testing.T, prog []byte) {
	mem := backend.NewMem(4 << 20)
	mem.CheckAlignment(512)
	if err := Format(mem, FormatOptions{JournalSize: 16 << 10}); err != nil {
		t.Fatal(err)
	}
	opts := Options{CommitInterval: -1, Strict: true, Logger: quietLogger()}
	s, err := Open(mem, opts)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"a.raw", "b.raw"}
	models := []*sparseDisk{{pages: map[int64][]byte{}}, {pages: map[int64][]byte{}}}
	handles := make([]*Disk, 2)
	for i, name := range names {
		handles[i] = mustCreate(t, s, name, 0)
	}
	defer func() {
		for _, h := range handles {
			h.Close()
		}
		s.Close()
	}()
	bs := int64(s.BlockSize())
	r := &progReader{p: prog}
	for step := 0; r.more() && step < 64; step++ {
		op, di, sel, lsel, extra := r.byte()%numDiskOps, int(r.byte()%2), r.byte(), r.byte(), r.byte()
		h, m := handles[di], models[di]
		where := func(format string, args ...any) string {
			return fmt.Sprintf("step %d, %s, size %d: %s", step, names[di], m.size, fmt.Sprintf(format, args...))
		}
		// expect fails the test unless err wraps want (nil: no error).
		expect := func(err, want error, what string) bool {
			t.Helper()
			if want == nil && err != nil || want != nil && !errors.Is(err, want) {
				t.Fatalf("%s: error %v, want %v", what, err, want)
			}
			return err == nil
		}
		switch op {
		case opWrite:
			off, n := offsetFor(sel, extra, m.size), bufLen(lsel, extra)
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(step+1) ^ byte(i*7)
			}
			what := where("WriteAt(%d bytes, %d)", n, off)
			got, err := h.WriteAt(p, off)
			want := rangeErr(off, int64(n))
			if errors.Is(err, ErrNoSpace) && want == nil {
				// Nothing was mapped; bytes of mapped blocks may be old or new.
				old := make([]byte, n)
				m.read(old, off)
				now := make([]byte, n)
				if _, rerr := h.ReadAt(now, off); rerr != nil && rerr != io.EOF {
					t.Fatalf("%s: reading back after ENOSPC: %v", what, rerr)
				}
				for i := range now {
					if off+int64(i) < m.size && now[i] != old[i] && now[i] != p[i] {
						t.Fatalf("%s: failed with ENOSPC and byte %d is neither old nor new", what, off+int64(i))
					}
				}
				if h.Size() != m.size {
					t.Fatalf("%s: failed with ENOSPC and changed the size to %d", what, h.Size())
				}
				m.write(now[:max(0, min(int64(n), m.size-off))], off)
				continue
			}
			if expect(err, want, what) {
				if got != n {
					t.Fatalf("%s: wrote %d", what, got)
				}
				if n > 0 {
					m.write(p, off)
					m.size = max(m.size, off+int64(n))
				}
			}
		case opRead:
			off, n := offsetFor(sel, extra, m.size), bufLen(lsel, extra)
			p := make([]byte, n)
			what := where("ReadAt(%d bytes, %d)", n, off)
			got, err := h.ReadAt(p, off)
			want := rangeErr(off, int64(n))
			if want == nil && off >= m.size {
				want = io.EOF
			}
			if want != nil {
				expect(err, want, what)
				if got != 0 {
					t.Fatalf("%s: read %d bytes with error %v", what, got, err)
				}
				continue
			}
			wantN := int(min(int64(n), m.size-off))
			if wantN < n {
				want = io.EOF
			}
			expect(err, want, what)
			if got != wantN {
				t.Fatalf("%s: read %d bytes, want %d", what, got, wantN)
			}
			exp := make([]byte, wantN)
			m.read(exp, off)
			if !bytes.Equal(p[:got], exp) {
				t.Fatalf("%s: content differs from the model", what)
			}
		case opPunch, opZeroRange:
			off, n := offsetFor(sel, extra, m.size), lengthFor(lsel, extra, m.size)
			keep := op == opPunch || extra%2 == 0
			var err error
			what := where("Punch(%d, %d)", off, n)
			if op == opPunch {
				err = h.Punch(off, n)
			} else {
				what = where("ZeroRange(%d, %d, keepSize %v)", off, n, keep)
				err = h.ZeroRange(off, n, keep)
			}
			if expect(err, rangeErr(off, n), what) && n > 0 {
				if off < m.size {
					m.zero(off, min(off+n, m.size))
				}
				if !keep && off+n > m.size {
					m.size = off + n
				}
			}
		case opTruncate:
			size := offsetFor(sel, extra, m.size)
			var want error
			if size < 0 || size > MaxDiskSize {
				want = ErrTooLarge
			}
			if expect(h.Truncate(size), want, where("Truncate(%d)", size)) {
				m.truncate(size)
			}
		case opAllocate:
			off, n := offsetFor(sel, extra, m.size), lengthFor(lsel, extra, m.size)
			keep := extra%2 == 0
			what := where("Allocate(%d, %d, keepSize %v)", off, n, keep)
			err := h.Allocate(off, n, keep)
			want := rangeErr(off, n)
			if want == nil && errors.Is(err, ErrNoSpace) {
				if h.Size() != m.size {
					t.Fatalf("%s: failed with ENOSPC and changed the size to %d", what, h.Size())
				}
				continue // content unchanged; some holes may have zeroed blocks now
			}
			if expect(err, want, what) && n > 0 && !keep && off+n > m.size {
				m.size = off + n
			}
		case opSeekData, opSeekHole:
			off := offsetFor(sel, extra, m.size)
			var want error
			switch {
			case off < 0:
				want = ErrInvalid
			case off >= m.size:
				want = ErrNoData
			}
			if op == opSeekData {
				what := where("SeekData(%d)", off)
				d, err := h.SeekData(off)
				if want == nil && errors.Is(err, ErrNoData) {
					if !m.zeroIn(off, m.size) {
						t.Fatalf("%s: no data, but the model has some", what)
					}
					continue
				}
				if expect(err, want, what) {
					if d < off || d >= m.size || d != off && d%bs != 0 || !m.zeroIn(off, d) {
						t.Fatalf("%s = %d: not the next data", what, d)
					}
				}
			} else {
				what := where("SeekHole(%d)", off)
				hole, err := h.SeekHole(off)
				if expect(err, want, what) {
					if hole < off || hole > m.size || hole != off && hole != m.size && hole%bs != 0 {
						t.Fatalf("%s = %d: not a hole", what, hole)
					}
					if hole < m.size && !m.zeroIn(hole, min(m.size, (hole/bs+1)*bs)) {
						t.Fatalf("%s = %d: the model has data there", what, hole)
					}
				}
			}
		case opSync:
			if err := h.Sync(); err != nil {
				t.Fatalf("%s: %v", where("Sync"), err)
			}
		case opStat:
			info := h.Stat()
			if info.Size != m.size || info.Allocated < 0 || info.Allocated > s.Info().CapacityBytes || info.Name != names[di] {
				t.Fatalf("%s: %+v", where("Stat"), info)
			}
		case opReopenHandle:
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := h.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
				t.Fatalf("%s: read on a closed handle: %v", where("Close"), err)
			}
			if handles[di], err = s.OpenDisk(names[di]); err != nil {
				t.Fatal(err)
			}
		case opReopen:
			for _, h := range handles {
				h.Close()
			}
			if err := s.Close(); err != nil {
				t.Fatalf("%s: close: %v", where("reopen"), err)
			}
			mem.Reopen()
			if s, err = Open(mem, opts); err != nil {
				t.Fatalf("%s: open: %v", where("reopen"), err)
			}
			for i, name := range names {
				if handles[i], err = s.OpenDisk(name); err != nil {
					t.Fatal(err)
				}
			}
		}
		if h := handles[di]; h.Size() != m.size {
			t.Fatalf("%s: size %d after the op, model %d", where("op %d", op), h.Size(), m.size)
		}
	}
	// Everything the models hold reads back, and the store is clean.
	for i, m := range models {
		h := handles[i]
		if h.Size() != m.size {
			t.Fatalf("%s: size %d, model %d", names[i], h.Size(), m.size)
		}
		for pg := range m.pages {
			off := pg * modelPage
			if off >= m.size {
				continue
			}
			n := min(modelPage, m.size-off)
			got, want := make([]byte, n), make([]byte, n)
			if _, err := h.ReadAt(got, off); err != nil && err != io.EOF {
				t.Fatalf("%s: read page %d: %v", names[i], pg, err)
			}
			m.read(want, off)
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: page %d differs from the model", names[i], pg)
			}
		}
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("check: %v", rep.Findings)
	}
}

// TestReadAtEmptyBuffer: a read of zero bytes inside the disk returns 0,
// nil at any offset (io.ReaderAt), and at or past the end 0, io.EOF.
//
// Regression test: Disk.ReadAt sliced its bounce buffer at the offset's
// position in its block although a zero-length read had got no buffer
// (BlockRange(off, 0) is 0 blocks), and panicked with "slice bounds out of
// range [511:0]" for ReadAt(p[:0], 511) (found by FuzzDiskOps).
func TestReadAtEmptyBuffer(t *testing.T) {
	ms := newMemStore(t, 4<<20, FormatOptions{JournalSize: 16 << 10})
	d := mustCreate(t, ms.s, "a.raw", 8192)
	defer d.Close()
	for _, off := range []int64{0, 1, 511, 4095, 4096, 8191} {
		if n, err := d.ReadAt(nil, off); n != 0 || err != nil {
			t.Errorf("ReadAt(nil, %d) = %d, %v; want 0, nil", off, n, err)
		}
	}
	for _, off := range []int64{8192, 8193, MaxDiskSize} {
		if n, err := d.ReadAt([]byte{}, off); n != 0 || err != io.EOF {
			t.Errorf("ReadAt(empty, %d) = %d, %v; want 0, EOF", off, n, err)
		}
	}
}
