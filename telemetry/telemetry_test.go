package telemetry

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ncw/directio"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// storeSource is a Source over a real store on the memory backend.
type storeSource struct {
	s   *image.Store
	ops map[string]image.HistogramSnapshot
}

func (s storeSource) Metrics() image.Metrics                        { return s.s.Metrics() }
func (s storeSource) OpMetrics() map[string]image.HistogramSnapshot { return s.ops }
func (s storeSource) Sync() error                                   { return s.s.Commit() }
func (s storeSource) Stat(name string) (image.DiskInfo, error)      { return s.s.Stat(name) }
func (s storeSource) Snapshot(disk, name string) (image.DiskInfo, error) {
	return s.s.Snapshot(disk, name)
}
func (s storeSource) Clone(disk, name string) (image.DiskInfo, error) {
	return s.s.Clone(disk, name)
}
func (s storeSource) Diff(old, new string) ([]image.Change, image.DiffStats, error) {
	od, err := s.s.OpenDisk(old)
	if err != nil {
		return nil, image.DiffStats{}, err
	}
	defer od.Close()
	nd, err := s.s.OpenDisk(new)
	if err != nil {
		return nil, image.DiffStats{}, err
	}
	defer nd.Close()
	return image.Diff(od, nd)
}
func (s storeSource) Send(w io.Writer, disk, from string) (transfer.Stats, error) {
	return transfer.Send(w, s.s, disk, transfer.SendOptions{From: from, Live: true})
}
func (s storeSource) Receive(r io.Reader, name string, o transfer.ReceiveOptions) (transfer.Stats, error) {
	return transfer.Receive(r, s.s, name, o)
}
func (s storeSource) List() []image.DiskInfo { return s.s.List() }
func (s storeSource) Info() image.Info       { return s.s.Info() }
func (s storeSource) Version() int           { return s.s.Version() }
func (s storeSource) Check() *image.Report   { return s.s.Check() }
func (s storeSource) Defrag(name string) (image.DefragResult, error) {
	return s.s.Defrag(name, nil)
}

