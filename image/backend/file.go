package backend

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// File is a Backend on a regular file, opened with O_DIRECT. Create it with
// Open.
type File struct {
	direct
	prepared chunkSet // chunks written ahead (Preparer), cleared by Discard
}

func newFile(fd int, path string, st *unix.Stat_t, readOnly bool) (*File, error) {
	sector, err := fileSectorSize(fd)
	if err != nil {
		return nil, fmt.Errorf("open %q: %w", path, err)
	}
	desc := fmt.Sprintf("file %q", path)
	f := &File{prepared: newChunkSet(st.Size)}
	f.init(fd, desc, st.Size, sector, readOnly)
	return f, nil
}

// fileSectorSize returns the alignment O_DIRECT needs on the file fd. Since
// Linux 6.1 the file system reports it through statx(STATX_DIOALIGN): ext4 and
// xfs say 512 on a device with 512-byte logical blocks. When it reports
// nothing, 4096 is used, which every disk file system accepts. Values below
// 512 are raised to 512.
func fileSectorSize(fd int) (int, error) {
	var stx unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx)
	if err != nil || stx.Mask&unix.STATX_DIOALIGN == 0 || stx.Dio_offset_align == 0 {
		return 4096, nil
	}
	sector := max(512, int(stx.Dio_offset_align), int(stx.Dio_mem_align))
	if !validSectorSize(sector) {
		return 0, fmt.Errorf("the file system reports an O_DIRECT alignment of %d bytes (memory %d), not a power of two",
			stx.Dio_offset_align, stx.Dio_mem_align)
	}
	return sector, nil
}

// Flush makes every completed write durable with fdatasync, which also
// persists the allocation of blocks written in holes and flushes the disk's
// cache.
func (f *File) Flush() error {
	err := f.withFD(func(fd int) error { return unix.Fdatasync(fd) })
	if err != nil {
		return fmt.Errorf("backend %s: flush: %w", f.desc, err)
	}
	return nil
}

// Discard punches a hole over [off, off+n) (fallocate PUNCH_HOLE|KEEP_SIZE),
// so the range reads zeros and takes no space. A file system without hole
// punching gives an error wrapping ErrUnsupported.
func (f *File) Discard(off, n int64) error {
	if err := f.checkIO(off, n, nil, true); err != nil {
		return f.opError("discard", off, n, err)
	}
	if n == 0 {
		return nil
	}
	err := f.withFD(func(fd int) error {
		return fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	})
	f.unprepare(off, n)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return f.opError("discard", off, n, fmt.Errorf("%w: punching holes: %w", ErrUnsupported, err))
	}
	if err != nil {
		return f.opError("discard", off, n, err)
	}
	return nil
}

// WriteZeroes makes [off, off+n) read as zeros: fallocate ZERO_RANGE (the
// range stays allocated), else PUNCH_HOLE, else writing zero buffers.
func (f *File) WriteZeroes(off, n int64) error {
	if err := f.checkIO(off, n, nil, true); err != nil {
		return f.opError("write zeroes", off, n, err)
	}
	if n == 0 {
		return nil
	}
	err := f.withFD(func(fd int) error {
		err := fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		if err != unix.EOPNOTSUPP {
			return err
		}
		err = fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		f.unprepare(off, n)
		if err != unix.EOPNOTSUPP {
			return err
		}
		return writeZeroBuffers(fd, off, n, f.sectorSize)
	})
	if err != nil {
		return f.opError("write zeroes", off, n, err)
	}
	return nil
}
