package image

import (
	"sort"
	"time"
)

// The data I/O of a plan (IOPlan) is counted by Finish; the single-block
// reads and writes outside a plan (the read-modify-write of a partial
// block, the zeroing of a tail) go through these helpers. Both count the
// same way: each backend I/O once, its size, and its latency from
// submission to completion; a failure counts an error.

// readData reads len(p) bytes at physical block phys, counting into c.
func (s *Store) readData(c *Shard, p []byte, phys uint64) error {
	t := time.Now()
	if _, err := s.be.ReadAt(p, s.dataOff+int64(phys*s.bs)); err != nil {
		s.stats.Errors.Add(1)
		return err
	}
	c.DataReadLatency.observeSince(t)
	c.DataReadSize.Observe(uint64(len(p)))
	return nil
}

// writeData writes p at physical block phys, counting into c; with durable,
// as a durable (FUA) write.
func (s *Store) writeData(c *Shard, p []byte, phys uint64, durable bool) error {
	t := time.Now()
	write := s.be.WriteAt
	if durable {
		write = s.be.WriteAtDurable
		c.DurableWrites.Add(1)
	}
	if _, err := write(p, s.dataOff+int64(phys*s.bs)); err != nil {
		s.stats.Errors.Add(1)
		return err
	}
	c.DataWriteLatency.observeSince(t)
	c.DataWriteSize.Observe(uint64(len(p)))
	return nil
}

// flush makes completed writes durable.
func (s *Store) flush() error {
	t := time.Now()
	if err := s.be.Flush(); err != nil {
		s.stats.Errors.Add(1)
		return err
	}
	s.stats.FlushLatency.observeSince(t)
	s.stats.Flushes.Add(1)
	return nil
}

func sortDiskMetrics(ds []DiskMetrics) {
	sort.Slice(ds, func(i, j int) bool { return ds[i].Name < ds[j].Name })
}
