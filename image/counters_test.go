package image

import (
	"testing"

	"github.com/ncw/directio"
)

// The counters equal what a scripted workload did: N writes of M bytes are
// N requests in and the expected backend runs out, at every layer.
func TestCountersMatchWorkload(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "d.raw", 0)
	defer d.Close()
	base := ms.s.Metrics()
	buf := directio.AlignedBlock(1 << 20)
	for i := int64(0); i < 10; i++ { // 10 sequential 1 MiB writes into fresh space
		if _, err := d.WriteAt(buf, i<<20); err != nil {
			t.Fatal(err)
		}
	}
	small := directio.AlignedBlock(4096)
	for i := int64(0); i < 8; i++ { // 8 overwrites of 4 KiB
		if _, err := d.WriteAt(small, i*64<<10); err != nil {
			t.Fatal(err)
		}
	}
	rbuf := directio.AlignedBlock(64 << 10)
	for i := int64(0); i < 5; i++ { // 5 reads of 64 KiB
		if _, err := d.ReadAt(rbuf, i<<20); err != nil {
			t.Fatal(err)
		}
	}
	m := ms.s.Metrics()
	c, b := m.Counters, base.Counters
	want := map[string][2]uint64{
		"write requests":      {c.WriteRequests - b.WriteRequests, 18},
		"write request bytes": {c.WriteRequestBytes - b.WriteRequestBytes, 10<<20 + 8*4096},
		"data writes":         {c.DataWrites - b.DataWrites, 18},
		"data write bytes":    {c.DataWriteBytes - b.DataWriteBytes, 10<<20 + 8*4096},
		"allocations":         {c.Allocations - b.Allocations, 10},
		"allocated blocks":    {c.AllocatedBlocks - b.AllocatedBlocks, 2560},
		"coalesce runs":       {c.CoalesceRuns - b.CoalesceRuns, 18 + 5},
		"lookups":             {c.Lookups - b.Lookups, 18 + 5},
		"read requests":       {c.ReadRequests - b.ReadRequests, 5},
		"data reads":          {c.DataReads - b.DataReads, 5},
		"data read bytes":     {c.DataReadBytes - b.DataReadBytes, 5 * 64 << 10},
	}
	for name, v := range want {
		if v[0] != v[1] {
			t.Errorf("%s: %d, want %d", name, v[0], v[1])
		}
	}
	h := m.Histograms["data_write_size_bytes"]
	if h.Count-base.Histograms["data_write_size_bytes"].Count != 18 || h.Quantile(0.5) != 1<<20 || h.Mean() < 500<<10 {
		t.Errorf("data write size histogram: %+v", h)
	}
	if got := m.Disks[0]; got.WriteRequests != 18 || got.ReadRequests != 5 || got.Extents != 1 || got.Allocated != 10<<20 {
		t.Errorf("disk metrics: %+v", got)
	}
	if m.FreeBlocks == 0 || m.LargestFreeBlock == 0 || m.Extents != 1 {
		t.Errorf("allocator state: %+v", m)
	}
	// A sync is one journal commit with its two flushes.
	b = m.Counters
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	c = ms.s.Metrics().Counters
	if c.Commits-b.Commits != 1 || c.Flushes-b.Flushes != 2 {
		t.Errorf("sync: %d commits, %d flushes; want 1 and 2", c.Commits-b.Commits, c.Flushes-b.Flushes)
	}
}
