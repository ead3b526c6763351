package blk

import (
	"encoding/binary"
	"io"
	"testing"
	"unsafe"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/door"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
	"github.com/vdiskfs/vdiskfs/vhostuser/virtq"
)

// sizeDisk is a Disk of a size and nothing else: parse asks no more.
type sizeDisk struct{ size int64 }

func (d sizeDisk) Size() int64                               { return d.size }
func (d sizeDisk) BlockSize() int                            { return 4096 }
func (d sizeDisk) Encrypted() bool                           { return false }
func (d sizeDisk) NewCompletions() (door.Completions, error) { return nil, nil }
func (d sizeDisk) NewIO(door.Completions) IO                 { return nil }
func (d sizeDisk) ReadAt(p []byte, off int64) (int, error)   { return 0, io.EOF }
func (d sizeDisk) WriteAt(p []byte, off int64) (int, error)  { return 0, io.EOF }
func (d sizeDisk) Flush() error                              { return nil }
func (d sizeDisk) Discard(off, n int64) error                { return nil }
func (d sizeDisk) WriteZeroes(off, n int64, unmap bool) error {
	return nil
}

func testDevice() *device {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return newDevice(sizeDisk{1 << 20}, Config{ID: "disk-with-a-name-longer-than-20", Queues: 1, Log: l})
}

// chainOf cuts mem into buffers of the given sizes at guest address
// 0x1000+offset in mem; the last nWrite are writable.
func chainOf(mem []byte, sizes []int, gaps []int, nWrite int) virtq.Chain {
	var c virtq.Chain
	off := 0
	for i, n := range sizes {
		if i < len(gaps) {
			off += gaps[i]
		}
		w := i >= len(sizes)-nWrite
		c.Bufs = append(c.Bufs, virtq.Buf{Addr: 0x1000 + uint64(off), Data: mem[off : off+n], Write: w})
		if w {
			c.WriteLen += uint64(n)
			if n > 0 { // as the ring, which leaves empty descriptors out
				c.LastWrite = mem[off : off+n]
			}
		} else {
			c.NumRead++
			c.ReadLen += uint64(n)
		}
		off += n
	}
	return c
}

func TestParse(t *testing.T) {
	d := testDevice()
	mem := make([]byte, 1<<16)
	hdr := func(typ uint32, sector uint64) {
		binary.LittleEndian.PutUint32(mem[0:], typ)
		binary.LittleEndian.PutUint64(mem[8:], sector)
	}
	for _, c := range []struct {
		name       string
		typ        uint32
		sector     uint64
		sizes      []int
		gaps       []int
		nWrite     int
		op         int
		status     byte
		pieces     []int
		off        int64
		err        bool
		writtenLen uint32
	}{
		{name: "read, one piece", typ: proto.BlkTIn, sector: 8, sizes: []int{16, 4096, 1}, nWrite: 2, op: opRead, status: statusPending, pieces: []int{4096}, off: 4096, writtenLen: 4096},
		{name: "read, data and status in one buffer", typ: proto.BlkTIn, sizes: []int{16, 4097}, nWrite: 1, op: opRead, status: statusPending, pieces: []int{4096}, writtenLen: 4096},
		{name: "write, header split, contiguous", typ: proto.BlkTOut, sector: 1, sizes: []int{8, 8, 512, 512, 1}, nWrite: 1, op: opWrite, status: statusPending, pieces: []int{1024}, off: 512},
		{name: "write, header and data in one buffer", typ: proto.BlkTOut, sizes: []int{16 + 1024, 1}, nWrite: 1, op: opWrite, status: statusPending, pieces: []int{1024}},
		{name: "write, gaps", typ: proto.BlkTOut, sizes: []int{16, 512, 512, 512, 1}, gaps: []int{0, 0, 100, 0}, nWrite: 1, op: opWrite, status: statusPending, pieces: []int{512, 1024}},
		{name: "read past the end", typ: proto.BlkTIn, sector: 2047, sizes: []int{16, 1024, 1}, nWrite: 2, op: opRead, status: statusIOErr, pieces: []int{1024}},
		{name: "sector far past the end", typ: proto.BlkTIn, sector: 1 << 62, sizes: []int{16, 512, 1}, nWrite: 2, op: opRead, status: statusIOErr, pieces: []int{512}},
		{name: "not a sector multiple", typ: proto.BlkTOut, sizes: []int{16, 100, 1}, nWrite: 1, op: opWrite, status: statusIOErr, pieces: []int{100}},
		{name: "read with readable data", typ: proto.BlkTIn, sizes: []int{16, 512, 512, 1}, nWrite: 2, op: opRead, status: statusIOErr, pieces: []int{512}},
		{name: "write with writable data", typ: proto.BlkTOut, sizes: []int{16, 512, 512, 1}, nWrite: 2, op: opWrite, status: statusIOErr, pieces: []int{512}},
		{name: "flush", typ: proto.BlkTFlush, sizes: []int{16, 1}, nWrite: 1, op: opFlush, status: statusPending},
		{name: "get id", typ: proto.BlkTGetID, sizes: []int{16, 20, 1}, nWrite: 2, op: opGetID, status: statusOK, pieces: []int{20}, writtenLen: 20},
		{name: "get id, short buffer", typ: proto.BlkTGetID, sizes: []int{16, 8, 1}, nWrite: 2, op: opGetID, status: statusOK, pieces: []int{8}, writtenLen: 8},
		{name: "discard", typ: proto.BlkTDiscard, sizes: []int{16, 32, 1}, nWrite: 1, op: opDiscard, status: statusPending, pieces: []int{32}},
		{name: "discard, half a segment", typ: proto.BlkTDiscard, sizes: []int{16, 8, 1}, nWrite: 1, op: opDiscard, status: statusIOErr},
		{name: "unsupported", typ: 99, sizes: []int{16, 1}, nWrite: 1, op: -1, status: statusUnsupp},
		{name: "no status", typ: proto.BlkTIn, sizes: []int{16, 512}, nWrite: 0, err: true},
		{name: "short header", typ: proto.BlkTIn, sizes: []int{8, 1}, nWrite: 1, err: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			clear(mem)
			hdr(c.typ, c.sector)
			r := &request{chain: chainOf(mem, c.sizes, c.gaps, c.nWrite)}
			err := r.parse(d)
			if (err != nil) != c.err {
				t.Fatalf("parse: %v", err)
			}
			if err != nil {
				return
			}
			if r.op != c.op || r.status != c.status || (c.status == statusPending && r.off != c.off) || r.written != c.writtenLen {
				t.Fatalf("op %d status %d off %d written %d", r.op, r.status, r.off, r.written)
			}
			if c.status == statusPending || c.op == opGetID {
				if len(r.pieces) != len(c.pieces) {
					t.Fatalf("%d pieces, want %v", len(r.pieces), c.pieces)
				}
				for i, p := range r.pieces {
					if len(p) != c.pieces[i] {
						t.Fatalf("piece %d: %d bytes, want %v", i, len(p), c.pieces)
					}
				}
			}
			if c.op == opGetID {
				if got := string(mem[16 : 16+c.writtenLen]); got != "disk-with-a-name-longer-than-20"[:c.writtenLen] {
					t.Fatalf("id %q", got)
				}
			}
		})
	}
}

