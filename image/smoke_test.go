package image

import (
	"bytes"
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
	got := make([]byte, len(data)+2000)
	n, err := d.ReadAt(got, 0)
	t.Logf("read %d %v size %d info %+v", n, err, d.Size(), d.Stat())
	if !bytes.Equal(got[1000:1000+len(data)], data) || !bytes.Equal(got[:1000], make([]byte, 1000)) {
		t.Fatal("mismatch")
	}
	d.Close()
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
	d, _ = s.OpenDisk("a.raw")
	got2 := make([]byte, len(data))
	d.ReadAt(got2, 1000)
	if !bytes.Equal(got2, data) {
		t.Fatal("mismatch after reopen")
	}
	t.Logf("counters %+v info %+v", s.Counters(), s.Info())
}
