package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
)

// TestSendReceive: a complete and an incremental stream between two stores
// through files, diff of the snapshots, and damaged streams refused with
// nothing left behind.
func TestSendReceive(t *testing.T) {
	src, dst := newStore(t), newStore(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	writeFile(t, img, randomBytes(8<<20, 1))
	mustRun(t, "import", src, "a.raw", img)
	mustRun(t, "snapshot", src, "a.raw", "s1")

	full := mustRun(t, "send", src, "s1").stdout
	fullPath := filepath.Join(dir, "s1.stream")
	writeFile(t, fullPath, []byte(full))
	r := mustRun(t, "receive", dst, "s1", fullPath)
	if !strings.Contains(r.stdout, "received s1 (complete stream)") {
		t.Errorf("receive says %q", r.stdout)
	}

	// Change 1 MiB and punch 1 MiB through the image API, snapshot s2.
	s, err := image.OpenPath(src, image.Options{CommitInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	h, _ := s.OpenDisk("a.raw")
	h.WriteAt(randomBytes(1<<20, 2), 3<<20)
	h.Punch(6<<20, 1<<20)
	h.Close()
	s.Close()
	mustRun(t, "snapshot", src, "a.raw", "s2")

	var diff []diffEntry
	if err := json.Unmarshal([]byte(mustRun(t, "diff", "--json", src, "s1", "s2").stdout), &diff); err != nil {
		t.Fatal(err)
	}
	want := []diffEntry{{Offset: 3 << 20, Length: 1 << 20, Kind: "data"}, {Offset: 6 << 20, Length: 1 << 20, Kind: "zero"}}
	if len(diff) != 2 || diff[0] != want[0] || diff[1] != want[1] {
		t.Errorf("diff s1 s2: %+v, want %+v", diff, want)
	}
	if out := mustRun(t, "diff", src, "s1", "s2").stdout; !strings.Contains(out, "no data read") {
		t.Errorf("diff: %s", out)
	}

	inc := mustRun(t, "send", src, "s2", "--from", "s1").stdout
	if len(inc) > (1<<20)+(64<<10) {
		t.Errorf("incremental stream of %d bytes for 1 MiB changed", len(inc))
	}
	incPath := filepath.Join(dir, "s2.stream")
	writeFile(t, incPath, []byte(inc))
	mustRun(t, "receive", dst, "s2", incPath)
	for _, name := range []string{"s1", "s2"} {
		a, b := filepath.Join(dir, name+".src"), filepath.Join(dir, name+".dst")
		mustRun(t, "export", src, name, a)
		mustRun(t, "export", dst, name, b)
		x, _ := os.ReadFile(a)
		y, _ := os.ReadFile(b)
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between the stores", name)
		}
	}

	// Damaged: cut, flipped, and an incremental stream without its base.
	other := newStore(t)
	cut := filepath.Join(dir, "cut.stream")
	writeFile(t, cut, []byte(full[:len(full)/2]))
	flipped := []byte(full)
	flipped[len(flipped)/3] ^= 1
	flip := filepath.Join(dir, "flip.stream")
	writeFile(t, flip, flipped)
	for path, msg := range map[string]string{cut: "cut short", flip: "corrupt", incPath: "does not hold"} {
		wantFail(t, exitFailure, []string{msg}, "receive", other, "x", path)
	}
	if ds := listDisks(t, other); len(ds) != 0 {
		t.Errorf("damaged streams left disks: %+v", ds)
	}
	mustRun(t, "fsck", other)
}
