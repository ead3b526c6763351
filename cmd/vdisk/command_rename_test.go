package main

import (
	"testing"
)

func TestRename(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	mustRun(t, "create", store, "b.raw", "2M")
	if r := mustRun(t, "rename", store, "a.raw", "c.raw"); r.stdout != "renamed a.raw to c.raw\n" {
		t.Errorf("output %q", r.stdout)
	}
	// An existing target is kept unless --force.
	wantFail(t, exitFailure, []string{"already exists", "--force"}, "rename", store, "c.raw", "b.raw")
	mustRun(t, "rename", "--force", store, "c.raw", "b.raw")
	ds := listDisks(t, store)
	if len(ds) != 1 || ds[0].Name != "b.raw" || ds[0].Size != 1<<20 {
		t.Errorf("after rename: %+v", ds)
	}
	mustRun(t, "rename", store, "b.raw", "b.raw")
}

func TestRenameErrors(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	wantFail(t, exitFailure, []string{"no such disk"}, "rename", store, "x.raw", "y.raw")
	wantFail(t, exitFailure, []string{"invalid disk name"}, "rename", store, "a.raw", "..")
	wantFail(t, exitFailure, []string{"takes 3 arguments"}, "rename", store, "a.raw")
}
