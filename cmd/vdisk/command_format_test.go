package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "s.img")
	r := mustRun(t, "format", store, "--size", "64M", "--block-size", "64K", "--journal-size", "2M")
	if !strings.Contains(r.stdout, "formatted "+store) || !strings.Contains(r.stdout, "64 KiB") {
		t.Errorf("output: %q", r.stdout)
	}
	st, err := os.Stat(store)
	if err != nil || st.Size() != 64<<20 {
		t.Fatalf("store file: %v %v", st, err)
	}
	var in infoJSON
	if err := json.Unmarshal([]byte(mustRun(t, "info", "--json", store).stdout), &in); err != nil {
		t.Fatal(err)
	}
	if in.BlockSize != 64<<10 || in.JournalSize != 2<<20 || in.StoreSize != 64<<20 || in.Disks != 0 {
		t.Errorf("info after format: %+v", in)
	}

	// An existing store is kept unless --force.
	mustRun(t, "create", store, "a.raw", "1M")
	wantFail(t, exitFailure, []string{"already holds a vdiskfs store with 1 disk(s)", "--force"}, "format", store)
	if ds := listDisks(t, store); len(ds) != 1 {
		t.Fatalf("refused format changed the store: %+v", ds)
	}
	// --size must match an existing file.
	wantFail(t, exitFailure, []string{"already exists"}, "format", "--force", "--size", "128M", store)
	mustRun(t, "format", "--force", "--size", "64M", store)
	if ds := listDisks(t, store); len(ds) != 0 {
		t.Fatalf("store not reformatted: %+v", ds)
	}
	checkStore(t, store)
}

func TestFormatExistingFile(t *testing.T) {
	// A file that is not a store (here: all zeros) is formatted without --force.
	store := filepath.Join(t.TempDir(), "s.img")
	if err := os.WriteFile(store, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(store, 32<<20); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "format", store)
	checkStore(t, store)
}

func TestFormatErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "new.img")
	wantFail(t, exitFailure, []string{"does not exist: give --size"}, "format", missing)
	wantFail(t, exitFailure, []string{"multiple of 4 KiB"}, "format", "--size", "1000", missing)
	wantFail(t, exitFailure, []string{"unknown suffix"}, "format", "--size", "10Q", missing)
	wantFail(t, exitFailure, []string{"block size"}, "format", "--size", "64M", "--block-size", "3K", missing)
	wantFail(t, exitFailure, []string{"largest block size"}, "format", "--size", "64M", "--block-size", "1T", missing)
	tiny := filepath.Join(dir, "tiny.img")
	wantFail(t, exitFailure, []string{"too small"}, "format", "--size", "64K", tiny)
	if _, err := os.Stat(tiny); !os.IsNotExist(err) {
		t.Errorf("failed format left %s behind: %v", tiny, err)
	}
	wantFail(t, exitFailure, []string{"no such file"}, "format", "--size", "64M", filepath.Join(dir, "nodir", "s.img"))

	// A store open elsewhere is refused, with or without --force.
	store := newStore(t)
	lockStore(t, store)
	wantFail(t, exitFailure, []string{"in use", "locked", "vdisk test"}, "format", store)
	wantFail(t, exitFailure, []string{"in use", "locked", "vdisk test"}, "format", "--force", store)
}
