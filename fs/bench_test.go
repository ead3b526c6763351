package fs

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkBufferedOpen measures what buffered (non-O_DIRECT) opens get
// from direct_io (FOPEN_DIRECT_IO|FOPEN_PARALLEL_DIRECT_WRITES, the choice)
// against the kernel page cache (FOPEN_KEEP_CACHE), with the tools that
// open disks that way: cp, dd, qemu-img convert, and small random reads.
// Two stores are mounted side by side, one per mode, and every iteration
// runs the workload on both in alternating order, so that load from other
// processes hits both alike. Each sub-benchmark reports MB/s per mode.
//
//	go test -run XXX -bench BufferedOpen -benchtime 5x ./fs
func BenchmarkBufferedOpen(b *testing.B) {
	const size = 256 << 20
	type mode struct {
		name string
		tc   *testCase
	}
	modes := []mode{
		{"directio", newTestCase(b)},
		{"pagecache", newTestCase(b, withMountOptions(Options{pageCache: true}))},
	}
	src := filepath.Join(modes[0].tc.dir, "src.raw")
	writeRandomFile(b, src, size, 1)
	for _, m := range modes {
		run(b, "cp", src, m.tc.path("r.raw"))
	}
	exe := func(b *testing.B, name string, args ...string) {
		b.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			b.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	dropCache := func(b *testing.B, path string) {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			b.Fatal(err)
		}
	}
	preads := func(b *testing.B, path string, seed uint64) {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 4096)
		r := rand.New(rand.NewPCG(seed, 1))
		for range 4096 {
			if _, err := f.ReadAt(buf, r.Int64N(64<<20/4096)*4096); err != nil {
				b.Fatal(err)
			}
		}
	}
	workloads := []struct {
		name  string
		bytes int64
		prep  func(b *testing.B, tc *testCase) // untimed
		run   func(b *testing.B, tc *testCase, i int)
	}{
		{"cp-in", size, nil, func(b *testing.B, tc *testCase, i int) { exe(b, "cp", src, tc.path("w.raw")) }},
		{"dd-write-128K", size, nil, func(b *testing.B, tc *testCase, i int) {
			exe(b, "dd", "if="+src, "of="+tc.path("w.raw"), "bs=128K", "conv=notrunc", "status=none")
		}},
		{"qemu-img-convert", size, nil, func(b *testing.B, tc *testCase, i int) {
			exe(b, "qemu-img", "convert", "-O", "raw", src, tc.path("q.raw"))
		}},
		{"qemu-img-convert-W", size, nil, func(b *testing.B, tc *testCase, i int) {
			exe(b, "qemu-img", "convert", "-W", "-O", "raw", src, tc.path("q.raw"))
		}},
		{"dd-read-cold-128K", size, func(b *testing.B, tc *testCase) { dropCache(b, tc.path("r.raw")) }, func(b *testing.B, tc *testCase, i int) {
			exe(b, "dd", "if="+tc.path("r.raw"), "of=/dev/null", "bs=128K", "status=none")
		}},
		{"dd-read-cold-1M", size, func(b *testing.B, tc *testCase) { dropCache(b, tc.path("r.raw")) }, func(b *testing.B, tc *testCase, i int) {
			exe(b, "dd", "if="+tc.path("r.raw"), "of=/dev/null", "bs=1M", "status=none")
		}},
		{"dd-read-again-1M", size, nil, func(b *testing.B, tc *testCase, i int) {
			exe(b, "dd", "if="+tc.path("r.raw"), "of=/dev/null", "bs=1M", "status=none")
		}},
		{"pread-4K-random-64M", 4096 * 4096, nil, func(b *testing.B, tc *testCase, i int) { preads(b, tc.path("r.raw"), uint64(i)) }},
	}
	for _, w := range workloads {
		b.Run(w.name, func(b *testing.B) {
			elapsed := make([]time.Duration, len(modes))
			for i := range b.N {
				for j := range modes {
					k := (i + j) % len(modes) // alternate which mode goes first
					tc := modes[k].tc
					b.StopTimer()
					if err := tc.store.Commit(); err != nil { // release what the last run freed
						b.Fatal(err)
					}
					if w.prep != nil {
						w.prep(b, tc)
					}
					b.StartTimer()
					start := time.Now()
					w.run(b, tc, i)
					elapsed[k] += time.Since(start)
				}
			}
			for k, m := range modes {
				b.ReportMetric(float64(w.bytes)*float64(b.N)/elapsed[k].Seconds()/1e6, m.name+"-MB/s")
			}
		})
	}
}
