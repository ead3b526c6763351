package image

import (
	"bytes"
	"fmt"
	"testing"
)

// TestPartialBlockSweep pins what happens to the blocks a byte range covers
// only in part, for every range whose ends lie on or next to a block
// boundary or the disk's size (the sweep the gocryptfs offsets tests do for
// their arithmetic): writes read-modify-write the partial blocks, keeping
// the bytes around them and zeros for holes; punch and zero range zero
// partial blocks in place and free exactly the whole ones, a partial last
// block that ends at the size counting as whole; truncate keeps exactly the
// blocks below the new size and zeros the rest of the last one. The
// expectations are worked out block by block, independently of the
// arithmetic in package coalesce that the code uses.
func TestPartialBlockSweep(t *testing.T) {
	const bs = 4096
	ms := newMemStore(t, 64<<20, FormatOptions{BlockSize: bs})
	s := ms.s

	for _, size := range []int64{4 * bs, 3*bs + 100} {
		blocks := (size + bs - 1) / bs
		var edges []int64
		for _, e := range []int64{0, 1, bs - 1, bs, bs + 1, 2*bs - 1, 2 * bs, 2*bs + 1, 3*bs - 1, 3 * bs, 3*bs + 1, size - 1, size, size + 1, 4*bs + 1} {
			if len(edges) == 0 || edges[len(edges)-1] < e {
				edges = append(edges, e)
			}
		}
		full := pattern(size, 1)
		// fresh creates the disk with every block written, or with blocks 1
		// and 3 left as holes.
		fresh := func(t *testing.T, holes bool) (*Disk, []byte) {
			t.Helper()
			d := mustCreate(t, s, "d", size)
			want := bytes.Clone(full)
			for b := int64(0); b < blocks; b++ {
				lo, hi := b*bs, min((b+1)*bs, size)
				if holes && b%2 == 1 {
					clear(want[lo:hi])
					continue
				}
				if _, err := d.WriteAt(full[lo:hi], lo); err != nil {
					t.Fatal(err)
				}
			}
			return d, want
		}
		done := func(t *testing.T, d *Disk, want []byte, wantBlocks int64, what string) {
			t.Helper()
			got := make([]byte, len(want))
			if n, err := d.ReadAt(got, 0); n != len(want) || err != nil {
				t.Fatalf("%s: read %d bytes: %v", what, n, err)
			}
			if d.Size() != int64(len(want)) {
				t.Fatalf("%s: size %d, want %d", what, d.Size(), len(want))
			}
			if i := firstDiff(got, want); i < len(want) {
				t.Fatalf("%s: byte %d is %d, want %d", what, i, got[i], want[i])
			}
			if a := d.Stat().Allocated; a != wantBlocks*bs {
				t.Fatalf("%s: %d blocks allocated, want %d", what, a/bs, wantBlocks)
			}
			d.Close()
			if err := s.Remove("d"); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(); err != nil {
				t.Fatal(err)
			}
		}

		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			for i, off := range edges {
				for _, end := range edges[i+1:] {
					n := end - off

					// Write into a disk with holes: every block touched is
					// allocated; untouched bytes keep their value (zeros in
					// holes).
					d, want := fresh(t, true)
					p := pattern(n, 7)
					if _, err := d.WriteAt(p, off); err != nil {
						t.Fatal(err)
					}
					if end > size {
						want = append(want, make([]byte, end-size)...)
					}
					copy(want[off:], p)
					alloc := int64(0)
					for b := int64(0); b < (int64(len(want))+bs-1)/bs; b++ {
						if b < blocks && b%2 == 0 || b*bs < end && (b+1)*bs > off {
							alloc++
						}
					}
					done(t, d, want, alloc, fmt.Sprintf("WriteAt(%d bytes at %d)", n, off))

					// Punch, and ZeroRange growing the disk.
					for _, op := range []string{"Punch", "ZeroRange"} {
						d, want := fresh(t, false)
						var err error
						if op == "Punch" {
							err = d.Punch(off, n)
						} else {
							err = d.ZeroRange(off, n, false)
							if end > size {
								want = append(want, make([]byte, end-size)...)
							}
						}
						if err != nil {
							t.Fatal(err)
						}
						pend := min(end, size)
						if off < pend {
							clear(want[off:pend])
						}
						alloc := int64(0)
						for b := int64(0); b < blocks; b++ {
							lo, hi := b*bs, min((b+1)*bs, size) // the block's bytes inside the disk
							if !(off <= lo && hi <= pend) {
								alloc++
							}
						}
						done(t, d, want, alloc, fmt.Sprintf("%s(%d, %d)", op, off, n))
					}
				}

				// Truncate to off, then grow back: the cut-off bytes read as
				// zeros, and only the blocks below off stay.
				d, want := fresh(t, false)
				if err := d.Truncate(off); err != nil {
					t.Fatal(err)
				}
				if err := d.Truncate(size); err != nil {
					t.Fatal(err)
				}
				if off < size {
					clear(want[off:])
				}
				alloc := min(blocks, (off+bs-1)/bs)
				done(t, d, want, alloc, fmt.Sprintf("Truncate(%d) and back", off))
			}
		})
	}
}

// pattern returns n bytes that differ from block to block and byte to byte,
// never zero.
func pattern(n int64, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i%251) + seed + byte(i/4096)
		if p[i] == 0 {
			p[i] = 1
		}
	}
	return p
}
