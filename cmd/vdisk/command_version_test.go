package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
)

func TestVersion(t *testing.T) {
	out := mustRun(t, "--version").stdout
	for _, want := range []string{"vdisk ", "revision ", runtime.Version(), "writes version 1 (2 once a store shares blocks), reads versions 1, 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("--version lacks %q:\n%s", want, out)
		}
	}
	if got := mustRun(t, "version").stdout; got != out {
		t.Errorf("vdisk version says\n%s\nvdisk --version says\n%s", got, out)
	}
	var vi versionInfo
	if err := json.Unmarshal([]byte(mustRun(t, "version", "--json").stdout), &vi); err != nil {
		t.Fatal(err)
	}
	if vi.Version == "" || vi.Revision == "" || vi.GoVersion != runtime.Version() || vi.FormatWritten != 1 || len(vi.FormatsRead) != 3 {
		t.Errorf("version --json: %+v", vi)
	}
}

// The format versions vdisk version states are the store's: a new store's
// superblocks carry formatVersionWritten (FORMAT.md: u32 at byte 8 of each
// copy), and a store claiming the next version is refused as unsupported.
func TestVersionFormatMatchesStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.img")
	mustRun(t, "format", path, "--size", "64M")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int{0, 4096} {
		if v := binary.LittleEndian.Uint32(b[off+8:]); v != formatVersionWritten {
			t.Fatalf("superblock at %d: format version %d, vdisk version says %d", off, v, formatVersionWritten)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	next := make([]byte, 4)
	binary.LittleEndian.PutUint32(next, uint32(formatVersionsRead[len(formatVersionsRead)-1]+1))
	for _, off := range []int64{0, 4096} {
		if _, err := f.WriteAt(next, off+8); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	_, err = image.OpenPath(path, image.Options{ReadOnly: true, CommitInterval: -1})
	if !errors.Is(err, image.ErrVersion) {
		t.Fatalf("a store of format version %d opened: %v", formatVersionsRead[len(formatVersionsRead)-1]+1, err)
	}
}
