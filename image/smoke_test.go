package image

import (
	"bytes"
	"io"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

func TestSmoke(t *testing.T) {
	mem := backend.NewMem(64 << 20)
	if err := Format(mem, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(mem, Options{CommitInterval: -1, Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("a.raw", 0, Attr{Mode: 0644}); err != nil {
		t.Fatal(err)
	}
	d, err := s.OpenDisk("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("hello world!"), 100000)
	if _, err := d.WriteAt(data, 1000); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	// The disk grew to the write's end: a read of more stops there.
	got := make([]byte, len(data)+2000)
	n, err := d.ReadAt(got, 0)
	if n != 1000+len(data) || err != io.EOF || d.Size() != int64(1000+len(data)) {
		t.Fatalf("read %d bytes (%v) of a disk of %d, want %d and io.EOF", n, err, d.Size(), 1000+len(data))
	}
	if !bytes.Equal(got[1000:1000+len(data)], data) || !bytes.Equal(got[:1000], make([]byte, 1000)) {
		t.Fatal("mismatch")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatal(rep.Findings)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(backend.NewMemFrom(mem.Bytes()), Options{CommitInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err = s.OpenDisk("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got2 := make([]byte, len(data))
	if n, err := d.ReadAt(got2, 1000); n != len(data) || err != nil {
		t.Fatalf("read after reopen: %d bytes, %v", n, err)
	}
	if !bytes.Equal(got2, data) {
		t.Fatal("mismatch after reopen")
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatal(rep.Findings)
	}
}
