// Command guestzeroout runs inside the e2e tests' QEMU guest, whose busybox
// blkdiscard has no -z: it asks the kernel to zero a byte range of a block
// device with the BLKZEROOUT ioctl, which virtio-blk sends to the device as
// VIRTIO_BLK_T_WRITE_ZEROES when the device offers VIRTIO_BLK_F_WRITE_ZEROES
// (the kernel writes zero pages itself when it does not: the guest script
// checks write_zeroes_max_bytes to tell the two apart).
//
// Usage: guestzeroout DEVICE OFFSET LENGTH (bytes, 512-aligned).
package main

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// blkZeroOut is _IO(0x12, 127) from linux/fs.h; x/sys/unix does not
// define it.
const blkZeroOut = 0x127f

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: guestzeroout DEVICE OFFSET LENGTH")
		os.Exit(2)
	}
	off, err1 := strconv.ParseUint(os.Args[2], 10, 64)
	n, err2 := strconv.ParseUint(os.Args[3], 10, 64)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "guestzeroout: OFFSET and LENGTH are byte counts")
		os.Exit(2)
	}
	fd, err := unix.Open(os.Args[1], unix.O_WRONLY, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "guestzeroout: open %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	r := [2]uint64{off, n}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), blkZeroOut, uintptr(unsafe.Pointer(&r))); e != 0 {
		fmt.Fprintf(os.Stderr, "guestzeroout: BLKZEROOUT %s %d+%d: %v\n", os.Args[1], off, n, e)
		os.Exit(1)
	}
	if err := unix.Close(fd); err != nil {
		fmt.Fprintf(os.Stderr, "guestzeroout: close %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
