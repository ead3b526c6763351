package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// infoJSON is `vdisk info --json`. Sizes are in bytes, counts of blocks say so.
type infoJSON struct {
	UUID              string    `json:"uuid"`
	FormatVersion     int       `json:"format_version"` // 2: blocks can be shared (vdisk upgrade)
	Backing           string    `json:"backing"`
	StoreSize         int64     `json:"store_size"`
	BlockSize         int       `json:"block_size"`
	Capacity          int64     `json:"capacity"`
	DataBlocks        uint64    `json:"data_blocks"`
	Used              int64     `json:"used"`
	Free              int64     `json:"free"`
	FreeBlocks        uint64    `json:"free_blocks"`
	LargestFreeExtent int64     `json:"largest_free_extent"`
	Disks             int       `json:"disks"`
	Extents           int       `json:"extents"`
	AvgExtent         int64     `json:"avg_extent_bytes"` // mapped bytes per extent: fragmentation
	JournalSize       int64     `json:"journal_size"`
	JournalUsed       int64     `json:"journal_used"`
	CheckpointBytes   int64     `json:"checkpoint_bytes"`
	Generation        uint64    `json:"generation"`
	MountGeneration   uint64    `json:"mount_generation"`
	Created           time.Time `json:"created"`
	// Sharing, over all disks: MappedBytes is what they map (their
	// allocated bytes summed, each shared block once per disk mapping
	// it), SharedBytes the part of it in blocks more than one disk maps,
	// ExclusiveBytes the rest. Snapshots and Clones count those disks.
	MappedBytes    int64 `json:"mapped_bytes"`
	SharedBytes    int64 `json:"shared_bytes"`
	ExclusiveBytes int64 `json:"exclusive_bytes"`
	Snapshots      int   `json:"snapshots"`
	Encrypted      int   `json:"encrypted"` // encrypted disks, of which Locked have no key given
	Locked         int   `json:"locked"`
	Clones         int   `json:"clones"`
}

func newInfoCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "info STORE|MOUNTPOINT",
		Short: "Show a store's capacity, use and metadata",
		Long: `Info shows a store's capacity, use, free space and its largest free extent,
its disks and how much of what they map is shared, fragmentation (extents
and their average size), journal, checkpoint and format version.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, info asks the daemon and shows the store as it is now.`,
		Args: exactArgs("STORE"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			a, err := e.openAccess(args[0], "info", true)
			if err != nil {
				return err
			}
			defer e.closeAccess(a, &err)
			si, err := a.Info()
			if err != nil {
				return err
			}
			disks, err := a.List()
			if err != nil {
				return err
			}
			in := si.Info
			bs := int64(in.BlockSize)
			var mapped, shared int64
			var snapshots, clones, encrypted, locked int
			for _, d := range disks {
				mapped += d.Allocated
				shared += d.Shared
				if d.Snapshot {
					snapshots++
				} else if d.Clone {
					clones++
				}
				encrypted, locked = encrypted+boolInt(d.Encrypted), locked+boolInt(d.Locked)
			}
			j := infoJSON{
				UUID: in.UUID, FormatVersion: si.Version, Backing: in.Backing, StoreSize: in.StoreSize, BlockSize: in.BlockSize,
				Capacity: in.CapacityBytes, DataBlocks: in.DataBlocks,
				Used: in.CapacityBytes - in.FreeBytes, Free: in.FreeBytes, FreeBlocks: in.FreeBlocks,
				LargestFreeExtent: int64(in.LargestFree) * bs,
				Disks:             in.Disks, Extents: in.Extents, AvgExtent: avgExtent(mapped, in.Extents),
				JournalSize: in.JournalBytes, JournalUsed: in.JournalUsed, CheckpointBytes: in.CkptBytes,
				Generation: in.Generation, MountGeneration: in.MountGen, Created: in.CreatedAt,
				MappedBytes: mapped, SharedBytes: shared, ExclusiveBytes: mapped - shared, Snapshots: snapshots, Clones: clones,
				Encrypted: encrypted, Locked: locked,
			}
			if asJSON {
				return writeJSON(e, j)
			}
			pct := func(n int64) string {
				if j.Capacity == 0 {
					return ""
				}
				return fmt.Sprintf(" (%.1f%%)", 100*float64(n)/float64(j.Capacity))
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 1, ' ', 0)
			fmt.Fprintf(tw, "uuid:\t%s\n", j.UUID)
			fmt.Fprintf(tw, "format version:\t%s\n", formatVersion(j.FormatVersion))
			fmt.Fprintf(tw, "backing:\t%s, %s\n", j.Backing, formatSize(j.StoreSize))
			fmt.Fprintf(tw, "block size:\t%s\n", formatSize(bs))
			fmt.Fprintf(tw, "capacity:\t%s (%d blocks)\n", formatSize(j.Capacity), j.DataBlocks)
			fmt.Fprintf(tw, "used:\t%s%s\n", formatSize(j.Used), pct(j.Used))
			fmt.Fprintf(tw, "free:\t%s%s\n", formatSize(j.Free), pct(j.Free))
			fmt.Fprintf(tw, "largest free extent:\t%s\n", formatSize(j.LargestFreeExtent))
			fmt.Fprintf(tw, "disks:\t%d (snapshots: %d, clones: %d, encrypted: %d, locked: %d)\n", j.Disks, j.Snapshots, j.Clones, j.Encrypted, j.Locked)
			fmt.Fprintf(tw, "disks map:\t%s: %s exclusive, %s shared\n", formatSize(j.MappedBytes), formatSize(j.ExclusiveBytes), formatSize(j.SharedBytes))
			fmt.Fprintf(tw, "extents:\t%d, %s each on average\n", j.Extents, formatSize(j.AvgExtent))
			fmt.Fprintf(tw, "journal:\t%s, %s used\n", formatSize(j.JournalSize), formatSize(j.JournalUsed))
			fmt.Fprintf(tw, "checkpoint:\t%s\n", formatSize(j.CheckpointBytes))
			fmt.Fprintf(tw, "generation:\t%d (opened for writing %d times)\n", j.Generation, j.MountGeneration)
			fmt.Fprintf(tw, "created:\t%s\n", j.Created.Local().Format(time.RFC3339))
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON object")
	return cmd
}

// formatVersion says what a store format version means.
func formatVersion(v int) string {
	if v >= 3 {
		return fmt.Sprintf("%d (shared blocks and encrypted disks)", v)
	}
	if v >= 2 {
		return fmt.Sprintf("%d (shared blocks: clones and snapshots)", v)
	}
	return fmt.Sprintf("%d (no shared blocks yet; the first clone or snapshot, or vdisk upgrade, makes it 2)", v)
}
