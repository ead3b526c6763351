package telemetry

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
)

// GET /disks, GET /info, POST /check and POST /defrag on the socket
// answer what the store says of itself; the metrics handler, which the TCP listener
// serves, has none of them.
func TestCatalogThroughSocket(t *testing.T) {
	src := newSource(t)
	if _, err := src.s.Snapshot("vm.raw", "vm-snap"); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	serveSource(t, src, mnt, "")
	disks, err := List(mnt)
	if err != nil {
		t.Fatal(err)
	}
	want := src.s.List()
	if len(disks) != len(want) {
		t.Fatalf("List: %+v, want %+v", disks, want)
	}
	for i, d := range disks {
		w := want[i]
		if d.Name != w.Name || d.ID != w.ID || d.Size != w.Size || d.Allocated != w.Allocated || d.Shared != w.Shared ||
			d.Snapshot != w.Snapshot || d.Origin != w.Origin || d.Mode != w.Mode || !d.Mtime.Equal(w.Mtime) || d.UUID != w.UUID {
			t.Errorf("List[%d] = %+v, want %+v", i, d, w)
		}
	}
	in, err := Info(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if wi := src.s.Info(); in.Info.UUID != wi.UUID || in.Info.Disks != 2 || in.Info.BlockSize != wi.BlockSize ||
		in.Info.CapacityBytes != wi.CapacityBytes || in.Version != src.s.Version() || in.Version != 2 {
		t.Errorf("Info: %+v, want %+v version %d", in, wi, src.s.Version())
	}
	rep, err := Check(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Clean() || rep.Disks != 2 || rep.MappedBlocks == 0 || rep.DataBlocks == 0 {
		t.Errorf("Check: %+v", rep)
	}
	res, err := Defrag(mnt, "vm.raw")
	if err != nil || res.Name != "vm.raw" || res.Skipped != image.DefragContiguous || res.MappedBytes != 4<<20 {
		t.Errorf("Defrag: %+v, %v", res, err)
	}
	if _, err := Defrag(mnt, "none.raw"); !errors.Is(err, image.ErrNotExist) || !strings.Contains(err.Error(), "none.raw") {
		t.Errorf("Defrag of a missing disk: %v", err)
	}
	for _, path := range []string{"/disks", "/info", "/check", "/defrag?disk=vm.raw"} {
		rec := httptest.NewRecorder()
		method := http.MethodGet
		if path != "/disks" && path != "/info" {
			method = http.MethodPost
		}
		Handler(src, mnt, "").ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		if rec.Code == http.StatusOK {
			t.Errorf("the metrics handler served %s %s", method, path)
		}
	}
	if _, err := List(filepath.Join(t.TempDir(), "elsewhere")); !errors.Is(err, ErrNotServing) {
		t.Errorf("List through a mount point nobody serves: %v", err)
	}
}

// A finding travels through the socket with its severity, code and disk.
func TestCheckReportRoundTrip(t *testing.T) {
	rep := &image.Report{Findings: []image.Finding{{Severity: image.Leak, Code: "leak", Message: "3 blocks"},
		{Severity: image.Fatal, Code: "x", Disk: "vm.raw", Message: "bad"}}, Disks: 1}
	rec := httptest.NewRecorder()
	writeJSON(rec, http.StatusOK, rep)
	var got image.Report
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Findings) != 2 || got.Findings[0] != rep.Findings[0] || got.Findings[1] != rep.Findings[1] || got.Disks != 1 ||
		!got.Fatal() {
		t.Errorf("report %+v, want %+v", got, rep)
	}
}