// FuzzParse parses random chains cut from random bytes: no panic, and
// every piece lies inside the chain's buffers.
func FuzzParse(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0}, []byte{16, 200, 1}, uint8(2))
	f.Add([]byte{11, 0, 0, 0}, []byte{16, 16, 16, 1}, uint8(1))
	f.Fuzz(func(t *testing.T, head []byte, sizes []byte, nWrite uint8) {
		d := testDevice()
		mem := make([]byte, 1<<14)
		copy(mem, head)
		var sz, gaps []int
		total := 0
		for i, s := range sizes {
			if i >= 32 {
				break
			}
			n := int(s)
			if i%3 == 2 {
				n *= 8
			}
			gap := int(s) % 3
			if total+gap+n > len(mem) {
				break
			}
			sz, gaps = append(sz, n), append(gaps, gap)
			total += gap + n
		}
		c := chainOf(mem, sz, gaps, min(int(nWrite), len(sz)))
		r := &request{chain: c}
		if err := r.parse(d); err != nil {
			return
		}
		lo := uintptr(unsafe.Pointer(&mem[0]))
		for _, p := range r.pieces {
			if len(p) == 0 {
				continue
			}
			a := uintptr(unsafe.Pointer(&p[0]))
			if a < lo || a+uintptr(len(p)) > lo+uintptr(len(mem)) {
				t.Fatalf("piece outside the memory")
			}
		}
		if st := r.statusByte(); st == nil && r.status != statusPending {
			t.Fatalf("answered without a status byte")
		}
	})
}

// TestVectors: the vectors of any byte range of a request's pieces hold
// exactly those bytes, in order, and a request is vectorable only when its
// range and every piece are multiples of the alignment and the pieces are
// large.
func TestVectors(t *testing.T) {
	mem := make([]byte, 1<<20)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	// Pieces of 64, 128, 64 and 192 KiB with gaps between them.
	r := &request{off: 8192}
	var joined []byte
	at := 0
	for _, n := range []int{64 << 10, 128 << 10, 64 << 10, 192 << 10} {
		r.pieces = append(r.pieces, mem[at:at+n])
		joined = append(joined, mem[at:at+n]...)
		at += n + 4096
	}
	r.bytes = uint64(len(joined))
	r.iov = make([]unix.Iovec, 0, 16)
	for _, c := range [][2]int{{0, len(joined)}, {0, 4096}, {4096, 64 << 10}, {2048, 192 << 10}, {64<<10 - 512, 256 << 10}, {len(joined) - 512, 512}} {
		r.iov = r.iov[:0]
		var got []byte
		for _, v := range r.vectors(c[0], c[1]) {
			got = append(got, unsafe.Slice(v.Base, v.Len)...)
		}
		if string(got) != string(joined[c[0]:c[0]+c[1]]) {
			t.Errorf("vectors(%d, %d): %d bytes, not the request's", c[0], c[1], len(got))
		}
	}
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	for _, c := range []struct {
		align uint64
		want  bool
	}{{0, false}, {512, base%512 == 0}, {4096, base%4096 == 0}, {8192, false}} {
		if got := r.vectorable(c.align); got != c.want {
			t.Errorf("vectorable(%d) = %v, want %v", c.align, got, c.want)
		}
	}
	r.off = 512
	if r.vectorable(512) != (base%512 == 0) || r.vectorable(4096) {
		t.Errorf("a request at 512 bytes: vectorable(512) %v, vectorable(4096) %v", r.vectorable(512), r.vectorable(4096))
	}
	small := &request{pieces: [][]byte{mem[:4096], mem[8192:12288]}, bytes: 8192}
	if small.vectorable(512) {
		t.Error("a request of two 4 KiB pieces is vectorable")
	}
}
