package image

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// Tests for the bugs the review in issue 16 found.

// crashStore formats and opens a store on a Crash backend of size bytes;
// at cleanup it checks and closes the store.
func crashStore(t *testing.T, size int64) (*backend.Crash, *Store) {
	t.Helper()
	c := backend.NewCrash(size)
	c.CheckAlignment(512)
	if err := Format(c, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(c, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if rep := s.Check(); !rep.Clean() {
			t.Errorf("check at cleanup: %v", rep.Findings)
		}
		s.Close()
	})
	return c, s
}

// pauseOn makes the first backend operation that match accepts wait,
// before it runs, until the returned release is called; reached is closed
// when it starts waiting.
func pauseOn(c *backend.Crash, match func(backend.Op) bool) (reached <-chan struct{}, release func()) {
	r, g := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.SetFault(func(op backend.Op) error {
		hit := false
		if match(op) {
			once.Do(func() { hit = true })
		}
		if hit {
			close(r)
			<-g
		}
		return nil
	})
	return r, func() { close(g) }
}

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

var _ = errors.Is
var _ = fmt.Sprint
