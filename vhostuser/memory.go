package vhostuser

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
	"github.com/vdiskfs/vdiskfs/vhostuser/virtq"
)

// memTable is the frontend's memory table mapped here: the regions as
// the frontend gave them, their mappings, and the Memory built from them.
type memTable struct {
	mem     *virtq.Memory
	regions []proto.MemRegion
	maps    [][]byte // whole mappings, one per region
}

// mapMemTable maps regions from fds (one each, closed here): SET_MEM_TABLE.
func mapMemTable(regions []proto.MemRegion, fds []int) (*memTable, error) {
	defer closeFDs(fds)
	if len(regions) != len(fds) {
		return nil, fmt.Errorf("%d memory regions with %d descriptors: %w", len(regions), len(fds), ErrProtocol)
	}
	t := &memTable{}
	for i, r := range regions {
		if err := t.mapRegion(r, fds[i]); err != nil {
			t.unmap()
			return nil, fmt.Errorf("memory region %d: %w", i, err)
		}
	}
	if err := t.build(); err != nil {
		t.unmap()
		return nil, err
	}
	return t, nil
}

// mapRegion maps r from fd (which stays the caller's) and appends it.
func (t *memTable) mapRegion(r proto.MemRegion, fd int) error {
	size := r.MmapOffset + r.Size
	if r.Size == 0 || size < r.Size || size > 1<<48 {
		return fmt.Errorf("%d bytes at offset %d: %w", r.Size, r.MmapOffset, ErrProtocol)
	}
	if err := fileHolds(fd, size); err != nil {
		return err
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		return fmt.Errorf("map %d bytes: %w", size, err)
	}
	t.regions, t.maps = append(t.regions, r), append(t.maps, m)
	return nil
}

// build makes the Memory of the regions mapped.
func (t *memTable) build() error {
	vr := make([]virtq.Region, len(t.regions))
	for i, r := range t.regions {
		vr[i] = virtq.Region{GuestAddr: r.GuestAddr, UserAddr: r.UserAddr, Data: t.maps[i][r.MmapOffset:]}
	}
	mem, err := virtq.NewMemory(vr)
	if err != nil {
		return err
	}
	t.mem = mem
	return nil
}

// add maps one more region from fd (closed here): ADD_MEM_REG.
func (t *memTable) add(r proto.MemRegion, fd int) error {
	defer closeFDs([]int{fd})
	if len(t.regions) >= maxMemSlots {
		return fmt.Errorf("a memory region past the %d slots: %w", maxMemSlots, ErrProtocol)
	}
	if err := t.mapRegion(r, fd); err != nil {
		return err
	}
	if err := t.build(); err != nil { // overlaps another: undo
		k := len(t.maps) - 1
		unix.Munmap(t.maps[k])
		t.regions, t.maps = t.regions[:k], t.maps[:k]
		return err
	}
	return nil
}

// remove unmaps the region at r's guest address and size: REM_MEM_REG.
func (t *memTable) remove(r proto.MemRegion) error {
	for i, have := range t.regions {
		if have.GuestAddr == r.GuestAddr && have.Size == r.Size {
			unix.Munmap(t.maps[i])
			t.regions = append(t.regions[:i], t.regions[i+1:]...)
			t.maps = append(t.maps[:i], t.maps[i+1:]...)
			return t.build()
		}
	}
	return fmt.Errorf("no memory region of %d bytes at %#x: %w", r.Size, r.GuestAddr, ErrProtocol)
}

func (t *memTable) unmap() {
	if t == nil {
		return
	}
	for _, m := range t.maps {
		unix.Munmap(m)
	}
	t.maps, t.regions, t.mem = nil, nil, nil
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
