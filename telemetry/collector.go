package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
)

// Collector turns snapshots of a Source into Prometheus metrics at each
// scrape.
type Collector struct {
	src Source
}

// NewCollector returns a Collector of src.
func NewCollector(src Source) *Collector { return &Collector{src: src} }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("vdiskfs_"+name, help, labels, nil)
}

var (
	dRequests        = desc("requests_total", "Disk read and write requests (one per FUSE read or write).", "op")
	dRequestBytes    = desc("request_bytes_total", "Bytes asked for by disk requests.", "op")
	dRequestSize     = desc("request_size_bytes", "Size of disk requests.", "op")
	dLookups         = desc("map_lookups_total", "Extent-map lookups of a request's block range.")
	dLookupSegments  = desc("map_lookup_segments_total", "Data and hole segments returned by map lookups.")
	dAllocations     = desc("map_allocations_total", "Allocations of new blocks for writes.")
	dAllocatedBlocks = desc("map_allocated_blocks_total", "Blocks allocated for writes.")
	dExtents         = desc("map_extents", "Extents held by all disk maps.")
	dPieces          = desc("coalesce_pieces_total", "Mapped pieces handed to the coalescer.")
	dRuns            = desc("coalesce_runs_total", "Backend runs the coalescer produced (one per contiguous stretch).")
	dBackendIOs      = desc("backend_ios_total", "Backend I/Os.", "kind")
	dBackendBytes    = desc("backend_bytes_total", "Backend bytes transferred.", "kind")
	dBackendSize     = desc("backend_io_size_bytes", "Size of backend data I/Os.", "op")
	dBackendLatency  = desc("backend_latency_seconds", "Latency of backend data I/Os.", "op")
	dBackendErrors   = desc("backend_errors_total", "Backend errors.")
	dDurableWrites   = desc("backend_durable_writes_total", "Data writes made durable on their own (FUA), for synchronous overwrites; counted in backend_ios_total too.")
	dFlushes         = desc("backend_flushes_total", "Backend flushes (cache flush / fdatasync).")
	dFlushLatency    = desc("backend_flush_latency_seconds", "Latency of backend flushes.")
	dDiscards        = desc("backend_discards_total", "Discards passed down for freed blocks.")
	dPreparedBytes   = desc("backend_prepared_bytes_total", "Zeros written over free blocks of a store file ahead of their first use, so that first writes are overwrites for its host file system.")
	dCommits         = desc("journal_commits_total", "Journal commits written.")
	dUnflushed       = desc("journal_unflushed_commits_total", "Journal commits of times alone written by the commit timer without a flush (durable with the next flush).")
	dJournalBytes    = desc("journal_bytes_total", "Journal bytes written.")
	dCommitLatency   = desc("journal_commit_latency_seconds", "Latency of a whole commit (flush, write, flush).")
	dCheckpoints     = desc("checkpoints_total", "Checkpoints written.")
	dCapacity        = desc("capacity_bytes", "Bytes of the data region.")
	dFree            = desc("free_bytes", "Free bytes, including blocks waiting for a commit.")
	dLargestFree     = desc("largest_free_extent_bytes", "Largest free extent.")
	dReserved        = desc("reserved_bytes", "Free bytes held by disks' allocation units (placement of their next small first writes; given up when space is short).")
	dDiskSize        = desc("disk_size_bytes", "Disk size.", "disk")
	dDiskAllocated   = desc("disk_allocated_bytes", "Bytes of blocks a disk maps.", "disk")
	dDiskExtents     = desc("disk_extents", "Extents of a disk's map.", "disk")
	dDiskRequests    = desc("disk_requests_total", "Requests per disk.", "disk", "op")
	dDiskBytes       = desc("disk_request_bytes_total", "Request bytes per disk.", "disk", "op")
	dFUSELatency     = desc("fuse_request_latency_seconds", "Latency of FUSE requests by operation.", "op")
	dPlanDeclines    = desc("plan_declines_total", "Requests a door's queue thread could not plan without waiting, by reason; they were served on the path that may block (image.Decline).", "reason")
	dVhostRequests   = desc("vhost_user_requests_total", "Requests completed by a disk's vhost-user device, by type.", "disk", "socket", "op")
	dVhostErrors     = desc("vhost_user_request_errors_total", "Requests a vhost-user device completed with VIRTIO_BLK_S_IOERR, by type.", "disk", "socket", "op")
	dVhostBytes      = desc("vhost_user_request_bytes_total", "Bytes transferred (read, write) or covered (discard, write_zeroes) by a vhost-user device's requests.", "disk", "socket", "op")
	dVhostLatency    = desc("vhost_user_request_latency_seconds", "Latency of a vhost-user device's requests, from the available ring to the used ring.", "disk", "socket", "op")
	dVhostInflight   = desc("vhost_user_inflight_requests", "Requests a vhost-user device has taken from its queues and not completed.", "disk", "socket")
	dVhostEvents     = desc("vhost_user_events_total", "Events of a vhost-user device: frontends connected (connects), connected after the first (reconnects), refused while one was served (refused), requests resubmitted after a reconnect (resubmitted), served on the blocking path (fallbacks), writes returned only after a commit made them survive a restart (held), with bad descriptors (bad), of unsupported types (unsupported).", "disk", "socket", "event")
	dVhostConnected  = desc("vhost_user_connected", "1 while a frontend is connected to a disk's vhost-user socket, else 0.", "disk", "socket")
	dStoreFailed     = desc("store_failed", "1 when the store refuses writes and syncs after a failed flush or metadata write (until it is reopened), else 0.")
)

