package transfer

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

func newStore(t *testing.T, size int64) *image.Store {
	t.Helper()
	mem := backend.NewMem(size)
	mem.CheckAlignment(512)
	if err := image.Format(mem, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(mem, image.Options{CommitInterval: -1, Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if rep := s.Check(); !rep.Clean() {
			t.Errorf("check: %v", rep.Findings)
		}
		s.Close()
	})
	return s
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32()) | 1
	}
	return p
}

func readDisk(t *testing.T, s *image.Store, name string) []byte {
	t.Helper()
	d, err := s.OpenDisk(name)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := make([]byte, d.Size())
	if _, err := d.ReadAt(p, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return p
}

// TestRoundTrip: a complete stream of s1, then an incremental one of s2
// from s1, received into another store, read back exactly; the
// incremental stream carries only what changed.
func TestRoundTrip(t *testing.T) {
	src, dst := newStore(t, 96<<20), newStore(t, 96<<20)
	const size = 16 << 20
	if _, err := src.Create("a", 0, image.Attr{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	h, _ := src.OpenDisk("a")
	defer h.Close()
	if _, err := h.WriteAt(randomBytes(1, size), 0); err != nil {
		t.Fatal(err)
	}
	if err := h.Punch(4<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Snapshot("a", "s1"); err != nil {
		t.Fatal(err)
	}
	var full bytes.Buffer
	if _, err := Send(&full, src, "s1", "", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Receive(&full, dst, "s1", nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readDisk(t, dst, "s1"), readDisk(t, src, "s1")) {
		t.Fatal("the received s1 differs")
	}

	// Scattered overwrites, a punch, a growth: s2.
	r := rand.New(rand.NewPCG(2, 2))
	var written int64
	for range 16 {
		off := r.Int64N(size/4096) * 4096
		p := randomBytes(uint64(off), 64<<10)
		if _, err := h.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		written += int64(len(p))
	}
	if err := h.Punch(8<<20, 512<<10); err != nil {
		t.Fatal(err)
	}
	if err := h.Truncate(size + 100000); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Snapshot("a", "s2"); err != nil {
		t.Fatal(err)
	}
	var inc bytes.Buffer
	st, err := Send(&inc, src, "s2", "s1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.DataBytes > written || int64(inc.Len()) > written+64<<10 {
		t.Errorf("incremental stream of %d bytes (%d of data) for %d bytes written", inc.Len(), st.DataBytes, written)
	}
	if _, err := Receive(&inc, dst, "s2", nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readDisk(t, dst, "s2"), readDisk(t, src, "s2")) {
		t.Fatal("the received s2 differs")
	}
	info, _ := dst.Stat("s2")
	if srcInfo, _ := src.Stat("s2"); !info.Snapshot || info.UUID != srcInfo.UUID || info.Shared == 0 {
		t.Errorf("received s2: snapshot %v, uuid %x (sent %x), shared %d bytes with s1", info.Snapshot, info.UUID, srcInfo.UUID, info.Shared)
	}
}

// TestDamagedStreams: a stream cut short, one with a byte flipped, and an
// incremental one whose base the receiver lacks are refused, and leave no
// disk behind.
func TestDamagedStreams(t *testing.T) {
	src := newStore(t, 64<<20)
	if _, err := src.Create("a", 0, image.Attr{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	h, _ := src.OpenDisk("a")
	if _, err := h.WriteAt(randomBytes(5, 3<<20), 0); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if _, err := src.Snapshot("a", "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Snapshot("a", "s2"); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := Send(&b, src, "s1", "", nil); err != nil {
		t.Fatal(err)
	}
	var inc bytes.Buffer
	if _, err := Send(&inc, src, "s2", "s1", nil); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 7))
	flipped := bytes.Clone(b.Bytes())
	flipped[r.IntN(len(flipped))] ^= 0x40
	for what, data := range map[string][]byte{
		"cut":     b.Bytes()[:r.IntN(b.Len())],
		"flipped": flipped,
		"no base": inc.Bytes(),
		"empty":   nil,
	} {
		dst := newStore(t, 64<<20)
		free := dst.Info().FreeBlocks
		if _, err := Receive(bytes.NewReader(data), dst, "x", nil); err == nil {
			t.Errorf("%s stream: received", what)
		} else {
			t.Logf("%s stream: %v", what, err)
		}
		if len(dst.List()) != 0 {
			t.Errorf("%s stream: left disks %v", what, dst.List())
		}
		if err := dst.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := dst.Info().FreeBlocks; got != free {
			t.Errorf("%s stream: %d free blocks after, %d before", what, got, free)
		}
	}
}
