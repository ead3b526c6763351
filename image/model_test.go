package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// model is the naive reference a store is compared against: each disk is a
// plain byte slice.
type model struct {
	disks map[string][]byte
}

func (m *model) write(name string, p []byte, off int64) {
	d := m.disks[name]
	if end := off + int64(len(p)); end > int64(len(d)) {
		d = append(d, make([]byte, end-int64(len(d)))...)
	}
	copy(d[off:], p)
	m.disks[name] = d
}

func (m *model) zero(name string, off, n int64, keepSize bool) {
	d := m.disks[name]
	end := off + n
	if !keepSize && end > int64(len(d)) {
		d = append(d, make([]byte, end-int64(len(d)))...)
	}
	if off < int64(len(d)) {
		clear(d[off:min(end, int64(len(d)))])
	}
	m.disks[name] = d
}

func (m *model) truncate(name string, size int64) {
	d := m.disks[name]
	if size <= int64(len(d)) {
		d = d[:size:size]
	} else {
		d = append(d, make([]byte, size-int64(len(d)))...)
	}
	m.disks[name] = d
}

// randRange picks an I/O range biased towards the interesting cases: block
// aligned, 512-aligned, unaligned, tiny, multi-block, around the end.
func randRange(rng *rand.Rand, bs, limit int64) (off, n int64) {
	switch rng.IntN(5) {
	case 0: // whole blocks
		off = rng.Int64N(limit/bs) * bs
		n = (1 + rng.Int64N(64)) * bs
	case 1: // sectors
		off = rng.Int64N(limit/512) * 512
		n = (1 + rng.Int64N(40)) * 512
	case 2: // small, unaligned
		off = rng.Int64N(limit)
		n = 1 + rng.Int64N(300)
	case 3: // anything
		off = rng.Int64N(limit)
		n = 1 + rng.Int64N(3*bs)
	default: // large
		off = rng.Int64N(limit)
		n = 1 + rng.Int64N(300<<10)
	}
	return off, n
}

// TestDiskAgainstModel runs random operations on a few disks and on the
// model, comparing reads, sizes and allocation after each step. The store
// runs in strict mode (Check after every commit) and is reopened from its
// bytes now and then, so persistence is compared too.
func TestDiskAgainstModel(t *testing.T) {
	ops := 25000
	if testing.Short() {
		ops = 3000
	}
	for _, bs := range []int{4096, 16384} {
		t.Run(fmt.Sprintf("bs=%d", bs), func(t *testing.T) {
			seed := testutil.Seed(t)
			runModel(t, seed, ops, bs)
		})
	}
}

