package backend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Device is a Backend on a block device, opened with O_DIRECT. Create it with
// Open. Its sector size is the device's logical block size (BLKSSZGET).
type Device struct {
	direct

	// discardGranularity is the unit of discards in bytes: Discard shrinks
	// its range to whole units. 0 when the device cannot discard.
	discardGranularity int64
}

func newDevice(fd int, path string, st *unix.Stat_t, readOnly bool) (*Device, error) {
	size, err := unix.IoctlGetUint64(fd, unix.BLKGETSIZE64)
	if err != nil {
		return nil, fmt.Errorf("open %q: ioctl BLKGETSIZE64: %w", path, err)
	}
	sector, err := unix.IoctlGetInt(fd, unix.BLKSSZGET)
	if err != nil {
		return nil, fmt.Errorf("open %q: ioctl BLKSSZGET: %w", path, err)
	}
	if !validSectorSize(sector) {
		return nil, fmt.Errorf("open %q: logical block size %d is not a power of two of at least 512", path, sector)
	}
	desc := fmt.Sprintf("block device %q (%d B sectors)", path, sector)
	d := &Device{discardGranularity: discardGranularity(st.Rdev, sector)}
	d.init(fd, desc, int64(size), sector, readOnly)
	return d, nil
}

// discardGranularity reads the discard unit of the device rdev from sysfs
// (queue/discard_granularity, and queue/discard_max_bytes to tell a device
// that cannot discard). It returns 0 when the device cannot discard, and the
// sector size when sysfs is not available, leaving the answer to the ioctl.
func discardGranularity(rdev uint64, sector int) int64 {
	queue := queueDir(rdev)
	if queue == "" {
		return int64(sector)
	}
	if maxBytes, err := readSysfsInt(filepath.Join(queue, "discard_max_bytes")); err == nil && maxBytes == 0 {
		return 0
	}
	g, err := readSysfsInt(filepath.Join(queue, "discard_granularity"))
	if err != nil {
		return int64(sector)
	}
	if g == 0 {
		return 0
	}
	return max(g, int64(sector))
}

// queueDir returns the sysfs queue directory of the device rdev: its own for
// a whole disk, its parent's for a partition; "" when there is none.
func queueDir(rdev uint64) string {
	dev := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(rdev), unix.Minor(rdev))
	for _, dir := range []string{filepath.Join(dev, "queue"), filepath.Join(dev, "..", "queue")} {
		if _, err := os.Stat(dir); err == nil {
			return dir
		}
	}
	return ""
}

func readSysfsInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// Flush makes every completed write durable: fsync on a block device sends a
// cache flush to the device.
func (d *Device) Flush() error {
	err := d.withFD(func(fd int) error { return unix.Fsync(fd) })
	if err != nil {
		return fmt.Errorf("backend %s: flush: %w", d.desc, err)
	}
	return nil
}

// Discard issues BLKDISCARD for the whole discard units inside [off, off+n);
// a range holding none is a successful no-op. A device that cannot discard
// gives an error wrapping ErrUnsupported.
func (d *Device) Discard(off, n int64) error {
	if err := d.checkIO(off, n, nil, true); err != nil {
		return d.opError("discard", off, n, err)
	}
	g := d.discardGranularity
	if g == 0 {
		return d.opError("discard", off, n, fmt.Errorf("%w: the device does not support discard", ErrUnsupported))
	}
	start := (off + g - 1) / g * g
	end := (off + n) / g * g
	if start >= end {
		return nil
	}
	err := d.withFD(func(fd int) error { return ioctlRange(fd, unix.BLKDISCARD, start, end-start) })
	if errors.Is(err, unix.EOPNOTSUPP) {
		return d.opError("discard", off, n, fmt.Errorf("%w: BLKDISCARD: %w", ErrUnsupported, err))
	}
	if err != nil {
		return d.opError("discard", off, n, fmt.Errorf("BLKDISCARD: %w", err))
	}
	return nil
}

// WriteZeroes makes [off, off+n) read as zeros with BLKZEROOUT (the kernel
// uses the device's write-zeroes command or writes zero pages itself), else by
// writing zero buffers.
func (d *Device) WriteZeroes(off, n int64) error {
	if err := d.checkIO(off, n, nil, true); err != nil {
		return d.opError("write zeroes", off, n, err)
	}
	if n == 0 {
		return nil
	}
	err := d.withFD(func(fd int) error {
		err := ioctlRange(fd, unix.BLKZEROOUT, off, n)
		if err != unix.EOPNOTSUPP && err != unix.ENOTTY {
			return err
		}
		return writeZeroBuffers(fd, off, n, d.sectorSize)
	})
	if err != nil {
		return d.opError("write zeroes", off, n, err)
	}
	return nil
}

// ioctlRange issues a block-device ioctl that takes a byte range
// ({start, length} as two uint64, like BLKDISCARD and BLKZEROOUT), retried on
// EINTR.
func ioctlRange(fd int, req uint, start, length int64) error {
	r := [2]uint64{uint64(start), uint64(length)}
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&r)))
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		default:
			return errno
		}
	}
}