var allDescs = []*prometheus.Desc{dRequests, dRequestBytes, dRequestSize, dLookups, dLookupSegments, dAllocations,
	dAllocatedBlocks, dExtents, dPieces, dRuns, dBackendIOs, dBackendBytes, dBackendSize, dBackendLatency,
	dBackendErrors, dDurableWrites, dFlushes, dFlushLatency, dDiscards, dPreparedBytes, dCommits, dUnflushed, dJournalBytes, dCommitLatency, dCheckpoints,
	dCapacity, dFree, dLargestFree, dReserved, dDiskSize, dDiskAllocated, dDiskExtents, dDiskRequests, dDiskBytes, dFUSELatency, dPlanDeclines,
	dVhostRequests, dVhostErrors, dVhostBytes, dVhostLatency, dVhostInflight, dVhostEvents, dVhostConnected, dStoreFailed}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	m := c.src.Metrics()
	k := m.Counters
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	hist := func(d *prometheus.Desc, name string, labels ...string) {
		if h, ok := m.Histograms[name]; ok {
			ch <- constHistogram(d, h, labels...)
		}
	}
	counter(dRequests, k.ReadRequests, "read")
	counter(dRequests, k.WriteRequests, "write")
	counter(dRequestBytes, k.ReadRequestBytes, "read")
	counter(dRequestBytes, k.WriteRequestBytes, "write")
	hist(dRequestSize, "read_request_size_bytes", "read")
	hist(dRequestSize, "write_request_size_bytes", "write")
	counter(dLookups, k.Lookups)
	counter(dLookupSegments, k.LookupSegments)
	counter(dAllocations, k.Allocations)
	counter(dAllocatedBlocks, k.AllocatedBlocks)
	gauge(dExtents, float64(m.Extents))
	counter(dPieces, k.CoalescePieces)
	counter(dRuns, k.CoalesceRuns)
	counter(dBackendIOs, k.DataReads, "data_read")
	counter(dBackendIOs, k.DataWrites, "data_write")
	counter(dBackendIOs, k.MetaReads, "meta_read")
	counter(dBackendIOs, k.MetaWrites, "meta_write")
	counter(dBackendBytes, k.DataReadBytes, "data_read")
	counter(dBackendBytes, k.DataWriteBytes, "data_write")
	counter(dBackendBytes, k.MetaReadBytes, "meta_read")
	counter(dBackendBytes, k.MetaWriteBytes, "meta_write")
	hist(dBackendSize, "data_read_size_bytes", "read")
	hist(dBackendSize, "data_write_size_bytes", "write")
	hist(dBackendLatency, "data_read_latency_seconds", "read")
	hist(dBackendLatency, "data_write_latency_seconds", "write")
	counter(dBackendErrors, k.Errors)
	counter(dDurableWrites, k.DurableWrites)
	counter(dFlushes, k.Flushes)
	hist(dFlushLatency, "flush_latency_seconds")
	counter(dDiscards, k.Discards)
	counter(dPreparedBytes, k.PreparedBytes)
	counter(dCommits, k.Commits)
	counter(dUnflushed, k.UnflushedCommits)
	counter(dJournalBytes, k.JournalBytes)
	hist(dCommitLatency, "journal_commit_latency_seconds")
	counter(dCheckpoints, k.Checkpoints)
	bs := float64(m.BlockSize)
	gauge(dCapacity, float64(m.DataBlocks)*bs)
	gauge(dFree, float64(m.FreeBlocks)*bs)
	gauge(dLargestFree, float64(m.LargestFreeBlock)*bs)
	gauge(dReserved, float64(m.ReservedBlocks)*bs)
	for _, d := range m.Disks {
		gauge(dDiskSize, float64(d.Size), d.Name)
		gauge(dDiskAllocated, float64(d.Allocated), d.Name)
		gauge(dDiskExtents, float64(d.Extents), d.Name)
		counter(dDiskRequests, d.ReadRequests, d.Name, "read")
		counter(dDiskRequests, d.WriteRequests, d.Name, "write")
		counter(dDiskBytes, d.ReadRequestBytes, d.Name, "read")
		counter(dDiskBytes, d.WriteRequestBytes, d.Name, "write")
	}
	for _, r := range image.DeclineReasons() {
		counter(dPlanDeclines, k.PlanDeclines[r], r)
	}
	for op, h := range c.src.OpMetrics() {
		ch <- constHistogram(dFUSELatency, h, op)
	}
	if vs, ok := c.src.(VhostSource); ok {
		for _, u := range vs.VhostUsers() {
			collectVhost(ch, u)
		}
	}
	failed := 0.0
	if m.Failed {
		failed = 1
	}
	gauge(dStoreFailed, failed)
}

