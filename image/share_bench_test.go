package image

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// Benchmarks of sharing (issue 18): a clone of a disk with 100,000 extents
// and a snapshot of a 64 GiB disk must take time and metadata in
// proportion to the extents, and write no data. The store is a sparse file
// in b.TempDir() (ext4 here, O_DIRECT), seen through countingBackend, which
// sorts every byte the store writes by where it lands: superblocks,
// journal, the checkpoint's blocks, or data. Each op is the share and the
// commit that makes it durable; the checkpoint that follows (what the next
// close or a full journal writes, with the new map in it) is measured
// apart. Run them with
//
//	go test ./image -run '^$' -bench 'CloneExtents|Snapshot64GiB' -benchtime 5x
//
// Metrics per op: share-ms (CopyFrom, or Snapshot before its commit),
// commit-ms, data-B (must be 0), journal-B, super-B, flushes, then ckpt-ms
// and ckpt-B for the checkpoint after it.

// countingBackend counts the bytes written through it by region.
type countingBackend struct {
	backend.Backend
	dataOff int64 // set once the superblock is known

	super, journal, flushes atomic.Int64
	mu                      sync.Mutex
	region                  []pext // data-region writes, in bytes from dataOff
}

func (c *countingBackend) count(off int64, n int) {
	switch {
	case off < journalOffset:
		c.super.Add(int64(n))
	case c.dataOff == 0 || off < c.dataOff:
		c.journal.Add(int64(n))
	default:
		c.mu.Lock()
		c.region = append(c.region, pext{Start: uint64(off - c.dataOff), Len: uint64(n)})
		c.mu.Unlock()
	}
}

func (c *countingBackend) WriteAt(p []byte, off int64) (int, error) {
	c.count(off, len(p))
	return c.Backend.WriteAt(p, off)
}

func (c *countingBackend) WriteAtDurable(p []byte, off int64) (int, error) {
	c.count(off, len(p))
	return c.Backend.WriteAtDurable(p, off)
}

func (c *countingBackend) WriteZeroes(off, n int64) error {
	c.count(off, int(n))
	return c.Backend.WriteZeroes(off, n)
}

func (c *countingBackend) Flush() error {
	c.flushes.Add(1)
	return c.Backend.Flush()
}

// writes is what the store wrote through a countingBackend in one phase.
type writes struct {
	super, journal, ckpt, data, flushes int64
}

// take returns what was written since the last take, telling the blocks of
// s's current checkpoint from data, and starts counting afresh.
func (c *countingBackend) take(s *Store) writes {
	s.mu.Lock()
	ckpt := append([]pext(nil), s.mu.ckptExts...)
	s.mu.Unlock()
	c.mu.Lock()
	region := c.region
	c.region = nil
	c.mu.Unlock()
	w := writes{super: c.super.Swap(0), journal: c.journal.Swap(0), flushes: c.flushes.Swap(0)}
	for _, r := range region {
		var in uint64
		for _, e := range ckpt {
			lo, hi := max(r.Start, e.Start*s.bs), min(r.End(), e.End()*s.bs)
			if lo < hi {
				in += hi - lo
			}
		}
		w.ckpt += int64(in)
		w.data += int64(r.Len - in)
	}
	return w
}

