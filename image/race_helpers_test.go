package image

// Helpers for tests that hold a backend operation while another request
// runs, on a Crash backend.

import (
	"sync"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// crashStore formats and opens a store on a Crash backend of size bytes;
// at cleanup it checks and closes the store. Not Strict: the strict check
// after a commit waits for every change under way, and these tests commit
// while one waits for them.
func crashStore(t *testing.T, size int64) (*backend.Crash, *Store) {
	t.Helper()
	c := backend.NewCrash(size)
	c.CheckAlignment(512)
	if err := Format(c, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.Strict = false
	s, err := Open(c, opts)
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
