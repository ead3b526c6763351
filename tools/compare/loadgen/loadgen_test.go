package loadgen

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
)

func TestParseShapeDefaultJobs(t *testing.T) {
	f, err := os.Open("../default.fio")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	jobs, err := fio.ParseJobs(f)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"COMPARE_RUNTIME": "15", "COMPARE_RAMP": "2"}
	want := map[string]Shape{
		"rand-read-4k-qd32":  {Random: true, BS: 4096, Depth: 32, Runtime: 15 * time.Second, Ramp: 2 * time.Second, TimeBased: true, Seed: 1234},
		"seq-write-1m-qd1":   {Write: true, BS: 1 << 20, Depth: 1, Runtime: 15 * time.Second, Ramp: 2 * time.Second, TimeBased: true, Seed: 1234},
		"ch-write-256k-qd64": {Write: true, BS: 256 << 10, Depth: 64, Runtime: 15 * time.Second, Ramp: 2 * time.Second, TimeBased: true, Seed: 1234},
		"thin-write-1m-qd16": {Write: true, BS: 1 << 20, Depth: 16, Runtime: 15 * time.Second, Seed: 1234},
		"rand-fill-4k-qd32":  {Write: true, Random: true, BS: 4096, Depth: 32, Seed: 1234},
	}
	vhostJobs, err := fio.ParseJobFile("../jobs/vhost.fio")
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range append(jobs, vhostJobs...) {
		s, err := ParseShape(fio.Expand(j.Text, vars))
		if err != nil {
			t.Errorf("%s: %v", j.Name, err)
			continue
		}
		if w, ok := want[j.Name]; ok && s != w {
			t.Errorf("%s: got %+v, want %+v", j.Name, s, w)
		}
	}
}

func TestParseShapeRefuses(t *testing.T) {
	for _, text := range []string{
		"[j]\nrw=randrw\n",
		"[j]\nrw=write\nnumjobs=4\n",
		"[j]\nrw=write\nsize=1G\n",
		"[j]\nrw=write\nfsync=1\n",
		"[j]\nrw=write\ndirect=0\n",
		"[j]\nrw=write\nbs=1000\n",
		"[j]\nrw=write\ntime_based\n",
	} {
		if _, err := ParseShape(text); err == nil {
			t.Errorf("%q accepted", text)
		}
	}
}

// memEngine completes every request at the next Flush that waits,
// recording offsets, the most in flight, and requests submitted while an
// earlier one was not yet handed to the device.
type memEngine struct {
	offs        []int64
	writes      int
	maxInFlight int
	heldBack    int
}

type memQueue struct {
	e               *memEngine
	bufs            [][]byte
	pending, done   []int
	inFlight, depth int
	unflushed       int
}

func (e *memEngine) Open(depth, bs int) (Queue, error) {
	q := &memQueue{e: e, depth: depth}
	for range depth {
		q.bufs = append(q.bufs, make([]byte, bs))
	}
	return q, nil
}

func (q *memQueue) Buffer(slot int) []byte { return q.bufs[slot] }

func (q *memQueue) Submit(slot int, write bool, off int64) error {
	if q.unflushed > 0 {
		q.e.heldBack++
	}
	q.unflushed++
	q.pending = append(q.pending, slot)
	q.inFlight++
	q.e.maxInFlight = max(q.e.maxInFlight, q.inFlight)
	q.e.offs = append(q.e.offs, off)
	if write {
		q.e.writes++
	}
	return nil
}

func (q *memQueue) Flush(wait bool) error {
	q.unflushed = 0
	if wait {
		q.done = append(q.done, q.pending...)
		q.pending = q.pending[:0]
	}
	return nil
}

func (q *memQueue) Reap(fn func(int)) (int, error) {
	n := len(q.done)
	for _, s := range q.done {
		q.inFlight--
		fn(s)
	}
	q.done = q.done[:0]
	return n, nil
}

func (q *memQueue) Close() error { return nil }

func TestRunOnePass(t *testing.T) {
	const size, bs = 1 << 20, 4096
	for _, random := range []bool{false, true} {
		e := &memEngine{}
		res, err := Run(context.Background(), e, Shape{Write: true, Random: random, BS: bs, Depth: 8, Seed: 7}, size)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.offs) != size/bs || res.IOs != size/bs || res.Bytes != size || e.writes != size/bs {
			t.Fatalf("random=%v: %d requests, %d counted, want %d", random, len(e.offs), res.IOs, size/bs)
		}
		if e.maxInFlight != 8 {
			t.Errorf("random=%v: at most %d in flight, want 8", random, e.maxInFlight)
		}
		if e.heldBack != 0 {
			t.Errorf("random=%v: %d requests submitted while an earlier one was held back", random, e.heldBack)
		}
		sorted := slices.Sorted(slices.Values(e.offs))
		for i, off := range sorted {
			if off != int64(i*bs) {
				t.Fatalf("random=%v: block %d written at %d: not every block once", random, i, off)
			}
		}
		if !random && !slices.Equal(sorted, e.offs) {
			t.Error("sequential pass out of order")
		}
		if random && slices.Equal(sorted, e.offs) {
			t.Error("random pass in order")
		}
	}
}

func TestRunTimeBased(t *testing.T) {
	e := &memEngine{}
	res, err := Run(context.Background(), e, Shape{BS: 4096, Depth: 4, Runtime: 200 * time.Millisecond, Ramp: 100 * time.Millisecond, TimeBased: true, Seed: 1}, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if res.Elapsed != 200*time.Millisecond || res.IOs == 0 || uint64(len(e.offs)) <= res.IOs || res.Wall < 300*time.Millisecond {
		t.Fatalf("result %+v after %d requests: the ramp's requests must not count", res, len(e.offs))
	}
	// Sequential and time based: wraps at the end of the target.
	for i, off := range e.offs {
		if off != int64(i%16)*4096 {
			t.Fatalf("request %d at %d", i, off)
		}
	}
}

// TestRunFile writes a file once through io_uring and reads it back.
func TestRunFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 4<<20); err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), File{Path: path}, Shape{Write: true, BS: 64 << 10, Depth: 4, Seed: 1}, 4<<20)
	if err != nil {
		if strings.Contains(err.Error(), "invalid argument") {
			t.Skipf("no O_DIRECT here: %v", err)
		}
		t.Fatal(err)
	}
	if res.Bytes != 4<<20 {
		t.Fatalf("wrote %d bytes", res.Bytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zero := 0
	for _, c := range b {
		if c == 0 {
			zero++
		}
	}
	if zero > len(b)/64 {
		t.Errorf("%d of %d bytes zero after writing random data everywhere", zero, len(b))
	}
	if _, err := Run(context.Background(), File{Path: path}, Shape{Random: true, BS: 4096, Depth: 8, Seed: 1}, 4<<20); err != nil {
		t.Fatal(err)
	}
}
