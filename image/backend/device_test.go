package backend

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"
)

func TestDevice(t *testing.T) {
	for _, sector := range []int{512, 4096} {
		t.Run(map[int]string{512: "512B", 4096: "4KiB"}[sector], func(t *testing.T) {
			const size = 64 * MiB
			dev := newLoopDevice(t, size, sector)
			b := mustOpen(t, dev, OpenOptions{})

			d, ok := b.(*Device)
			if !ok {
				t.Fatalf("Open returned %T, want *Device", b)
			}
			if b.Size() != size {
				t.Errorf("Size() = %d, want %d", b.Size(), size)
			}
			if b.SectorSize() != sector {
				t.Errorf("SectorSize() = %d, want %d", b.SectorSize(), sector)
			}
			if !strings.Contains(b.Describe(), `block device "`+dev+`"`) {
				t.Errorf("Describe() = %q", b.Describe())
			}
			t.Logf("%s, discard granularity %d", b.Describe(), d.discardGranularity)

			data := aligned(1*MiB, 11)
			mustWrite(t, b, data, 4*MiB)
			if err := b.Flush(); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			if got := readBack(t, b, 4*MiB, len(data)); !bytes.Equal(got, data) {
				t.Fatal("read back differs from what was written")
			}

			// I/O aligned to 512 but not to the sector is refused on a 4 KiB device.
			if sector > 512 {
				_, err := b.WriteAt(directio.AlignedBlock(4096)[:512], 0)
				wantErrIs(t, "512-byte write on a 4 KiB device", err, ErrUnaligned)
			}
			_, err := b.ReadAt(directio.AlignedBlock(4096), size)
			wantErrIs(t, "read past the end", err, ErrOutOfRange)

			if err := b.WriteZeroes(4*MiB+64<<10, 256<<10); err != nil {
				t.Fatalf("WriteZeroes: %v", err)
			}
			got := readBack(t, b, 4*MiB, len(data))
			wantZeros(t, "zeroed range", got[64<<10:320<<10])
			if !bytes.Equal(got[:64<<10], data[:64<<10]) || !bytes.Equal(got[320<<10:], data[320<<10:]) {
				t.Error("data around the zeroed range changed")
			}

			// Discard is advice: success or ErrUnsupported, and the rest stays.
			err = b.Discard(4*MiB+512<<10, 256<<10)
			if err != nil {
				wantErrIs(t, "Discard", err, ErrUnsupported)
				t.Logf("Discard unsupported: %v", err)
			}
			got = readBack(t, b, 4*MiB, 1*MiB)
			if !bytes.Equal(got[320<<10:512<<10], data[320<<10:512<<10]) || !bytes.Equal(got[768<<10:], data[768<<10:]) {
				t.Error("Discard changed data outside its range")
			}
			t.Logf("discarded range reads as zeros: %v", bytes.Count(got[512<<10:768<<10], []byte{0}) == 256<<10)
			// A range smaller than the discard unit is a successful no-op.
			if d.discardGranularity > int64(sector) {
				if err := b.Discard(0, int64(sector)); err != nil {
					t.Errorf("Discard of one sector: %v", err)
				}
			}
			if err := b.Flush(); err != nil {
				t.Fatalf("Flush: %v", err)
			}
		})
	}
}

func TestDeviceLocking(t *testing.T) {
	dev := newLoopDevice(t, 8*MiB, 0)
	first := mustOpen(t, dev, OpenOptions{})

	_, err := Open(dev, OpenOptions{})
	wantErrIs(t, "second Open", err, ErrLocked)
	if !strings.Contains(err.Error(), dev) {
		t.Errorf("error %q does not name the device", err)
	}
	_, err = Open(dev, OpenOptions{ReadOnly: true})
	wantErrIs(t, "read-only Open beside a writer", err, ErrLocked)

	again, err := Open(dev, OpenOptions{NoLock: true})
	if err != nil {
		t.Fatalf("Open with NoLock: %v", err)
	}
	again.Close()

	first.Close()
	r1 := mustOpen(t, dev, OpenOptions{ReadOnly: true})
	r2 := mustOpen(t, dev, OpenOptions{ReadOnly: true})
	_, err = Open(dev, OpenOptions{})
	wantErrIs(t, "Open beside readers", err, ErrLocked)
	r1.Close()
	r2.Close()
	mustOpen(t, dev, OpenOptions{})
}

func TestDeviceBusy(t *testing.T) {
	// Another program holding the device exclusively (as a mount or LVM
	// would) makes a read-write Open fail with ErrLocked.
	dev := newLoopDevice(t, 8*MiB, 0)
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	_, err = Open(dev, OpenOptions{})
	wantErrIs(t, "Open of a claimed device", err, ErrLocked)
	if !strings.Contains(err.Error(), "busy") {
		t.Errorf("error %q does not say the device is busy", err)
	}
	t.Log(err)
}
