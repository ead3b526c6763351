package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/vdiskfs/vdiskfs/image"
	"golang.org/x/sys/unix"
)

// openStore opens the store at path for the offline command cmd: no
// background commits (the command closes the store, which commits and
// checkpoints), the command named in the owner record, logs to e.log. An
// open elsewhere fails with an error naming the holder, after a bounded wait
// when the holder is a mount daemon that was unmounted and is closing.
func (e *env) openStore(path, cmd string, readOnly bool) (*image.Store, error) {
	return e.openPath(path, image.Options{
		Logger:         e.log,
		ReadOnly:       readOnly,
		CommitInterval: -1,
		Program:        "vdisk " + cmd,
	})
}

// closeStore closes s and reports a failure through *errp; when the command
// has already failed, a second error from Close is logged instead.
func (e *env) closeStore(s *image.Store, errp *error) { e.closeReporting(s, "store", errp) }

// closeDisk closes a disk handle like closeStore.
func (e *env) closeDisk(d *image.Disk, errp *error) { e.closeReporting(d, "disk", errp) }

// closeReporting closes c (a store or a disk: what) and reports a failure
// through *errp, or logs it when the command has failed already.
func (e *env) closeReporting(c io.Closer, what string, errp *error) {
	err := c.Close()
	if err == nil {
		return
	}
	err = fmt.Errorf("close %s: %w", what, err)
	if *errp == nil {
		*errp = err
	} else {
		e.log.WithError(err).Errorf("closing the %s after a failure", what)
	}
}

// progress is a byte progress bar on stderr, shown only when stderr is a
// terminal; otherwise all its methods do nothing.
type progress struct {
	bar *progressbar.ProgressBar
}

func (e *env) newProgress(total int64, desc string) *progress {
	return e.newProgressOf(total, desc, true)
}

// newProgressOf is newProgress for a count of bytes (inBytes) or of items.
// A total of -1 is unknown (a stream): the bar counts without an end.
func (e *env) newProgressOf(total int64, desc string, inBytes bool) *progress {
	if !e.isTerminal || total == 0 || total < -1 {
		return &progress{}
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(e.stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionShowCount(),
	}
	if inBytes {
		opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowTotalBytes(true), progressbar.OptionUseIECUnits(true))
	}
	return &progress{bar: progressbar.NewOptions64(total, opts...)}
}

// set moves the bar to n bytes done.
func (p *progress) set(n int64) {
	if p.bar != nil {
		_ = p.bar.Set64(n)
	}
}

// setTotal changes the bar's end to n bytes.
func (p *progress) setTotal(n int64) {
	if p.bar != nil {
		p.bar.ChangeMax64(n)
	}
}

// done removes the bar from the terminal, whether the copy finished or not.
func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Clear()
		_ = p.bar.Exit()
	}
}

// copyChunk is the unit of reading in import and export.
const copyChunk = 1 << 20

// zeros is compared against to find all-zero blocks; never written.
var zeros [copyChunk]byte

func isZero(b []byte) bool {
	for len(b) > len(zeros) {
		if !bytes.Equal(b[:len(zeros)], zeros[:]) {
			return false
		}
		b = b[len(zeros):]
	}
	return bytes.Equal(b, zeros[:len(b)])
}

// writeNonZero hands write the parts of buf, the bytes at offset off, that
// are not all zeros, looking at bs-byte blocks from the start of buf (off
// should be a multiple of bs so that they line up with the target's blocks);
// the last block may be short. Consecutive non-zero blocks go in one call, so
// large I/O stays large. It returns the bytes written.
func writeNonZero(buf []byte, off int64, bs int, write func(p []byte, off int64) error) (int64, error) {
	var written int64
	start := -1 // start of the current run of non-zero blocks in buf
	flush := func(end int) error {
		if start < 0 {
			return nil
		}
		err := write(buf[start:end], off+int64(start))
		written += int64(end - start)
		start = -1
		return err
	}
	for i := 0; i < len(buf); i += bs {
		end := min(i+bs, len(buf))
		if isZero(buf[i:end]) {
			if err := flush(i); err != nil {
				return written, err
			}
		} else if start < 0 {
			start = i
		}
	}
	return written, flush(len(buf))
}

// fileDataRegions calls fn with each data region [start, end) of f, a file of
// size bytes, in order, as SEEK_DATA and SEEK_HOLE find them. When the file
// system cannot tell (they fail with EINVAL or EOPNOTSUPP), or useSeek is
// false, the whole file is one region.
func fileDataRegions(f *os.File, size int64, useSeek bool, fn func(start, end int64) error) error {
	if size == 0 {
		return nil
	}
	if !useSeek {
		return fn(0, size)
	}
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole from off to the end
		}
		if off == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
			return fn(0, size)
		}
		if err != nil {
			return fmt.Errorf("%s: seek data at %d: %w", f.Name(), off, err)
		}
		if start >= size {
			return nil
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("%s: seek hole at %d: %w", f.Name(), start, err)
		}
		end = min(end, size)
		if end <= start {
			return fmt.Errorf("%s: seek hole at %d returned %d", f.Name(), start, end)
		}
		if err := fn(start, end); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// diskDataRegions is fileDataRegions for a disk, with Disk.SeekData and
// Disk.SeekHole.
func diskDataRegions(d *image.Disk, fn func(start, end int64) error) error {
	size := d.Size()
	for off := int64(0); off < size; {
		start, err := d.SeekData(off)
		if errors.Is(err, image.ErrNoData) {
			return nil
		}
		if err != nil {
			return err
		}
		end, err := d.SeekHole(start)
		if err != nil {
			return err
		}
		end = min(end, size)
		if end <= start {
			return fmt.Errorf("seek hole at %d returned %d", start, end)
		}
		if err := fn(start, end); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// sameFile reports whether paths a and b name the same existing file.
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}