// benchShareStore formats a sparse store file of size bytes in b.TempDir()
// and opens it through a countingBackend, already version 2 (so the first
// share does not also upgrade it).
func benchShareStore(b *testing.B, size int64) (*Store, *countingBackend) {
	path := filepath.Join(b.TempDir(), "share.store")
	if err := FormatPath(path, size, FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	be, err := backend.Open(path, backend.OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	cb := &countingBackend{Backend: be}
	s, err := Open(cb, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		be.Close()
		b.Fatal(err)
	}
	cb.dataOff = s.dataOff
	if err := s.Upgrade(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if rep := s.Check(); !rep.Clean() {
			b.Errorf("check: %v", rep.Findings[:min(3, len(rep.Findings))])
		}
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	})
	return s, cb
}

// shareMetrics adds up the phases of every op and reports them per op.
type shareMetrics struct {
	ops                 int
	share, commit, ckpt time.Duration
	shared, ckptW       writes
}

func (m *shareMetrics) add(share, commit, ckpt time.Duration, w, cw writes) {
	m.ops++
	m.share += share
	m.commit += commit
	m.ckpt += ckpt
	m.shared.super += w.super
	m.shared.journal += w.journal
	m.shared.ckpt += w.ckpt
	m.shared.data += w.data
	m.shared.flushes += w.flushes
	m.ckptW.super += cw.super
	m.ckptW.journal += cw.journal
	m.ckptW.ckpt += cw.ckpt
	m.ckptW.data += cw.data
}

func (m *shareMetrics) report(b *testing.B) {
	n := float64(m.ops)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 / n }
	b.ReportMetric(ms(m.share), "share-ms")
	b.ReportMetric(ms(m.commit), "commit-ms")
	b.ReportMetric(float64(m.shared.data)/n, "data-B")
	b.ReportMetric(float64(m.shared.journal)/n, "journal-B")
	b.ReportMetric(float64(m.shared.super+m.shared.ckpt)/n, "super+ckpt-B")
	b.ReportMetric(float64(m.shared.flushes)/n, "flushes")
	b.ReportMetric(ms(m.ckpt), "ckpt-ms")
	b.ReportMetric(float64(m.ckptW.ckpt+m.ckptW.super)/n, "ckpt-B")
	b.ReportMetric(float64(m.ckptW.data)/n, "ckpt-data-B")
	if m.shared.data != 0 || m.ckptW.data != 0 {
		b.Errorf("sharing wrote %d data bytes, its checkpoints %d: want none", m.shared.data, m.ckptW.data)
	}
}

// checkpointMeasured writes a checkpoint and returns its time and writes.
func checkpointMeasured(b *testing.B, s *Store, cb *countingBackend) (time.Duration, writes) {
	cb.take(s)
	start := time.Now()
	if err := s.Checkpoint(); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	return d, cb.take(s)
}

// BenchmarkCloneExtents: CopyFrom of a whole disk with 100,000 extents
// (and, to show the cost follows the extents, 10,000) into an empty disk,
// then the commit. The source maps one block at every other block, as
// 4 KiB writes there would leave it (100,000 extents: its first 781 MiB),
// but made white-box (mapWhiteBox): writing them for real costs ext4 a
// discard per block when the store file is deleted (a minute here), and
// the copy cannot tell.
func BenchmarkCloneExtents(b *testing.B) {
	for _, extents := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(extents), func(b *testing.B) { benchClone(b, extents) })
	}
}

