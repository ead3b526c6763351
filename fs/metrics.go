package fs

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/vdiskfs/vdiskfs/image"
)

// timedFS wraps the node file system and times every FUSE request of the
// operations that matter for disks, so the FUSE layer reports its own
// count and latency per operation (Server.OpMetrics). Byte counts and sizes
// of reads and writes are the store's (one Disk call per FUSE read or
// write); this layer adds what only it sees: the time a request spent in
// the daemon, including go-fuse's own work. Operations not listed pass
// through untimed.
type timedFS struct {
	fuse.RawFileSystem
	ops map[string]*image.Histogram // fixed at construction; values are lock-free
}

var timedOps = []string{"LOOKUP", "GETATTR", "SETATTR", "CREATE", "OPEN", "READ", "WRITE", "FLUSH", "FSYNC",
	"FALLOCATE", "LSEEK", "STATFS", "COPY_FILE_RANGE", "UNLINK", "RENAME",
	"SYNC_WRITE"} // not an opcode: the commit a synchronous WRITE waited for (syncFS)

func newTimedFS(fs fuse.RawFileSystem) *timedFS {
	t := &timedFS{RawFileSystem: fs, ops: map[string]*image.Histogram{}}
	for _, op := range timedOps {
		t.ops[op] = image.NewLatencyHistogram()
	}
	return t
}

func (t *timedFS) since(op string, start time.Time) { t.ops[op].ObserveDuration(time.Since(start)) }

// snapshot returns the histogram of every operation seen at least once.
func (t *timedFS) snapshot() map[string]image.HistogramSnapshot {
	out := make(map[string]image.HistogramSnapshot, len(t.ops))
	for op, h := range t.ops {
		if s := h.Snapshot(); s.Count > 0 {
			out[op] = s
		}
	}
	return out
}

func (t *timedFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	defer t.since("LOOKUP", time.Now())
	return t.RawFileSystem.Lookup(cancel, h, name, out)
}

func (t *timedFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	defer t.since("GETATTR", time.Now())
	return t.RawFileSystem.GetAttr(cancel, in, out)
}

func (t *timedFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	defer t.since("SETATTR", time.Now())
	return t.RawFileSystem.SetAttr(cancel, in, out)
}

func (t *timedFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer t.since("CREATE", time.Now())
	return t.RawFileSystem.Create(cancel, in, name, out)
}

func (t *timedFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	defer t.since("OPEN", time.Now())
	return t.RawFileSystem.Open(cancel, in, out)
}

func (t *timedFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	defer t.since("READ", time.Now())
	return t.RawFileSystem.Read(cancel, in, buf)
}

func (t *timedFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	defer t.since("WRITE", time.Now())
	return t.RawFileSystem.Write(cancel, in, data)
}

func (t *timedFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	defer t.since("FLUSH", time.Now())
	return t.RawFileSystem.Flush(cancel, in)
}

func (t *timedFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	defer t.since("FSYNC", time.Now())
	return t.RawFileSystem.Fsync(cancel, in)
}

func (t *timedFS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	defer t.since("FALLOCATE", time.Now())
	return t.RawFileSystem.Fallocate(cancel, in)
}

func (t *timedFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	defer t.since("LSEEK", time.Now())
	return t.RawFileSystem.Lseek(cancel, in, out)
}

func (t *timedFS) StatFs(cancel <-chan struct{}, in *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	defer t.since("STATFS", time.Now())
	return t.RawFileSystem.StatFs(cancel, in, out)
}

func (t *timedFS) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	defer t.since("COPY_FILE_RANGE", time.Now())
	return t.RawFileSystem.CopyFileRange(cancel, in)
}

func (t *timedFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	defer t.since("UNLINK", time.Now())
	return t.RawFileSystem.Unlink(cancel, h, name)
}

func (t *timedFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	defer t.since("RENAME", time.Now())
	return t.RawFileSystem.Rename(cancel, in, oldName, newName)
}

// OpMetrics returns the count and latency histogram of each FUSE operation
// served so far.
func (s *Server) OpMetrics() map[string]image.HistogramSnapshot { return s.timed.snapshot() }

// Writev is how go-fuse delivers WRITE first (Write only after ENOSYS).
func (t *timedFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	start := time.Now()
	n, st := t.RawFileSystem.Writev(cancel, in, data)
	if st != fuse.ENOSYS {
		t.since("WRITE", start)
	}
	return n, st
}
