package main

import (
	"encoding/json"
	"testing"
)

func TestRm(t *testing.T) {
	store := newStore(t)
	for _, n := range []string{"a.raw", "b.raw", "c.raw"} {
		mustRun(t, "create", store, n, "1M")
	}
	if r := mustRun(t, "rm", store, "a.raw", "c.raw"); r.stdout != "removed a.raw\nremoved c.raw\n" {
		t.Errorf("output %q", r.stdout)
	}
	if ds := listDisks(t, store); len(ds) != 1 || ds[0].Name != "b.raw" {
		t.Errorf("left: %+v", ds)
	}
}

func TestRmFreesSpace(t *testing.T) {
	store := newStore(t)
	free := func() int64 {
		var in infoJSON
		if err := json.Unmarshal([]byte(mustRun(t, "info", "--json", store).stdout), &in); err != nil {
			t.Fatal(err)
		}
		return in.Free
	}
	before := free()
	src := t.TempDir() + "/src"
	writeFile(t, src, randomBytes(2<<20, 1))
	mustRun(t, "import", store, "a.raw", src)
	if f := free(); before-f < 2<<20 {
		t.Errorf("import used %d bytes", before-f)
	}
	mustRun(t, "rm", store, "a.raw")
	if f := free(); f < before-64<<10 { // the checkpoint may have grown a little
		t.Errorf("free after rm %d, before import %d", f, before)
	}
}

func TestRmErrors(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	// An unknown name is reported; the others are still removed.
	r := wantFail(t, exitFailure, []string{`"nope.raw"`, "no such disk"}, "rm", store, "nope.raw", "a.raw")
	if r.stdout != "removed a.raw\n" {
		t.Errorf("output %q", r.stdout)
	}
	if ds := listDisks(t, store); len(ds) != 0 {
		t.Errorf("left: %+v", ds)
	}
}
