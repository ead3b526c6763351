package vhostuser

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
	"github.com/vdiskfs/vdiskfs/vhostuser/virtq"
)

// memTable is the frontend's memory table mapped here.
type memTable struct {
	mem  *virtq.Memory
	maps [][]byte // whole mappings, unmapped by unmap
}

// mapMemTable maps regions from fds (one each, closed here).
func mapMemTable(regions []proto.MemRegion, fds []int) (*memTable, error) {
	defer closeFDs(fds)
	if len(regions) != len(fds) {
		return nil, fmt.Errorf("%d memory regions with %d descriptors: %w", len(regions), len(fds), ErrProtocol)
	}
	t := &memTable{}
	var vr []virtq.Region
	for i, r := range regions {
		size := r.MmapOffset + r.Size
		if r.Size == 0 || size < r.Size || size > 1<<48 {
			t.unmap()
			return nil, fmt.Errorf("memory region %d: %d bytes at offset %d: %w", i, r.Size, r.MmapOffset, ErrProtocol)
		}
		if err := fileHolds(fds[i], size); err != nil {
			t.unmap()
			return nil, fmt.Errorf("memory region %d: %w", i, err)
		}
		m, err := unix.Mmap(fds[i], 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
		if err != nil {
			t.unmap()
			return nil, fmt.Errorf("map memory region %d (%d bytes): %w", i, size, err)
		}
		t.maps = append(t.maps, m)
		vr = append(vr, virtq.Region{GuestAddr: r.GuestAddr, UserAddr: r.UserAddr, Data: m[r.MmapOffset:]})
	}
	mem, err := virtq.NewMemory(vr)
	if err != nil {
		t.unmap()
		return nil, err
	}
	t.mem = mem
	return t, nil
}

func (t *memTable) unmap() {
	if t == nil {
		return
	}
	for _, m := range t.maps {
		unix.Munmap(m)
	}
	t.maps, t.mem = nil, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// fileHolds checks that a regular file (a memfd, a hugetlbfs or tmpfs
// file) has at least size bytes: a mapping past its end would fault
// (SIGBUS) when touched. Other descriptors (devices) are left to mmap.
func fileHolds(fd int, size uint64) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG && uint64(st.Size) < size {
		return fmt.Errorf("%d bytes mapped from a file of %d: %w", size, st.Size, ErrProtocol)
	}
	return nil
}
