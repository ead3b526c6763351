package main

import (
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/telemetry"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// statsSource serves a store's metrics the way a mount does, without FUSE.
type statsSource struct{ s *image.Store }

func (s statsSource) Metrics() image.Metrics                        { return s.s.Metrics() }
func (s statsSource) OpMetrics() map[string]image.HistogramSnapshot { return nil }
func (s statsSource) Sync() error                                   { return s.s.Commit() }
func (s statsSource) Stat(name string) (image.DiskInfo, error)      { return s.s.Stat(name) }
func (s statsSource) Snapshot(disk, name string) (image.DiskInfo, error) {
	return s.s.Snapshot(disk, name)
}
func (s statsSource) Clone(disk, name string) (image.DiskInfo, error) {
	return s.s.Clone(disk, name)
}
func (s statsSource) Diff(old, new string) ([]image.Change, image.DiffStats, error) {
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
func (s statsSource) Send(w io.Writer, disk, from string) (transfer.Stats, error) {
	return transfer.Send(w, s.s, disk, transfer.SendOptions{From: from, Live: true})
}
func (s statsSource) Receive(r io.Reader, name string, o transfer.ReceiveOptions) (transfer.Stats, error) {
	return transfer.Receive(r, s.s, name, o)
}
func (s statsSource) List() []image.DiskInfo { return s.s.List() }
func (s statsSource) Info() image.Info       { return s.s.Info() }
func (s statsSource) Version() int           { return s.s.Version() }
func (s statsSource) Check() *image.Report   { return s.s.Check() }
func (s statsSource) Defrag(name string) (image.DefragResult, error) {
	return s.s.Defrag(name, nil)
}

// serveFakeMount formats a memory store, writes 8 × 1 MiB to a disk and
// serves its telemetry for the mount point mnt.
func serveFakeMount(t *testing.T) (mnt string, s *image.Store) {
	mem := backend.NewMem(64 << 20)
	if err := image.Format(mem, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(mem, image.Options{CommitInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.Create("vm.raw", 0, image.Attr{Mode: 0o644})
	d, _ := s.OpenDisk("vm.raw")
	defer d.Close()
	buf := directio.AlignedBlock(1 << 20)
	for i := int64(0); i < 8; i++ {
		if _, err := d.WriteAt(buf, i<<20); err != nil {
			t.Fatal(err)
		}
	}
	mnt = filepath.Join(t.TempDir(), "mnt")
	stop, err := telemetry.Serve(telemetry.Handler(statsSource{s}, mnt, "mem"), statsSource{s}, mnt, "", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return mnt, s
}

func TestStats(t *testing.T) {
	mnt, _ := serveFakeMount(t)
	out := mustRun(t, "stats", mnt).stdout
	for _, want := range []string{"average request in: read -, write 1 MiB", "average backend I/O out: read -, write 1 MiB", "vm.raw", "pieces→runs"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats output lacks %q:\n%s", want, out)
		}
	}
	var st telemetry.Stats
	if err := json.Unmarshal([]byte(mustRun(t, "stats", "--json", mnt).stdout), &st); err != nil {
		t.Fatal(err)
	}
	if st.Metrics.Counters.WriteRequests != 8 || st.Metrics.Counters.DataWrites != 8 {
		t.Fatalf("json: %+v", st.Metrics.Counters)
	}
	watch := mustRun(t, "stats", mnt, "--watch", "0.05", "--count", "2").stdout
	if lines := strings.Count(watch, "\n"); lines != 3 {
		t.Fatalf("--watch --count 2 printed %d lines:\n%s", lines, watch)
	}
	wantFail(t, exitFailure, []string{"no vdiskfs mount is serving"}, "stats", t.TempDir())
}
