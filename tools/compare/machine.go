package main

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// machineInfo describes where the numbers were taken.
type machineInfo struct {
	Nproc      int       `json:"nproc"`
	CPU        string    `json:"cpu"`
	Kernel     string    `json:"kernel"`
	MemGiB     float64   `json:"mem_gib"`
	Fio        string    `json:"fio"`
	Go         string    `json:"go"`
	GoMaxProcs int       `json:"gomaxprocs,omitempty"` // of the process serving the in-process targets
	FsType     string    `json:"scratch_fs"`
	LoadBefore []float64 `json:"load_before"` // 1, 5, 15 minute load averages
	LoadAfter  []float64 `json:"load_after"`
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func memGiB() float64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return float64(si.Totalram) * float64(si.Unit) / (1 << 30)
}

// loadAvg reads /proc/loadavg.
func loadAvg() []float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	return parseLoadAvg(string(b))
}

func parseLoadAvg(s string) []float64 {
	f := strings.Fields(s)
	var out []float64
	for i := 0; i < 3 && i < len(f); i++ {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}

// fsTypeOf names the file system holding path (the ones that matter here).
func fsTypeOf(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "unknown"
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4" // also ext2/ext3: one magic
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return "other"
}

func newMachineInfo(fioVersion, scratch string) machineInfo {
	return machineInfo{
		Nproc:      runtime.NumCPU(),
		CPU:        cpuModel(),
		Kernel:     kernelRelease(),
		MemGiB:     memGiB(),
		Fio:        fioVersion,
		Go:         runtime.Version(),
		GoMaxProcs: runtime.GOMAXPROCS(0),
		FsType:     fsTypeOf(scratch),
		LoadBefore: loadAvg(),
	}
}
