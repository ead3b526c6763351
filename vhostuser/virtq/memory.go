package virtq

import (
	"fmt"
	"sort"
)

// Region is one region of the frontend's memory table, mapped here.
type Region struct {
	GuestAddr uint64 // guest-physical address of Data[0]
	UserAddr  uint64 // the frontend's own address of Data[0]
	Data      []byte // the mapping (already advanced past the region's mmap offset)
}

// Memory is a memory table: regions sorted by guest address, not
// overlapping.
type Memory struct {
	regions []Region // by GuestAddr
	byUser  []int    // region indexes by UserAddr
}

// NewMemory builds a Memory from regions, which must not overlap in
// either address space.
func NewMemory(regions []Region) (*Memory, error) {
	m := &Memory{regions: append([]Region(nil), regions...)}
	sort.Slice(m.regions, func(i, j int) bool { return m.regions[i].GuestAddr < m.regions[j].GuestAddr })
	m.byUser = make([]int, len(m.regions))
	for i := range m.byUser {
		m.byUser[i] = i
	}
	sort.Slice(m.byUser, func(i, j int) bool { return m.regions[m.byUser[i]].UserAddr < m.regions[m.byUser[j]].UserAddr })
	for i, r := range m.regions {
		if len(r.Data) == 0 || r.GuestAddr+uint64(len(r.Data)) < r.GuestAddr || r.UserAddr+uint64(len(r.Data)) < r.UserAddr {
			return nil, fmt.Errorf("memory region at %#x: %d bytes: %w", r.GuestAddr, len(r.Data), ErrBadMemory)
		}
		if i > 0 {
			p := m.regions[i-1]
			if p.GuestAddr+uint64(len(p.Data)) > r.GuestAddr {
				return nil, fmt.Errorf("memory regions at %#x and %#x overlap: %w", p.GuestAddr, r.GuestAddr, ErrBadMemory)
			}
		}
	}
	for i := 1; i < len(m.byUser); i++ {
		p, r := m.regions[m.byUser[i-1]], m.regions[m.byUser[i]]
		if p.UserAddr+uint64(len(p.Data)) > r.UserAddr {
			return nil, fmt.Errorf("memory regions at user %#x and %#x overlap: %w", p.UserAddr, r.UserAddr, ErrBadMemory)
		}
	}
	return m, nil
}

// Regions returns the memory's regions, by guest address.
func (m *Memory) Regions() []Region { return m.regions }

// Guest returns the n bytes at guest-physical address addr, or false if
// they are not wholly inside one region.
func (m *Memory) Guest(addr, n uint64) ([]byte, bool) {
	rs := m.regions
	// The last region starting at or below addr (tables are small: a
	// linear scan beats a binary search for the usual one or two).
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i].GuestAddr <= addr {
			return span(rs[i].Data, addr-rs[i].GuestAddr, n)
		}
	}
	return nil, false
}

// User returns the n bytes at the frontend's address addr (the ring
// addresses of VHOST_USER_SET_VRING_ADDR), or false if they are not wholly
// inside one region.
func (m *Memory) User(addr, n uint64) ([]byte, bool) {
	for i := len(m.byUser) - 1; i >= 0; i-- {
		r := m.regions[m.byUser[i]]
		if r.UserAddr <= addr {
			return span(r.Data, addr-r.UserAddr, n)
		}
	}
	return nil, false
}

// span is data[off:off+n], or false if that is not inside data.
func span(data []byte, off, n uint64) ([]byte, bool) {
	size := uint64(len(data))
	if off > size || n > size-off {
		return nil, false
	}
	return data[off : off+n : off+n], true
}