func runModel(t *testing.T, seed uint64, ops, bs int) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	ms := newMemStore(t, 96<<20, FormatOptions{BlockSize: bs, JournalSize: 256 << 10})
	m := &model{disks: map[string][]byte{}}
	handles := map[string]*Disk{}
	names := []string{"a.raw", "b.raw", "c.raw"}
	const limit = 4 << 20 // offsets stay below this, so blocks are reused a lot
	openAll := func() {
		for name := range m.disks {
			d, err := ms.s.OpenDisk(name)
			if err != nil {
				t.Fatalf("open %s: %v", name, err)
			}
			handles[name] = d
		}
	}
	closeAll := func() {
		for name, d := range handles {
			d.Close()
			delete(handles, name)
		}
	}
	defer closeAll()
	buf := make([]byte, 0, 2<<20)
	for i := 0; i < ops; i++ {
		name := names[rng.IntN(len(names))]
		d, exists := handles[name]
		op := rng.IntN(100)
		if !exists {
			if _, err := ms.s.Create(name, 0, Attr{Mode: 0o600}); err != nil {
				t.Fatalf("op %d: create %s: %v", i, name, err)
			}
			m.disks[name] = nil
			handles[name], _ = ms.s.OpenDisk(name)
			continue
		}
		off, n := randRange(rng, int64(bs), limit)
		step := ""
		switch {
		case op < 40:
			step = fmt.Sprintf("write [%d,+%d)", off, n)
			p := buf[:n]
			for j := range p {
				p[j] = byte(rng.IntN(255) + 1)
			}
			if _, err := d.WriteAt(p, off); err != nil {
				t.Fatalf("op %d %s %s: %v", i, name, step, err)
			}
			m.write(name, p, off)
		case op < 60:
			step = fmt.Sprintf("read [%d,+%d)", off, n)
			got := buf[:n]
			k, err := d.ReadAt(got, off)
			want := m.disks[name]
			wantN := max(0, min(int64(len(want))-off, n))
			if int64(k) != wantN || (k < int(n)) != errors.Is(err, io.EOF) || err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("op %d %s %s: got %d, %v; model has %d bytes", i, name, step, k, err, len(want))
			}
			if k > 0 && !bytes.Equal(got[:k], want[off:off+int64(k)]) {
				t.Fatalf("op %d %s %s: content differs at %d", i, name, step, off+int64(firstDiff(got[:k], want[off:])))
			}
		case op < 68:
			step = fmt.Sprintf("punch [%d,+%d)", off, n)
			if err := d.Punch(off, n); err != nil {
				t.Fatalf("op %d %s %s: %v", i, name, step, err)
			}
			m.zero(name, off, n, true)
		case op < 72:
			keep := rng.IntN(2) == 0
			step = fmt.Sprintf("zero range [%d,+%d) keep=%v", off, n, keep)
			if err := d.ZeroRange(off, n, keep); err != nil {
				t.Fatalf("op %d %s %s: %v", i, name, step, err)
			}
			m.zero(name, off, n, keep)
		case op < 75:
			keep := rng.IntN(2) == 0
			step = fmt.Sprintf("allocate [%d,+%d) keep=%v", off, n, keep)
			if err := d.Allocate(off, n, keep); err != nil {
				t.Fatalf("op %d %s %s: %v", i, name, step, err)
			}
			if !keep && off+n > int64(len(m.disks[name])) {
				m.truncate(name, off+n)
			}
		case op < 82:
			size := rng.Int64N(limit)
			if rng.IntN(3) == 0 {
				size = size / int64(bs) * int64(bs)
			}
			step = fmt.Sprintf("truncate %d", size)
			if err := d.Truncate(size); err != nil {
				t.Fatalf("op %d %s %s: %v", i, name, step, err)
			}
			m.truncate(name, size)
		case op < 86:
			step = "sync"
			if err := d.Sync(); err != nil {
				t.Fatalf("op %d %s sync: %v", i, name, err)
			}
		case op < 89:
			step = fmt.Sprintf("seek data/hole at %d", off)
			checkSeek(t, d, m.disks[name], off, int64(bs))
		case op < 90:
			step = "remove"
			d.Close()
			delete(handles, name)
			if err := ms.s.Remove(name); err != nil {
				t.Fatalf("op %d remove %s: %v", i, name, err)
			}
			delete(m.disks, name)
		case op < 91:
			step = "reopen"
			closeAll()
			ms.reopen()
			openAll()
		default:
			step = "stat"
		}
		if d, ok := handles[name]; ok {
			if got, want := d.Size(), int64(len(m.disks[name])); got != want {
				t.Fatalf("op %d %s %s: size %d, model %d", i, name, step, got, want)
			}
			if info := d.Stat(); info.Allocated > coalesceUp(int64(len(m.disks[name])), int64(bs)) {
				t.Fatalf("op %d %s %s: %d bytes allocated for a %d-byte disk", i, name, step, info.Allocated, len(m.disks[name]))
			}
		}
	}
	// Everything must survive a clean close and reopen.
	closeAll()
	ms.reopen()
	for name, want := range m.disks {
		d, err := ms.s.OpenDisk(name)
		if err != nil {
			t.Fatalf("final open %s: %v", name, err)
		}
		got := make([]byte, len(want))
		if _, err := d.ReadAt(got, 0); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("final read %s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("final %s: content differs at %d", name, firstDiff(got, want))
		}
		d.Close()
	}
}

func coalesceUp(x, a int64) int64 { return (x + a - 1) / a * a }

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// checkSeek compares SeekData/SeekHole with the model: the store may report
// data where the model has zeros (allocated zero blocks), but never a hole
// where the model has a non-zero byte, and the answers must be consistent
// with block boundaries.
func checkSeek(t *testing.T, d *Disk, want []byte, off, bs int64) {
	t.Helper()
	size := int64(len(want))
	data, err := d.SeekData(off)
	if off >= size {
		if !errors.Is(err, ErrNoData) {
			t.Fatalf("seek data at %d past size %d: %d, %v", off, size, data, err)
		}
		return
	}
	if errors.Is(err, ErrNoData) {
		data = size
	} else if err != nil {
		t.Fatalf("seek data at %d: %v", off, err)
	}
	for i := off; i < data; i++ {
		if want[i] != 0 {
			t.Fatalf("seek data at %d says %d, but byte %d is %#x", off, data, i, want[i])
		}
	}
	hole, err := d.SeekHole(off)
	if err != nil {
		t.Fatalf("seek hole at %d: %v", off, err)
	}
	if hole < off || hole > size {
		t.Fatalf("seek hole at %d: %d outside [%d, %d]", off, hole, off, size)
	}
	if hole < size && hole%bs != 0 && hole != off {
		t.Fatalf("seek hole at %d: %d is not on a block boundary", off, hole)
	}
	// Bytes in a reported hole must be zero.
	end := min(size, (hole/bs+1)*bs)
	if hole < size {
		for i := hole; i < end; i++ {
			if want[i] != 0 {
				t.Fatalf("seek hole at %d says %d, but byte %d is %#x", off, hole, i, want[i])
			}
		}
	}
}
