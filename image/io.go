package image

import (
	"sort"
	"time"
)

// Every backend call of the store goes through these helpers, which count
// it, time it and record its size: the per-layer telemetry of the backend.

// readData reads len(p) bytes at physical block phys.
func (s *Store) readData(p []byte, phys uint64) error {
	t := time.Now()
	if _, err := s.be.ReadAt(p, s.dataOff+int64(phys*s.bs)); err != nil {
		s.stats.Errors.Add(1)
		return err
	}
	c := &s.stats
	c.DataReadLatency.observeSince(t)
	c.DataReads.Add(1)
	c.DataReadBytes.Add(uint64(len(p)))
	c.DataReadSize.Observe(float64(len(p)))
	return nil
}

// writeData writes p at physical block phys.
func (s *Store) writeData(p []byte, phys uint64) error {
	t := time.Now()
	if _, err := s.be.WriteAt(p, s.dataOff+int64(phys*s.bs)); err != nil {
		s.stats.Errors.Add(1)
		return err
	}
	c := &s.stats
	c.DataWriteLatency.observeSince(t)
	c.DataWrites.Add(1)
	c.DataWriteBytes.Add(uint64(len(p)))
	c.DataWriteSize.Observe(float64(len(p)))
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
