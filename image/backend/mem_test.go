package backend

import (
	"bytes"
	"sync"
	"testing"

	"github.com/ncw/directio"
)

func TestMemReadWriteAndStats(t *testing.T) {
	m := NewMem(64 << 10)
	if m.Size() != 64<<10 || m.SectorSize() != 512 {
		t.Fatalf("Size() = %d, SectorSize() = %d", m.Size(), m.SectorSize())
	}
	data := aligned(8192, 1)
	mustWrite(t, m, data, 4096)
	if got := readBack(t, m, 4096, 8192); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := m.Discard(4096, 4096); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteZeroes(8192, 512); err != nil {
		t.Fatal(err)
	}
	got := m.Bytes()
	wantZeros(t, "discarded and zeroed range", got[4096:8192+512])
	if !bytes.Equal(got[8192+512:12288], data[4096+512:]) {
		t.Error("data after the zeroed range changed")
	}

	want := Stats{Reads: 1, Writes: 1, Flushes: 1, Discards: 1, WriteZeroes: 1, BytesRead: 8192, BytesWritten: 8192}
	if s := m.Stats(); s != want {
		t.Errorf("Stats() = %+v, want %+v", s, want)
	}

	// Out of range is refused, alignment is not checked by default.
	_, err := m.WriteAt(data, 64<<10-4096)
	wantErrIs(t, "write across the end", err, ErrOutOfRange)
	mustWrite(t, m, data[1:100], 3)
}

func TestMemCheckAlignment(t *testing.T) {
	for _, sector := range []int{512, 4096} {
		m := NewMem(64 << 10)
		m.CheckAlignment(sector)
		if m.SectorSize() != sector {
			t.Errorf("SectorSize() = %d, want %d", m.SectorSize(), sector)
		}
		buf := directio.AlignedBlock(8192)
		mustWrite(t, m, buf[:sector], int64(sector))

		_, err := m.WriteAt(buf[:sector], int64(sector/2))
		wantErrIs(t, "write at half a sector", err, ErrUnaligned)
		_, err = m.ReadAt(buf[:sector/2], 0)
		wantErrIs(t, "read of half a sector", err, ErrUnaligned)
		_, err = m.ReadAt(buf[256:256+sector], 0)
		wantErrIs(t, "read into a misaligned buffer", err, ErrUnaligned)
		wantErrIs(t, "unaligned discard", m.Discard(0, 256), ErrUnaligned)
		wantErrIs(t, "unaligned write zeroes", m.WriteZeroes(256, int64(sector)), ErrUnaligned)
		if s := m.Stats(); s.Writes != 1 || s.Reads != 0 || s.Discards != 0 {
			t.Errorf("refused calls were counted: %+v", s)
		}
	}
}

func TestMemCopiesAndReopen(t *testing.T) {
	src := bytes.Repeat([]byte{7}, 4096)
	m := NewMemFrom(src)
	src[0] = 0
	if b := m.Bytes(); b[0] != 7 {
		t.Error("NewMemFrom did not copy its argument")
	}
	b := m.Bytes()
	b[1] = 0
	if m.Bytes()[1] != 7 {
		t.Error("Bytes did not return a copy")
	}

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := m.ReadAt(make([]byte, 512), 0)
	wantErrIs(t, "read after Close", err, ErrClosed)
	wantErrIs(t, "flush after Close", m.Flush(), ErrClosed)
	m.Reopen()
	if got := readBack(t, m, 0, 512); got[0] != 7 {
		t.Error("Reopen lost the contents")
	}
}

func TestMemConcurrent(t *testing.T) {
	m := NewMem(1 << 20)
	m.CheckAlignment(4096)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			data := aligned(4096, byte(w))
			got := directio.AlignedBlock(4096)
			for i := range 50 {
				off := int64((w*50 + i) * 4096 % (1 << 20))
				if _, err := m.WriteAt(data, off); err != nil {
					t.Error(err)
					return
				}
				if _, err := m.ReadAt(got, off); err != nil {
					t.Error(err)
					return
				}
				m.Flush()
				m.Stats()
			}
		})
	}
	wg.Wait()
	if s := m.Stats(); s.Writes != 400 || s.Reads != 400 || s.Flushes != 400 {
		t.Errorf("Stats() = %+v", s)
	}
}

func TestCheckRangeAndAlignmentSweep(t *testing.T) {
	// Every small offset and length against a 4096-byte backing and 512-byte
	// sectors, compared with the rule written out plainly.
	buf := directio.AlignedBlock(8192)
	for off := int64(-600); off <= 4700; off += 100 {
		for n := int64(0); n <= 4700; n += 100 {
			inRange := off >= 0 && off+n <= 4096
			if err := checkRange(off, n, 4096); (err == nil) != inRange {
				t.Fatalf("checkRange(%d, %d, 4096) = %v, want in range: %v", off, n, err, inRange)
			}
			isAligned := off%512 == 0 && n%512 == 0
			if err := checkAligned(off, n, buf[:n], 512); (err == nil) != isAligned {
				t.Fatalf("checkAligned(%d, %d) = %v, want aligned: %v", off, n, err, isAligned)
			}
		}
	}
	for shift := 1; shift < 512; shift *= 3 {
		if checkAligned(0, 512, buf[shift:shift+512], 512) == nil {
			t.Fatalf("buffer at +%d passed the alignment check", shift)
		}
	}
	if checkRange(1, 1<<62, 1<<62) == nil {
		t.Fatal("checkRange overflowed")
	}
}