func benchClone(b *testing.B, extents int) {
	s, cb := benchShareStore(b, 1<<30)
	exts := make([]blockmap.Extent, extents)
	for i := range exts {
		exts[i] = blockmap.Extent{Virt: 2 * uint64(i), Phys: 2 * uint64(i), Len: 1}
	}
	mapWhiteBox(b, s, "src.raw", int64(2*extents*4096), exts)
	src, err := s.OpenDisk("src.raw")
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	size := src.Size()

	var m shareMetrics
	i := 0
	for b.Loop() {
		b.StopTimer()
		name := fmt.Sprintf("clone-%d.raw", i)
		i++
		dst := mustCreate(b, s, name, 0)
		if err := s.Commit(); err != nil {
			b.Fatal(err)
		}
		cb.take(s)
		b.StartTimer()
		t0 := time.Now()
		if n, err := dst.CopyFrom(src, 0, 0, size); err != nil || n != size {
			b.Fatalf("clone: %d bytes, %v", n, err)
		}
		t1 := time.Now()
		if err := s.Commit(); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		b.StopTimer()
		w := cb.take(s)
		ckpt, cw := checkpointMeasured(b, s, cb)
		m.add(t1.Sub(t0), t2.Sub(t1), ckpt, w, cw)
		if info, _ := s.Stat(name); info.Extents != extents || info.Shared != info.Allocated || !info.Clone {
			b.Fatalf("%s: %d extents, %d of %d bytes shared, clone %v", name, info.Extents, info.Shared, info.Allocated, info.Clone)
		}
		dst.Close()
		if err := s.Remove(name); err != nil {
			b.Fatal(err)
		}
		if err := s.Commit(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	m.report(b)
}

// BenchmarkSnapshot64GiB: Snapshot (which commits) of a 64 GiB disk, in
// two shapes. thin: 1 GiB written through WriteAt, 16 MiB at the start of
// every GiB (64 extents), the rest holes: a VM image in use. full: every
// block mapped, as 65,536 extents of 1 MiB in reverse physical order (no
// two merge), made white-box (mapWhiteBox): no data is written, so the
// store stays a sparse file; the snapshot cannot tell.
func BenchmarkSnapshot64GiB(b *testing.B) {
	const diskSize = 64 << 30
	b.Run("thin-64-extents", func(b *testing.B) {
		s, cb := benchShareStore(b, 2<<30)
		src := mustCreate(b, s, "src.raw", diskSize)
		buf := directio.AlignedBlock(1 << 20)
		for g := int64(0); g < 64; g++ {
			for off := int64(0); off < 16<<20; off += 1 << 20 {
				buf[0] = byte(g)
				if _, err := src.WriteAt(buf, g<<30+off); err != nil {
					b.Fatal(err)
				}
			}
		}
		src.Close()
		benchSnapshot(b, s, cb, 64)
	})
	b.Run("full-65536-extents", func(b *testing.B) {
		const extents, blocks = 65536, 256
		s, cb := benchShareStore(b, diskSize+2<<30)
		exts := make([]blockmap.Extent, extents)
		for i := range exts {
			exts[i] = blockmap.Extent{Virt: uint64(i) * blocks, Phys: uint64(extents-1-i) * blocks, Len: blocks}
		}
		mapWhiteBox(b, s, "src.raw", diskSize, exts)
		benchSnapshot(b, s, cb, extents)
	})
}

// mapWhiteBox creates the disk name of size bytes mapping exts, straight
// into its map and the allocator (no data is written: the blocks read
// whatever the store file holds there), and checkpoints the store, as if
// it had been opened with the disk.
func mapWhiteBox(b *testing.B, s *Store, name string, size int64, exts []blockmap.Extent) {
	if _, err := s.Create(name, size, Attr{Mode: 0o644}); err != nil {
		b.Fatal(err)
	}
	s.mu.Lock()
	d := s.mu.names[name]
	for _, e := range exts {
		if err := s.mu.alloc.Take(pext{Start: e.Phys, Len: e.Len}); err != nil {
			b.Fatal(err)
		}
		d.m.Insert(e, nil)
	}
	s.mu.extents += d.m.Len()
	s.mu.Unlock()
	if err := s.Checkpoint(); err != nil {
		b.Fatal(err)
	}
}

// benchSnapshot measures Snapshot of src.raw, which has extents extents.
func benchSnapshot(b *testing.B, s *Store, cb *countingBackend, extents int) {
	if err := s.Commit(); err != nil {
		b.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil {
		b.Fatal(err)
	}
	if info, _ := s.Stat("src.raw"); info.Extents != extents {
		b.Fatalf("src.raw has %d extents, want %d", info.Extents, extents)
	}
	var m shareMetrics
	i := 0
	for b.Loop() {
		b.StopTimer()
		name := fmt.Sprintf("snap-%d", i)
		i++
		cb.take(s)
		b.StartTimer()
		t0 := time.Now()
		if _, err := s.snapshot("src.raw", name, diskFlagSnapshot); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := s.Commit(); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		b.StopTimer()
		w := cb.take(s)
		ckpt, cw := checkpointMeasured(b, s, cb)
		m.add(t1.Sub(t0), t2.Sub(t1), ckpt, w, cw)
		if info, _ := s.Stat(name); info.Extents != extents || info.Shared != info.Allocated || !info.Snapshot {
			b.Fatalf("%s: %d extents, %d of %d bytes shared, snapshot %v", name, info.Extents, info.Shared, info.Allocated, info.Snapshot)
		}
		if err := s.Remove(name); err != nil {
			b.Fatal(err)
		}
		if err := s.Commit(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	m.report(b)
}

// BenchmarkEngineFirstWrite is vdiskfs's own cost of a first write, into a
// hole against one over a shared block (copy-on-write), through WriteAt
// (the one planner the queue threads use too) with the data I/O dropped
// (nullData): the plan, the allocation, the map and its records, and a
// commit every 256 writes, which for a copy-on-write drops the old
// blocks' references.
// 4 KiB writes go to every block of a 64 MiB disk (and of a 1 GiB one) in random order, 1 MiB
// writes to every MiB of a 1 GiB disk in order; each disk is written once
// (a fresh one, and a fresh snapshot, when it is used up, off the clock).
func BenchmarkEngineFirstWrite(b *testing.B) {
	for _, bs := range []int{4096, 1 << 20} {
		for _, cow := range []bool{false, true} {
			name := fmt.Sprintf("%dKiB/holes", bs>>10)
			if cow {
				name = fmt.Sprintf("%dKiB/cow", bs>>10)
			}
			size := int64(64 << 20)
			if bs == 1<<20 {
				size = 1 << 30
			}
			b.Run(name, func(b *testing.B) { benchFirstWrite(b, bs, size, cow) })
		}
	}
	// The random fill (the compare tool's rand-fill-4k-qd32): every block of a 1 GiB
	// disk once, at random, where the map and the free extents grow to
	// ~100k entries each halfway through.
	b.Run("4KiB/holes/1GiB", func(b *testing.B) { benchFirstWrite(b, 4096, 1<<30, false) })
}

func benchFirstWrite(b *testing.B, bs int, diskSize int64, cow bool) {
	mem := backend.NewMem(8 << 30)
	if err := Format(mem, FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	s, err := Open(mem, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.be = nullData{Backend: s.be, from: s.dataOff}
	buf := directio.AlignedBlock(bs)
	fill := directio.AlignedBlock(1 << 20)
	writes := int(diskSize / int64(bs))
	order := make([]int, writes)
	for i := range order {
		order[i] = i
	}
	if bs == 4096 {
		order = rand.New(rand.NewPCG(5, 6)).Perm(writes)
	}
	var h *Disk
	n, round := writes, 0
	next := func() {
		if h != nil {
			h.Close()
			for _, name := range []string{fmt.Sprintf("d%d", round), fmt.Sprintf("d%d-snap", round)} {
				if err := s.Remove(name); err != nil && cow || err != nil && !errors.Is(err, ErrNotExist) {
					b.Fatal(err)
				}
			}
		}
		round++
		name := fmt.Sprintf("d%d", round)
		h = mustCreate(b, s, name, diskSize)
		if cow {
			for off := int64(0); off < diskSize; off += 1 << 20 {
				if _, err := h.WriteAt(fill, off); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := s.Snapshot(name, name+"-snap"); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Commit(); err != nil {
			b.Fatal(err)
		}
		n = 0
	}
	b.SetBytes(int64(bs))
	b.ReportAllocs()
	var cpu cpuClock
	ops := 0
	for b.Loop() {
		if n == writes {
			b.StopTimer()
			cpu.stop()
			next()
			cpu.start()
			b.StartTimer()
		}
		ops++
		if _, err := h.WriteAt(buf, int64(order[n])*int64(bs)); err != nil {
			b.Fatal(err)
		}
		n++
		if n%256 == 0 {
			if err := s.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	cpu.stop()
	b.ReportMetric(float64(cpu.total.Nanoseconds())/float64(ops), "cpu-ns/op")
	h.Close()
}

// cpuClock adds up the process's CPU time (user and system, all threads,
// the garbage collector's too) between each start and the stop after it:
// on a shared host it moves less than wall time with what other tenants
// do. A stop without a start counts nothing.
type cpuClock struct {
	at    time.Duration
	on    bool
	total time.Duration
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (c *cpuClock) start() { c.at, c.on = processCPU(), true }

func (c *cpuClock) stop() {
	if c.on {
		c.total += processCPU() - c.at
		c.on = false
	}
}
