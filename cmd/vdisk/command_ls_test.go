package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLs(t *testing.T) {
	store := newStore(t)
	if r := mustRun(t, "ls", store); r.stdout != "NAME  SIZE  ALLOCATED  EXCLUSIVE  SHARED  EXTENTS  AVG-EXTENT  MODIFIED  ORIGIN\n" {
		t.Errorf("empty store: %q", r.stdout)
	}
	if r := mustRun(t, "ls", "--json", store); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("empty store json: %q", r.stdout)
	}
	before := time.Now().Add(-time.Second)
	for _, name := range []string{"zeta.raw", "alpha.raw", "mid.raw"} {
		mustRun(t, "create", store, name, "3M")
	}
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, []byte(strings.Repeat("x", 10000)))
	mustRun(t, "import", store, "data.raw", src)

	lines := strings.Split(strings.TrimSpace(mustRun(t, "ls", store).stdout), "\n")
	if len(lines) != 5 {
		t.Fatalf("ls: %q", lines)
	}
	if f := strings.Fields(lines[0]); strings.Join(f, " ") != "NAME SIZE ALLOCATED EXCLUSIVE SHARED EXTENTS AVG-EXTENT MODIFIED ORIGIN" {
		t.Errorf("header %q", lines[0])
	}
	var names []string
	for _, l := range lines[1:] {
		names = append(names, strings.Fields(l)[0])
	}
	if got := strings.Join(names, " "); got != "alpha.raw data.raw mid.raw zeta.raw" {
		t.Errorf("order: %s", got)
	}
	// data.raw: 9.8 KiB in 12 KiB, all its own, one extent, no origin.
	if f := strings.Fields(lines[2]); f[1]+f[2] != "9.8KiB" || f[3]+f[4] != "12KiB" || f[5]+f[6] != "12KiB" || f[7]+f[8] != "0B" ||
		f[9] != "1" || f[10]+f[11] != "12KiB" || f[len(f)-1] != "-" {
		t.Errorf("data.raw line: %q", lines[2])
	}
	if f := strings.Fields(strings.Split(mustRun(t, "ls", "--bytes", store).stdout, "\n")[1]); f[0] != "alpha.raw" || f[1] != "3145728" {
		t.Errorf("ls --bytes: %q", f)
	}

	ds := listDisks(t, store)
	if len(ds) != 4 || ds[1].Name != "data.raw" || ds[1].Size != 10000 || ds[1].Allocated != 12288 || ds[1].Extents != 1 || ds[1].AvgExtent != 12288 ||
		ds[1].Exclusive != 12288 || ds[1].Shared != 0 || ds[1].Snapshot || ds[1].Clone || ds[1].Origin != "" {
		t.Fatalf("ls --json: %+v", ds)
	}
	if m := ds[0].Modified; m.Before(before) || m.After(time.Now()) {
		t.Errorf("modified %v", m)
	}
}

func TestLsErrors(t *testing.T) {
	wantFail(t, exitFailure, []string{"no such file"}, "ls", filepath.Join(t.TempDir(), "none.img"))
	wantFail(t, exitFailure, []string{"takes 1 arguments"}, "ls", "a", "b")
}
