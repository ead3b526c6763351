package virtq

import (
	"encoding/binary"
	"errors"
	"testing"
	"unsafe"
)

// FuzzChain walks random descriptor tables, indirect tables and avail
// rings in a byte slice used as guest memory: no panic, and every buffer
// Pop returns lies inside the memory and obeys the chain rules.
func FuzzChain(f *testing.F) {
	seed := make([]byte, 512)
	binary.LittleEndian.PutUint64(seed, dataAt)
	binary.LittleEndian.PutUint32(seed[8:], 16)
	f.Add(seed, uint16(1), true, true)
	f.Add(make([]byte, 64), uint16(3), false, false)
	f.Fuzz(func(t *testing.T, table []byte, avail uint16, indirect, eventIdx bool) {
		d := newDriver(t)
		// The table bytes go at the descriptor table and spill over the
		// avail ring and into the data area (indirect tables there).
		copy(d.at(descAt), table[:min(len(table), usedAt-descAt)])
		if len(table) > usedAt-descAt {
			copy(d.at(dataAt+0x8000), table[usedAt-descAt:])
		}
		binary.LittleEndian.PutUint16(d.at(availAt+2), avail)
		r := d.ring(Options{Indirect: indirect, EventIdx: eventIdx, MaxBufs: 64, MaxBytes: 1 << 20})
		lo := uintptr(unsafe.Pointer(&d.mem[0]))
		hi := lo + uintptr(len(d.mem))
		var c Chain
		for range 2 * ringSize {
			ok, err := r.Pop(&c)
			if errors.Is(err, ErrBadRing) {
				return
			}
			if !ok {
				break
			}
			if err != nil && !errors.Is(err, ErrBadChain) {
				t.Fatalf("error %v is neither ErrBadRing nor ErrBadChain", err)
			}
			var rl, wl uint64
			for i, b := range c.Bufs {
				p := uintptr(unsafe.Pointer(unsafe.SliceData(b.Data)))
				if p < lo || p+uintptr(len(b.Data)) > hi || uint64(p-lo)+base != b.Addr {
					t.Fatalf("buffer %d at %#x (%d bytes) outside the memory", i, b.Addr, len(b.Data))
				}
				if b.Write != (i >= c.NumRead) {
					t.Fatalf("buffer %d: write %v, %d readable", i, b.Write, c.NumRead)
				}
				if b.Write {
					wl += uint64(len(b.Data))
				} else {
					rl += uint64(len(b.Data))
				}
			}
			if rl != c.ReadLen || wl != c.WriteLen || rl+wl > 1<<20 || len(c.Bufs) > 64 {
				t.Fatalf("lengths %d/%d, chain says %d/%d", rl, wl, c.ReadLen, c.WriteLen)
			}
			if err == nil {
				for i := range c.Bufs {
					for j := range i {
						a, b := c.Bufs[i], c.Bufs[j]
						if a.Addr < b.Addr+uint64(len(b.Data)) && b.Addr < a.Addr+uint64(len(a.Data)) {
							t.Fatalf("buffers %d and %d overlap", i, j)
						}
					}
				}
			}
			r.Push(c.Head, uint32(c.WriteLen))
			r.NeedSignal()
		}
		r.EnableNotify()
	})
}
