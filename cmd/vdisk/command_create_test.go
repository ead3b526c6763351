package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCreate(t *testing.T) {
	store := newStore(t)
	r := mustRun(t, "create", store, "vm1.raw", "20G")
	if r.stdout != "created vm1.raw: 20 GiB\n" {
		t.Errorf("output %q", r.stdout)
	}
	mustRun(t, "create", "--mode", "0600", store, "vm2.raw", "1000")
	d := diskByName(t, store, "vm1.raw")
	if d.Size != 20<<30 || d.Allocated != 0 || d.Extents != 0 || d.Mode != "0644" || d.UID != uint32(os.Getuid()) {
		t.Errorf("vm1.raw: %+v", d)
	}
	if d := diskByName(t, store, "vm2.raw"); d.Size != 1000 || d.Mode != "0600" {
		t.Errorf("vm2.raw: %+v", d)
	}
}

func TestCreateErrors(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	wantFail(t, exitFailure, []string{"already exists"}, "create", store, "a.raw", "1M")
	wantFail(t, exitFailure, []string{"unknown suffix"}, "create", store, "b.raw", "1Z")
	wantFail(t, exitFailure, []string{"negative"}, "create", store, "b.raw", "--", "-1")
	wantFail(t, exitFailure, []string{"too large"}, "create", store, "b.raw", "8E")
	wantFail(t, exitFailure, []string{"invalid disk name"}, "create", store, "a/b", "1M")
	wantFail(t, exitFailure, []string{"invalid disk name"}, "create", store, strings.Repeat("x", 256), "1M")
	wantFail(t, exitFailure, []string{"no such file"}, "create", filepath.Join(t.TempDir(), "none.img"), "a.raw", "1M")
	notStore := filepath.Join(t.TempDir(), "zeros.img")
	writeFile(t, notStore, make([]byte, 1<<20))
	wantFail(t, exitFailure, []string{"not a vdiskfs store"}, "create", notStore, "a.raw", "1M")
	if ds := listDisks(t, store); len(ds) != 1 {
		t.Errorf("disks after failed creates: %+v", ds)
	}
}
