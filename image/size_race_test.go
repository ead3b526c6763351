package image

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// A disk's size while it changes: growth racing with writes, and a
// shrink's zeroed tail across power cuts.

// TestGrowNeverShrinks: a growing Allocate or ZeroRange reads the size
// when it starts; a write past its range that grows the disk while it runs
// (here: while its backend I/O is held up) must keep its size and its
// blocks. Before the fix the fallocate set its own, smaller, end as the
// size: the disk shrank back and the write's blocks were freed.
func TestGrowNeverShrinks(t *testing.T) {
	const bs = 4096
	for _, tt := range []struct {
		name  string
		setup func(d *Disk) error // before the fallocate
		op    func(d *Disk) error // the growing fallocate, to 1 MiB
		pause func(backend.Op) bool
	}{
		{
			name:  "allocate",
			setup: func(d *Disk) error { return nil },
			op:    func(d *Disk) error { return d.Allocate(0, 1<<20, false) },
			pause: func(op backend.Op) bool { return op.Kind == backend.OpWriteZeroes },
		},
		{
			name: "zero range",
			setup: func(d *Disk) error {
				_, err := d.WriteAt(bytes.Repeat([]byte{0x11}, 2*bs), 0)
				return err
			},
			// Zeroes part of block 1 in place (a read-modify-write),
			// then grows.
			op:    func(d *Disk) error { return d.ZeroRange(bs+100, 1<<20-bs-100, false) },
			pause: func(op backend.Op) bool { return op.Kind == backend.OpRead },
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, s := crashStore(t, 64<<20)
			d := mustCreate(t, s, "a", 0)
			defer d.Close()
			if err := tt.setup(d); err != nil {
				t.Fatal(err)
			}
			reached, release := pauseOn(c, tt.pause)
			done := make(chan error, 1)
			go func() { done <- tt.op(d) }()
			<-reached
			// The fallocate holds blocks [0, 256) and waits in its I/O; a
			// write at 2 MiB does not conflict with it and grows the disk.
			p := bytes.Repeat([]byte{0x5a}, bs)
			if _, err := d.WriteAt(p, 2<<20); err != nil {
				t.Fatal(err)
			}
			want := int64(2<<20 + bs)
			if got := d.Size(); got != want {
				t.Fatalf("size after the write: %d, want %d", got, want)
			}
			release()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := d.Size(); got != want {
				t.Fatalf("size after the fallocate: %d, want %d: a grow lowered the size", got, want)
			}
			got := make([]byte, bs)
			if _, err := d.ReadAt(got, 2<<20); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, p) {
				t.Fatalf("the write at 2 MiB reads back as %x…, want %x…", got[:4], p[:4])
			}
			if err := d.Sync(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestZeroedTailSurvivesPowerCut: a truncate to the middle of a block
// zeroes the rest of that block in place, then journals the size. At every
// power cut where the new size is durable, growing the disk again must
// read zeros past it. Before the fix the commit of the size record (no map
// record in it) did not flush the data first, so the journal could reach
// the media without the zeroing, and the old bytes came back.
func TestZeroedTailSurvivesPowerCut(t *testing.T) {
	const bs, cutAt = 4096, 100
	c, s := crashStore(t, 16<<20)
	d := mustCreate(t, s, "a", 0)
	if _, err := d.WriteAt(bytes.Repeat([]byte{0x11}, 2*bs), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	start := c.OpCount()
	if err := d.Truncate(cutAt); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Close()

	rng := rand.New(rand.NewPCG(3, 4))
	states := 0
	for op := start; op <= c.OpCount(); op++ {
		modes := []backend.CrashMode{backend.DropUnflushed}
		for range 40 {
			modes = append(modes, backend.RandomSubset, backend.Torn)
		}
		for _, mode := range modes {
			where := fmt.Sprintf("power cut after op %d (%s)", op, mode)
			s2, err := Open(c.MemAt(op, rng, mode), Options{CommitInterval: -1, Logger: quietLogger()})
			if err != nil {
				t.Fatalf("%s: open: %v", where, err)
			}
			d2, err := s2.OpenDisk("a")
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if d2.Size() == cutAt {
				states++
				if err := d2.Truncate(2 * bs); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, 2*bs)
				if _, err := d2.ReadAt(got, 0); err != nil {
					t.Fatal(err)
				}
				if i := bytes.IndexFunc(got[cutAt:], func(r rune) bool { return r != 0 }); i >= 0 {
					t.Fatalf("%s: the truncate to %d is durable, but after growing again byte %d is %#x, want 0", where, cutAt, cutAt+i, got[cutAt+i])
				}
			}
			d2.Close()
			s2.Close()
		}
	}
	if states == 0 {
		t.Fatal("no power cut left the truncate durable")
	}
}