func newSource(t *testing.T) storeSource {
	mem := backend.NewMem(64 << 20)
	if err := image.Format(mem, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(mem, image.Options{CommitInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Create("vm.raw", 0, image.Attr{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	d, _ := s.OpenDisk("vm.raw")
	buf := directio.AlignedBlock(1 << 20)
	for i := int64(0); i < 4; i++ {
		d.WriteAt(buf, i<<20)
	}
	d.Close()
	h := image.NewLatencyHistogram()
	h.ObserveDuration(300 * time.Microsecond)
	h.ObserveDuration(2 * time.Millisecond)
	return storeSource{s: s, ops: map[string]image.HistogramSnapshot{"WRITE": h.Snapshot()}}
}

// The exported metrics are the store's counters: 4 writes of 1 MiB are 4
// requests, 4 backend writes of 1 MiB each.
func TestCollector(t *testing.T) {
	src := newSource(t)
	c := NewCollector(src)
	if n := testutil.CollectAndCount(c); n < 30 {
		t.Fatalf("%d metrics collected", n)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	checks := []struct {
		name, label string
		want        float64
	}{
		{"vdiskfs_requests_total", "write", 4},
		{"vdiskfs_requests_total", "read", 0},
		{"vdiskfs_request_bytes_total", "write", 4 << 20},
		{"vdiskfs_backend_ios_total", "data_write", 4},
		{"vdiskfs_backend_bytes_total", "data_write", 4 << 20},
		{"vdiskfs_disk_allocated_bytes", "vm.raw", 4 << 20},
		{"vdiskfs_coalesce_runs_total", "", 4},
		{"vdiskfs_map_allocations_total", "", 4},
	}
	for _, c := range checks {
		if got := gathered(t, reg, c.name, c.label); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.label, got, c.want)
		}
	}
}

// gathered returns the value of the metric called name whose first label
// has value label ("" for no labels): a counter or gauge value, or a
// histogram's sample count.
func gathered(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no metric %s{%s}", name, label)
	return 0
}

// The stats socket answers /stats with JSON and /metrics with Prometheus
// text; Fetch reads it by mount point.
func TestServeAndFetch(t *testing.T) {
	src := newSource(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	serveSource(t, src, mnt, "127.0.0.1:0")
	st, err := Fetch(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if st.Metrics.Counters.WriteRequests != 4 || st.Store != "store.img" || st.FUSE["WRITE"].Count != 2 {
		t.Fatalf("stats: write requests %d, store %q, fuse %v", st.Metrics.Counters.WriteRequests, st.Store, st.FUSE)
	}
	if _, err := Fetch(filepath.Join(t.TempDir(), "elsewhere")); err == nil {
		t.Fatal("Fetch of a mount point nobody serves succeeded")
	}
	// POST /sync commits, on the socket only: the TCP listener's
	// handler has no such request.
	if err := Sync(mnt); err != nil {
		t.Fatal(err)
	}
	if n := src.s.Counters().Commits; n != 1 {
		t.Errorf("after Sync: %d commits, want 1", n)
	}
	rec := httptest.NewRecorder()
	Handler(src, mnt, "").ServeHTTP(rec, httptest.NewRequest("POST", "/sync", nil))
	if rec.Code == http.StatusNoContent {
		t.Error("the metrics handler served POST /sync")
	}
	if err := Sync(filepath.Join(t.TempDir(), "elsewhere")); err == nil {
		t.Fatal("Sync of a mount point nobody serves succeeded")
	}
}

// POST /snapshot on the socket makes a durable read-only snapshot; its
// errors keep their meaning (errors.Is) and the daemon's words; the
// metrics handler, which the TCP listener serves, has no such request.
func TestSnapshotThroughSocket(t *testing.T) {
	src := newSource(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	serveSource(t, src, mnt, "")
	commits := src.s.Counters().Commits
	rep, err := Snapshot(mnt, "vm.raw", "vm-snap")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Name != "vm-snap" || rep.Origin != "vm.raw" || rep.Size != 4<<20 || rep.ID == 0 {
		t.Errorf("reply %+v", rep)
	}
	if info, err := src.s.Stat("vm-snap"); err != nil || !info.Snapshot || info.Origin != "vm.raw" || info.Shared != 4<<20 {
		t.Errorf("the snapshot: %+v, %v", info, err)
	}
	if src.s.Counters().Commits == commits {
		t.Error("the snapshot was not committed when the reply came")
	}
	for _, c := range []struct {
		disk, name string
		is         error
		msg        string
	}{
		{"vm.raw", "vm-snap", image.ErrExist, "already exists"},
		{"none.raw", "x", image.ErrNotExist, "no such disk"},
		{"vm.raw", "a/b", image.ErrInvalidName, "invalid disk name"},
	} {
		_, err := Snapshot(mnt, c.disk, c.name)
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), c.disk) {
			t.Errorf("snapshot %s as %s: %v; want %v saying %q", c.disk, c.name, err, c.is, c.msg)
		}
	}
	rec := httptest.NewRecorder()
	Handler(src, mnt, "").ServeHTTP(rec, httptest.NewRequest("POST", "/snapshot", strings.NewReader(`{"disk":"vm.raw","name":"tcp"}`)))
	if rec.Code == http.StatusCreated {
		t.Error("the metrics handler served POST /snapshot")
	}
	if _, err := src.s.Stat("tcp"); err == nil {
		t.Error("the metrics handler made a snapshot")
	}
	if _, err := Snapshot(filepath.Join(t.TempDir(), "elsewhere"), "vm.raw", "x"); !errors.Is(err, ErrNotServing) {
		t.Errorf("snapshot through a mount point nobody serves: %v", err)
	}
}

func TestMetricsEndpointLoopbackOnly(t *testing.T) {
	src := newSource(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if _, err := Serve(Handler(src, mnt, ""), src, mnt, "0.0.0.0:0", false); err == nil {
		t.Fatal("metrics on 0.0.0.0 accepted without allowRemote")
	}
	for _, ok := range []string{"127.0.0.1:1", "[::1]:1", "localhost:1"} {
		if err := requireLoopback(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// The Prometheus text endpoint includes the FUSE latency histograms.
func TestMetricsText(t *testing.T) {
	src := newSource(t)
	rec := httptest.NewRecorder()
	Handler(src, "/m", "").ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body := rec.Body.String(); !strings.Contains(body, `vdiskfs_fuse_request_latency_seconds_count{op="WRITE"} 2`) {
		t.Fatalf("metrics text lacks the FUSE latency histogram:\n%s", body)
	}
}

// A daemon that stops after another one took over its mount point (the
// next mount, started as soon as the store's lock was free) leaves the
// newer socket alone.
func TestStopLeavesTheNextMountsSocket(t *testing.T) {
	src := newSource(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	stopOld, err := Serve(Handler(src, mnt, "old"), src, mnt, "", false)
	if err != nil {
		t.Fatal(err)
	}
	stopNew, err := Serve(Handler(src, mnt, "new"), src, mnt, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer stopNew()
	stopOld()
	stopOld() // again: nothing
	st, err := Fetch(mnt)
	if err != nil {
		t.Fatalf("after the old daemon stopped, the new one's socket is gone: %v", err)
	}
	if st.Store != "new" {
		t.Fatalf("stats from store %q, want the new mount's", st.Store)
	}
}

// serveSource serves src's stats and requests on the socket of mnt (and on
// metricsAddr, when not empty) until the test ends.
func serveSource(t *testing.T, src storeSource, mnt, metricsAddr string) {
	t.Helper()
	stop, err := Serve(Handler(src, mnt, "store.img"), src, mnt, metricsAddr, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}
