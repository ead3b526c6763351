package transfer

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/stream"
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
	if _, err := Send(&full, src, "s1", SendOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Receive(&full, dst, "s1", ReceiveOptions{}); err != nil {
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
	st, err := Send(&inc, src, "s2", SendOptions{From: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if st.DataBytes > written || int64(inc.Len()) > written+64<<10 {
		t.Errorf("incremental stream of %d bytes (%d of data) for %d bytes written", inc.Len(), st.DataBytes, written)
	}
	if _, err := Receive(&inc, dst, "s2", ReceiveOptions{}); err != nil {
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
	if _, err := Send(&b, src, "s1", SendOptions{}); err != nil {
		t.Fatal(err)
	}
	var inc bytes.Buffer
	if _, err := Send(&inc, src, "s2", SendOptions{From: "s1"}); err != nil {
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
		if _, err := Receive(bytes.NewReader(data), dst, "x", ReceiveOptions{}); err == nil {
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

// mustCreateWith creates the disk name in s holding data, with attr.
func mustCreateWith(t *testing.T, s *image.Store, name string, data []byte, attr image.Attr) {
	t.Helper()
	if _, err := s.Create(name, 0, attr); err != nil {
		t.Fatal(err)
	}
	h, err := s.OpenDisk(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
}

func writeAt(t *testing.T, s *image.Store, name string, p []byte, off int64) {
	t.Helper()
	h, err := s.OpenDisk(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
}

// transfer sends name of src (incremental from from when not "") and
// receives it into dst as name.
func transfer(t *testing.T, src, dst *image.Store, name, from string) error {
	t.Helper()
	var b bytes.Buffer
	if _, err := Send(&b, src, name, SendOptions{From: from}); err != nil {
		return err
	}
	_, err := Receive(&b, dst, name, ReceiveOptions{})
	return err
}

// TestSendCloneAsBase is issue 39's reproduction: a clone, sent and
// received, then written on the sender and snapshotted; an incremental
// stream of the snapshot from the clone gave the receiver the clone's old
// bytes where the sender had new ones. Send must refuse the clone as a
// base, naming it; a receiver must never end up with other bytes.
func TestSendCloneAsBase(t *testing.T) {
	a, b := newStore(t, 32<<20), newStore(t, 32<<20)
	mustCreateWith(t, a, "d", randomBytes(39, 1<<20), image.Attr{Mode: 0o600})
	if _, err := a.Clone("d", "base"); err != nil {
		t.Fatal(err)
	}
	if err := transfer(t, a, b, "base", ""); err != nil {
		t.Fatal(err)
	}
	writeAt(t, a, "base", randomBytes(40, 64<<10), 128<<10)
	if _, err := a.Snapshot("base", "s4"); err != nil {
		t.Fatal(err)
	}
	err := transfer(t, a, b, "s4", "base")
	if err == nil {
		if !bytes.Equal(readDisk(t, a, "s4"), readDisk(t, b, "s4")) {
			t.Fatal("an incremental stream from a clone was received, and the receiver's s4 differs from the sender's")
		}
		return
	}
	if !errors.Is(err, ErrNotSnapshot) || !strings.Contains(err.Error(), `"base"`) {
		t.Errorf("send --from a clone: %v, want ErrNotSnapshot naming base", err)
	}
	t.Log(err)
	if _, err := b.Stat("s4"); err == nil {
		t.Error("s4 was received")
	}
}

// TestReceiveBaseDiffers: a receiver whose snapshot has the base's
// identity but not its size or content (here made with a forged stream)
// refuses the incremental stream, naming the base on both sides, and
// keeps nothing of it.
func TestReceiveBaseDiffers(t *testing.T) {
	src := newStore(t, 32<<20)
	data := randomBytes(41, 1<<20)
	mustCreateWith(t, src, "a", data, image.Attr{Mode: 0o600})
	s1, err := src.Snapshot("a", "s1")
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, src, "a", randomBytes(42, 4096), 8192)
	if _, err := src.Snapshot("a", "s2"); err != nil {
		t.Fatal(err)
	}
	var inc bytes.Buffer
	if _, err := Send(&inc, src, "s2", SendOptions{From: "s1"}); err != nil {
		t.Fatal(err)
	}
	forge := func(p []byte) []byte {
		var b bytes.Buffer
		w, err := stream.NewWriter(&b, stream.Header{Size: int64(len(p)), UUID: s1.UUID, Name: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Data(0, p); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	other := bytes.Clone(data)
	other[700<<10] ^= 1
	for what, forged := range map[string][]byte{
		"content": forge(other),
		"size":    forge(data[:len(data)-4096]),
	} {
		dst := newStore(t, 32<<20)
		if _, err := Receive(bytes.NewReader(forged), dst, "mine", ReceiveOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := Receive(bytes.NewReader(inc.Bytes()), dst, "s2", ReceiveOptions{})
		if !errors.Is(err, ErrBaseDiffers) || !strings.Contains(err.Error(), `"s1"`) || !strings.Contains(err.Error(), `"mine"`) {
			t.Errorf("%s differs: %v, want ErrBaseDiffers naming s1 and mine", what, err)
		}
		t.Logf("%s: %v", what, err)
		if l := dst.List(); len(l) != 1 {
			t.Errorf("%s: disks %+v", what, l)
		}
	}
	// The real base is accepted.
	dst := newStore(t, 32<<20)
	if err := transfer(t, src, dst, "s1", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Receive(bytes.NewReader(inc.Bytes()), dst, "s2", ReceiveOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestBaseDigest: the digest depends on the size and on the content,
// wherever it differs in a disk up to 1 MiB and at the sampled pieces in
// a larger one, and not on the store's block size.
func TestBaseDigest(t *testing.T) {
	digest := func(s *image.Store, name string) [32]byte {
		t.Helper()
		d, err := s.OpenDisk(name)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		sum, err := baseDigest(d)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	s := newStore(t, 64<<20)
	big := randomBytes(43, 5<<20+1000)
	mustCreateWith(t, s, "big", big, image.Attr{})
	mustCreateWith(t, s, "small", big[:1<<20], image.Attr{})
	mustCreateWith(t, s, "empty", nil, image.Attr{})
	d0, ds := digest(s, "big"), digest(s, "small")
	if digest(s, "empty") == ds || d0 == ds {
		t.Error("digests of different sizes agree")
	}
	writeAt(t, s, "small", []byte{big[1<<20-1] ^ 1}, 1<<20-1)
	if digest(s, "small") == ds {
		t.Error("a change in the last byte of a 1 MiB disk leaves the digest")
	}
	writeAt(t, s, "big", []byte{big[5<<20+999] ^ 1}, 5<<20+999) // the last piece ends at the end
	if digest(s, "big") == d0 {
		t.Error("a change in the last byte of a large disk leaves the digest")
	}

	mem := backend.NewMem(64 << 20)
	if err := image.Format(mem, image.FormatOptions{BlockSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	s64, err := image.Open(mem, image.Options{CommitInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s64.Close()
	mustCreateWith(t, s64, "big", big, image.Attr{})
	writeAt(t, s64, "big", []byte{big[5<<20+999] ^ 1}, 5<<20+999)
	if digest(s64, "big") != digest(s, "big") {
		t.Error("the same content in a store of 64 KiB blocks has another digest")
	}
}

// TestSendReceiveOwnership: a 0600 disk of 1234:5678 arrives 0600
// 1234:5678 with its times, complete and incremental; setuid, setgid and
// sticky bits do not travel; a version-1 stream makes a 0600 root:root
// disk; ReceiveOptions override the mode and owner.
func TestSendReceiveOwnership(t *testing.T) {
	src, dst := newStore(t, 32<<20), newStore(t, 32<<20)
	mtime := time.Unix(1700000000, 123456789)
	atime := time.Unix(1600000000, 5)
	mustCreateWith(t, src, "a", randomBytes(44, 256<<10), image.Attr{Mode: 0o600, UID: 1234, GID: 5678})
	h, _ := src.OpenDisk("a")
	if err := h.SetAttr(image.AttrChange{Atime: &atime, Mtime: &mtime}); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if _, err := src.Snapshot("a", "s1"); err != nil {
		t.Fatal(err)
	}
	writeAt(t, src, "a", []byte("changed"), 0)
	mode := uint32(0o4750)
	h, _ = src.OpenDisk("a")
	if err := h.SetAttr(image.AttrChange{Mode: &mode}); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if _, err := src.Snapshot("a", "s2"); err != nil {
		t.Fatal(err)
	}
	want := func(st image.DiskInfo, mode, uid, gid uint32) {
		t.Helper()
		if st.Mode != mode || st.UID != uid || st.GID != gid {
			t.Errorf("%s: mode %#o %d:%d, want %#o %d:%d", st.Name, st.Mode, st.UID, st.GID, mode, uid, gid)
		}
	}
	if err := transfer(t, src, dst, "s1", ""); err != nil {
		t.Fatal(err)
	}
	got, _ := dst.Stat("s1")
	want(got, 0o600, 1234, 5678)
	if !got.Mtime.Equal(mtime) || !got.Atime.Equal(atime) {
		t.Errorf("s1 times: atime %v mtime %v, want %v %v", got.Atime, got.Mtime, atime, mtime)
	}
	if err := transfer(t, src, dst, "s2", "s1"); err != nil {
		t.Fatal(err)
	}
	s2, _ := src.Stat("s2")
	got, _ = dst.Stat("s2")
	want(got, 0o750, 1234, 5678)
	if !got.Mtime.Equal(s2.Mtime) {
		t.Errorf("s2 mtime %v, want %v", got.Mtime, s2.Mtime)
	}

	// Version 1: no ownership in the stream.
	var v1 bytes.Buffer
	w, _ := stream.NewWriter(&v1, stream.Header{Version: 1, Size: 4096, Name: "old"})
	w.Data(0, []byte("v1"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Receive(bytes.NewReader(v1.Bytes()), dst, "old", ReceiveOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ = dst.Stat("old")
	want(got, 0o600, 0, 0)

	// Overrides.
	m, u, g := uint32(0o640), uint32(42), uint32(43)
	var b bytes.Buffer
	if _, err := Send(&b, src, "s1", SendOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Receive(bytes.NewReader(b.Bytes()), dst, "mine", ReceiveOptions{Mode: &m, UID: &u, GID: &g}); err != nil {
		t.Fatal(err)
	}
	got, _ = dst.Stat("mine")
	want(got, 0o640, 42, 43)
	if _, err := Receive(bytes.NewReader(b.Bytes()), dst, "x", ReceiveOptions{UID: &u}); err != nil {
		t.Fatal(err)
	}
	got, _ = dst.Stat("x")
	want(got, 0o600, 42, 5678)
	bad := uint32(0o4755)
	if _, err := Receive(bytes.NewReader(b.Bytes()), dst, "y", ReceiveOptions{Mode: &bad}); err == nil {
		t.Error("a setuid mode was accepted")
	}
}

// TestSendLiveDisk: a writable disk of a store in use is sent as it was
// when the send began, from a hidden snapshot that is gone afterwards;
// its stream carries no identity (the received disk gets a new one), so
// nothing can later be sent incrementally from a base that no longer
// exists. Without Live the disk is read as it is.
func TestSendLiveDisk(t *testing.T) {
	src, dst := newStore(t, 96<<20), newStore(t, 96<<20)
	const size = 16 << 20
	before := randomBytes(45, size)
	mustCreateWith(t, src, "a", before, image.Attr{Mode: 0o600})
	h, _ := src.OpenDisk("a")
	defer h.Close()
	after := randomBytes(46, 4<<20)
	var b bytes.Buffer
	w := &hookWriter{w: &b, hook: func() {
		// The sender has read at most a few chunks ahead: the end of
		// the disk is still to be read.
		if _, err := h.WriteAt(after, size-int64(len(after))); err != nil {
			t.Error(err)
		}
	}}
	st, err := Send(w, src, "a", SendOptions{Live: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Snapshot {
		t.Error("a writable disk's stream says it carries a snapshot's identity")
	}
	if _, err := Receive(&b, dst, "a", ReceiveOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readDisk(t, dst, "a"), before) {
		t.Error("the received disk is not the disk as it was when the send began")
	}
	if l := src.List(); len(l) != 1 {
		t.Errorf("the sender's disks after the send: %+v", l)
	}
	got, _ := dst.Stat("a")
	if !got.Snapshot || got.UUID == ([16]byte{}) {
		t.Errorf("received: snapshot %v, uuid %x", got.Snapshot, got.UUID)
	}
	if _, ok := src.FindUUID(got.UUID); ok {
		t.Error("the received disk's identity is one the sender holds")
	}
}

// hookWriter calls hook once, before its first write.
type hookWriter struct {
	w    io.Writer
	hook func()
	done bool
}

func (h *hookWriter) Write(p []byte) (int, error) {
	if !h.done {
		h.done = true
		h.hook()
	}
	return h.w.Write(p)
}
