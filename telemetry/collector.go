package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
)

// Collector turns snapshots of a Source into Prometheus metrics at each
// scrape.
type Collector struct {
	src   Source
	descs map[string]*prometheus.Desc // by name without the vdiskfs_ prefix (families)
}

// NewCollector returns a Collector of src.
func NewCollector(src Source) *Collector {
	c := &Collector{src: src, descs: make(map[string]*prometheus.Desc, len(families))}
	for _, f := range families {
		c.descs[f.name] = prometheus.NewDesc("vdiskfs_"+f.name, f.help, f.labels, nil)
	}
	return c
}

// families are the metric families a Collector exports: name (without
// the vdiskfs_ prefix), help, and variable labels.
var families = []struct {
	name, help string
	labels     []string
}{
	{"requests_total", "Disk read and write requests (one per FUSE read or write).", []string{"op"}},
	{"request_bytes_total", "Bytes asked for by disk requests.", []string{"op"}},
	{"request_size_bytes", "Size of disk requests.", []string{"op"}},
	{"map_lookups_total", "Extent-map lookups of a request's block range.", nil},
	{"map_lookup_segments_total", "Data and hole segments returned by map lookups.", nil},
	{"map_allocations_total", "Allocations of new blocks for writes.", nil},
	{"map_allocated_blocks_total", "Blocks allocated for writes.", nil},
	{"map_extents", "Extents held by all disk maps.", nil},
	{"coalesce_pieces_total", "Mapped pieces handed to the coalescer.", nil},
	{"coalesce_runs_total", "Backend runs the coalescer produced (one per contiguous stretch).", nil},
	{"backend_ios_total", "Backend I/Os.", []string{"kind"}},
	{"backend_bytes_total", "Backend bytes transferred.", []string{"kind"}},
	{"backend_io_size_bytes", "Size of backend data I/Os.", []string{"op"}},
	{"backend_latency_seconds", "Latency of backend data I/Os.", []string{"op"}},
	{"backend_errors_total", "Backend errors.", nil},
	{"backend_durable_writes_total", "Data writes made durable on their own (FUA), for synchronous overwrites; counted in backend_ios_total too.", nil},
	{"backend_flushes_total", "Backend flushes (cache flush / fdatasync).", nil},
	{"backend_flush_latency_seconds", "Latency of backend flushes.", nil},
	{"backend_discards_total", "Discards passed down for freed blocks.", nil},
	{"backend_prepared_bytes_total", "Zeros written over free blocks of a store file ahead of their first use, so that first writes are overwrites for its host file system.", nil},
	{"journal_commits_total", "Journal commits written.", nil},
	{"journal_unflushed_commits_total", "Journal commits of times alone written by the commit timer without a flush (durable with the next flush).", nil},
	{"journal_bytes_total", "Journal bytes written.", nil},
	{"journal_commit_latency_seconds", "Latency of a whole commit (flush, write, flush).", nil},
	{"checkpoints_total", "Checkpoints written.", nil},
	{"capacity_bytes", "Bytes of the data region.", nil},
	{"free_bytes", "Free bytes, including blocks waiting for a commit.", nil},
	{"largest_free_extent_bytes", "Largest free extent.", nil},
	{"reserved_bytes", "Free bytes held by disks' allocation units (placement of their next small first writes; given up when space is short).", nil},
	{"disk_size_bytes", "Disk size.", []string{"disk"}},
	{"disk_allocated_bytes", "Bytes of blocks a disk maps.", []string{"disk"}},
	{"disk_extents", "Extents of a disk's map.", []string{"disk"}},
	{"disk_requests_total", "Requests per disk.", []string{"disk", "op"}},
	{"disk_request_bytes_total", "Request bytes per disk.", []string{"disk", "op"}},
	{"fuse_request_latency_seconds", "Latency of FUSE requests by operation.", []string{"op"}},
	{"plan_declines_total", "Requests a door's queue thread could not plan without waiting, by reason; they were served on the path that may block (image.Decline).", []string{"reason"}},
	{"disks_locked", "Encrypted disks whose key has not been given (vdisk unlock): listed, but their data cannot be read or written.", nil},
	{"unlock_failures_total", "Keys refused when unlocking an encrypted disk (a wrong key file or passphrase).", nil},
	{"crypt_bytes_total", "Bytes of encrypted disks encrypted for writes and decrypted after reads, in whole blocks.", []string{"op"}},
	{"vhost_user_requests_total", "Requests completed by a disk's vhost-user device, by type.", []string{"disk", "socket", "op"}},
	{"vhost_user_request_errors_total", "Requests a vhost-user device completed with VIRTIO_BLK_S_IOERR, by type.", []string{"disk", "socket", "op"}},
	{"vhost_user_request_bytes_total", "Bytes transferred (read, write) or covered (discard, write_zeroes) by a vhost-user device's requests.", []string{"disk", "socket", "op"}},
	{"vhost_user_request_latency_seconds", "Latency of a vhost-user device's requests, from the available ring to the used ring.", []string{"disk", "socket", "op"}},
	{"vhost_user_inflight_requests", "Requests a vhost-user device has taken from its queues and not completed.", []string{"disk", "socket"}},
	{"vhost_user_events_total", "Events of a vhost-user device: frontends connected (connects), connected after the first (reconnects), refused while one was served (refused), requests resubmitted after a reconnect (resubmitted), served on the blocking path (fallbacks), reads and writes whose data, scattered in guest memory, went to the backing as vectored I/O (vectored) or was copied through one buffer (staged), writes returned only after a commit made them survive a restart (held), with bad descriptors (bad), of unsupported types (unsupported).", []string{"disk", "socket", "event"}},
	{"vhost_user_connected", "1 while a frontend is connected to a disk's vhost-user socket, else 0.", []string{"disk", "socket"}},
	{"store_failed", "1 when the store refuses writes and syncs after a failed flush or metadata write (until it is reopened), else 0.", nil},
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	m := c.src.Metrics()
	k := m.Counters
	counter := func(name string, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, labels...)
	}
	hist := func(name, snapshot string, labels ...string) {
		if h, ok := m.Histograms[snapshot]; ok {
			ch <- constHistogram(c.descs[name], h, labels...)
		}
	}
	counter("requests_total", k.ReadRequests, "read")
	counter("requests_total", k.WriteRequests, "write")
	counter("request_bytes_total", k.ReadRequestBytes, "read")
	counter("request_bytes_total", k.WriteRequestBytes, "write")
	hist("request_size_bytes", "read_request_size_bytes", "read")
	hist("request_size_bytes", "write_request_size_bytes", "write")
	counter("map_lookups_total", k.Lookups)
	counter("map_lookup_segments_total", k.LookupSegments)
	counter("map_allocations_total", k.Allocations)
	counter("map_allocated_blocks_total", k.AllocatedBlocks)
	gauge("map_extents", float64(m.Extents))
	counter("coalesce_pieces_total", k.CoalescePieces)
	counter("coalesce_runs_total", k.CoalesceRuns)
	counter("backend_ios_total", k.DataReads, "data_read")
	counter("backend_ios_total", k.DataWrites, "data_write")
	counter("backend_ios_total", k.MetaReads, "meta_read")
	counter("backend_ios_total", k.MetaWrites, "meta_write")
	counter("backend_bytes_total", k.DataReadBytes, "data_read")
	counter("backend_bytes_total", k.DataWriteBytes, "data_write")
	counter("backend_bytes_total", k.MetaReadBytes, "meta_read")
	counter("backend_bytes_total", k.MetaWriteBytes, "meta_write")
	hist("backend_io_size_bytes", "data_read_size_bytes", "read")
	hist("backend_io_size_bytes", "data_write_size_bytes", "write")
	hist("backend_latency_seconds", "data_read_latency_seconds", "read")
	hist("backend_latency_seconds", "data_write_latency_seconds", "write")
	counter("backend_errors_total", k.Errors)
	counter("backend_durable_writes_total", k.DurableWrites)
	counter("backend_flushes_total", k.Flushes)
	hist("backend_flush_latency_seconds", "flush_latency_seconds")
	counter("backend_discards_total", k.Discards)
	counter("backend_prepared_bytes_total", k.PreparedBytes)
	counter("journal_commits_total", k.Commits)
	counter("journal_unflushed_commits_total", k.UnflushedCommits)
	counter("journal_bytes_total", k.JournalBytes)
	hist("journal_commit_latency_seconds", "journal_commit_latency_seconds")
	counter("checkpoints_total", k.Checkpoints)
	bs := float64(m.BlockSize)
	gauge("capacity_bytes", float64(m.DataBlocks)*bs)
	gauge("free_bytes", float64(m.FreeBlocks)*bs)
	gauge("largest_free_extent_bytes", float64(m.LargestFreeBlock)*bs)
	gauge("reserved_bytes", float64(m.ReservedBlocks)*bs)
	for _, d := range m.Disks {
		gauge("disk_size_bytes", float64(d.Size), d.Name)
		gauge("disk_allocated_bytes", float64(d.Allocated), d.Name)
		gauge("disk_extents", float64(d.Extents), d.Name)
		counter("disk_requests_total", d.ReadRequests, d.Name, "read")
		counter("disk_requests_total", d.WriteRequests, d.Name, "write")
		counter("disk_request_bytes_total", d.ReadRequestBytes, d.Name, "read")
		counter("disk_request_bytes_total", d.WriteRequestBytes, d.Name, "write")
	}
	for _, r := range image.DeclineReasons() {
		counter("plan_declines_total", k.PlanDeclines[r], r)
	}
	for op, h := range c.src.OpMetrics() {
		ch <- constHistogram(c.descs["fuse_request_latency_seconds"], h, op)
	}
	gauge("disks_locked", float64(m.LockedDisks))
	counter("unlock_failures_total", k.UnlockFailures)
	counter("crypt_bytes_total", k.EncryptedBytes, "encrypt")
	counter("crypt_bytes_total", k.DecryptedBytes, "decrypt")
	if vs, ok := c.src.(VhostSource); ok {
		for _, u := range vs.VhostUsers() {
			c.collectVhost(ch, u)
		}
	}
	failed := 0.0
	if m.Failed {
		failed = 1
	}
	gauge("store_failed", failed)
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
func (c *Collector) collectVhost(ch chan<- prometheus.Metric, u VhostUser) {
	st := u.Stats
	for _, op := range []struct {
		name string
		s    blk.OpStats
	}{{"read", st.Read}, {"write", st.Write}, {"flush", st.Flush}, {"discard", st.Discard}, {"write_zeroes", st.WriteZeroes}, {"get_id", st.GetID}} {
		ch <- prometheus.MustNewConstMetric(c.descs["vhost_user_requests_total"], prometheus.CounterValue, float64(op.s.Requests), u.Disk, u.Socket, op.name)
		ch <- prometheus.MustNewConstMetric(c.descs["vhost_user_request_errors_total"], prometheus.CounterValue, float64(op.s.Errors), u.Disk, u.Socket, op.name)
		ch <- prometheus.MustNewConstMetric(c.descs["vhost_user_request_bytes_total"], prometheus.CounterValue, float64(op.s.Bytes), u.Disk, u.Socket, op.name)
		ch <- c.vhostHistogram(op.s.Latency, u.Disk, u.Socket, op.name)
	}
	ch <- prometheus.MustNewConstMetric(c.descs["vhost_user_inflight_requests"], prometheus.GaugeValue, float64(st.Inflight), u.Disk, u.Socket)
	for _, ev := range []struct {
		name string
		n    uint64
	}{{"connects", st.Connects}, {"reconnects", st.Reconnects}, {"refused", st.Refused}, {"resubmitted", st.Resubmitted},
		{"fallbacks", st.Fallbacks}, {"vectored", st.Vectored}, {"staged", st.Staged}, {"held", st.Held}, {"bad", st.Bad}, {"unsupported", st.Unsupported}} {
		ch <- prometheus.MustNewConstMetric(c.descs["vhost_user_events_total"], prometheus.CounterValue, float64(ev.n), u.Disk, u.Socket, ev.name)
	}
	connected := 0.0
	if st.Connected {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(c.descs["vhost_user_connected"], prometheus.GaugeValue, connected, u.Disk, u.Socket)
}

// vhostHistogram converts a device's latency buckets (per bucket, the
// last past blk.LatencyBounds) to Prometheus' cumulative ones.
func (c *Collector) vhostHistogram(l blk.Latency, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(blk.LatencyBounds))
	var cum uint64
	for i, b := range blk.LatencyBounds {
		cum += l.Buckets[i]
		buckets[b.Seconds()] = cum
	}
	count := cum + l.Buckets[len(blk.LatencyBounds)]
	return prometheus.MustNewConstHistogram(c.descs["vhost_user_request_latency_seconds"], count, l.Sum.Seconds(), buckets, labels...)
}