// constHistogram converts a snapshot (per-bucket counts) to Prometheus'
// cumulative buckets.
func constHistogram(d *prometheus.Desc, h image.HistogramSnapshot, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	var cum uint64
	for i, b := range h.Bounds {
		cum += h.Counts[i]
		buckets[b] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets, labels...)
}

// collectVhost sends the metrics of one served disk.
func collectVhost(ch chan<- prometheus.Metric, u VhostUser) {
	st := u.Stats
	for _, op := range []struct {
		name string
		s    blk.OpStats
	}{{"read", st.Read}, {"write", st.Write}, {"flush", st.Flush}, {"discard", st.Discard}, {"write_zeroes", st.WriteZeroes}, {"get_id", st.GetID}} {
		ch <- prometheus.MustNewConstMetric(dVhostRequests, prometheus.CounterValue, float64(op.s.Requests), u.Disk, u.Socket, op.name)
		ch <- prometheus.MustNewConstMetric(dVhostErrors, prometheus.CounterValue, float64(op.s.Errors), u.Disk, u.Socket, op.name)
		ch <- prometheus.MustNewConstMetric(dVhostBytes, prometheus.CounterValue, float64(op.s.Bytes), u.Disk, u.Socket, op.name)
		ch <- vhostHistogram(op.s.Latency, u.Disk, u.Socket, op.name)
	}
	ch <- prometheus.MustNewConstMetric(dVhostInflight, prometheus.GaugeValue, float64(st.Inflight), u.Disk, u.Socket)
	for _, ev := range []struct {
		name string
		n    uint64
	}{{"connects", st.Connects}, {"reconnects", st.Reconnects}, {"refused", st.Refused}, {"resubmitted", st.Resubmitted},
		{"fallbacks", st.Fallbacks}, {"held", st.Held}, {"bad", st.Bad}, {"unsupported", st.Unsupported}} {
		ch <- prometheus.MustNewConstMetric(dVhostEvents, prometheus.CounterValue, float64(ev.n), u.Disk, u.Socket, ev.name)
	}
	connected := 0.0
	if st.Connected {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(dVhostConnected, prometheus.GaugeValue, connected, u.Disk, u.Socket)
}

// vhostHistogram converts a device's latency buckets (per bucket, the
// last past blk.LatencyBounds) to Prometheus' cumulative ones.
func vhostHistogram(l blk.Latency, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(blk.LatencyBounds))
	var cum uint64
	for i, b := range blk.LatencyBounds {
		cum += l.Buckets[i]
		buckets[b.Seconds()] = cum
	}
	count := cum + l.Buckets[len(blk.LatencyBounds)]
	return prometheus.MustNewConstHistogram(dVhostLatency, count, l.Sum.Seconds(), buckets, labels...)
}
