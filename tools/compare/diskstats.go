package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ioCount is a count of I/Os and their bytes, by direction. Counters are
// cumulative; sub gives the figures of an interval.
type ioCount struct {
	Reads      uint64 `json:"reads"`
	ReadBytes  uint64 `json:"read_bytes"`
	Writes     uint64 `json:"writes"`
	WriteBytes uint64 `json:"write_bytes"`
}

func (c ioCount) sub(o ioCount) ioCount {
	return ioCount{
		Reads: c.Reads - o.Reads, ReadBytes: c.ReadBytes - o.ReadBytes,
		Writes: c.Writes - o.Writes, WriteBytes: c.WriteBytes - o.WriteBytes,
	}
}

func (c ioCount) ios() uint64   { return c.Reads + c.Writes }
func (c ioCount) bytes() uint64 { return c.ReadBytes + c.WriteBytes }

// diskStat is one line of /proc/diskstats (Documentation/admin-guide/iostats.rst).
type diskStat struct {
	Major, Minor uint32
	Name         string
	IO           ioCount // completed reads and writes, sectors turned into bytes
	ReadMerges   uint64
	WriteMerges  uint64
}

// parseDiskstats reads /proc/diskstats. Sectors there are always 512 bytes,
// whatever the device's sector size.
func parseDiskstats(r io.Reader) ([]diskStat, error) {
	var out []diskStat
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 14 {
			return nil, fmt.Errorf("diskstats line %d: %d fields, want at least 14", line, len(f))
		}
		var n [14]uint64
		for i, s := range f {
			if i == 2 || i >= 14 {
				continue
			}
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("diskstats line %d field %d: %w", line, i+1, err)
			}
			n[i] = v
		}
		out = append(out, diskStat{
			Major: uint32(n[0]), Minor: uint32(n[1]), Name: f[2],
			IO: ioCount{
				Reads: n[3], ReadBytes: n[5] * 512,
				Writes: n[7], WriteBytes: n[9] * 512,
			},
			ReadMerges: n[4], WriteMerges: n[8],
		})
	}
	return out, sc.Err()
}

// blockDevice is the device whose /proc/diskstats line the tool reads.
type blockDevice struct {
	Major, Minor uint32
	Name         string
	path         string // /proc/diskstats, or a test file
}

// deviceOf finds the block device holding path (st_dev), or the device
// called name when name is not "".
func deviceOf(path, name, diskstats string) (*blockDevice, error) {
	f, err := os.Open(diskstats)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	all, err := parseDiskstats(f)
	if err != nil {
		return nil, err
	}
	if name != "" {
		name = strings.TrimPrefix(name, "/dev/")
		for _, d := range all {
			if d.Name == name {
				return &blockDevice{Major: d.Major, Minor: d.Minor, Name: d.Name, path: diskstats}, nil
			}
		}
		return nil, fmt.Errorf("device %q is not in %s", name, diskstats)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, err
	}
	maj, min := unix.Major(st.Dev), unix.Minor(st.Dev)
	for _, d := range all {
		if d.Major == maj && d.Minor == min {
			return &blockDevice{Major: maj, Minor: min, Name: d.Name, path: diskstats}, nil
		}
	}
	return nil, fmt.Errorf("%s is on device %d:%d, which has no line in %s (not a block device file system?)", path, maj, min, diskstats)
}

// sample reads the device's cumulative counters.
func (b *blockDevice) sample() (ioCount, error) {
	f, err := os.Open(b.path)
	if err != nil {
		return ioCount{}, err
	}
	defer f.Close()
	all, err := parseDiskstats(f)
	if err != nil {
		return ioCount{}, err
	}
	for _, d := range all {
		if d.Major == b.Major && d.Minor == b.Minor {
			return d.IO, nil
		}
	}
	return ioCount{}, fmt.Errorf("device %s (%d:%d) vanished from %s", b.Name, b.Major, b.Minor, b.path)
}
