package image

import (
	"sort"
	"time"
)

// The data I/O of a plan (IOPlan) is counted by Finish. The data I/O no
// plan can make goes through these helpers, counted the same way (each
// backend I/O once, its size, and its latency from submission to
// completion; a failure counts an error): defrag's writes into blocks no
// map holds yet (a plan writes a disk's range where its map or placement
// puts it, never into blocks its caller chose), and Open's zeroing of a
// disk's tail past its size, made under Store.mu before any plan can be.

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
