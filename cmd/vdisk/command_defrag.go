package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// defragEntry is one disk in `vdisk defrag --json`.
type defragEntry struct {
	Name            string `json:"name"`
	ExtentsBefore   int    `json:"extents_before"`
	ExtentsAfter    int    `json:"extents_after"`
	AvgExtentBefore int64  `json:"avg_extent_bytes_before"`
	AvgExtentAfter  int64  `json:"avg_extent_bytes_after"`
	MappedBytes     int64  `json:"mapped_bytes"`
	MovedBytes      int64  `json:"moved_bytes"`
	// FreeRuns is how many separate runs of free blocks the data went to:
	// 1 unless no free run was large enough.
	FreeRuns int `json:"free_runs"`
	// Skipped says why the disk was left alone; Error why it failed.
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`
}

func newDefragCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "defrag STORE|MOUNTPOINT [NAME...]",
		Short: "Rewrite fragmented disks into contiguous extents",
		Long: `Defrag moves the data of each named disk (of every disk when no name is given)
into one contiguous run of free blocks, so that sequential reads of it reach
the backing in large I/Os again. A disk written in random order before
placement followed the virtual offset can have an extent per 4 KiB block.

The copy goes 64 MiB of the disk at a time into new blocks, each part
committed like any write, so a crash or an interrupted defrag leaves every
disk reading what it held. Holes stay holes. A disk already contiguous is
left alone, and so is one the free space cannot improve (less free space
than the disk's data, or only in smaller runs than the disk lies in now).
When no free run holds a disk, it goes to the largest ones and the output
says how many; the blocks it left are free afterwards, so a second defrag
may join those runs.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, the daemon defragments each disk while it may be in use (each
part under the disk's range lock, ordered with the disk's own requests;
no byte changes; a user other than root needs read permission on the
disk).

Defrag prints a line per disk (extents before and after, average extent
size, bytes moved) and, offline, shows a progress bar when stderr is a
terminal. A disk that fails is reported and the others are still
defragmented; the exit code is then 8.`,
		Example: `  vdisk defrag /srv/vdisks.img
  vdisk defrag --json /srv/vdisks.img vm1.raw
  vdisk defrag /mnt/vdisks vm1.raw`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 {
				return fmt.Errorf("%s takes a store and optionally disk names, got no arguments", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDefrag(e, args[0], args[1:], asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array, one object per disk")
	return cmd
}

func runDefrag(e *env, path string, names []string, asJSON bool) (err error) {
	a, err := e.openAccess(path, "defrag", false)
	if errors.Is(err, backend.ErrLocked) {
		return fmt.Errorf("%w; defrag needs the store to itself, or its mount: unmount it (vdisk umount) or stop its holder first, or give the mount point of a vdiskfs mount of it", err)
	}
	if err != nil {
		return err
	}
	defer e.closeAccess(a, &err)
	if len(names) == 0 {
		disks, err := a.List()
		if err != nil {
			return err
		}
		for _, d := range disks {
			names = append(names, d.Name)
		}
		if len(names) == 0 && !asJSON {
			fmt.Fprintf(e.stdout, "%s holds no disks\n", path)
		}
	}
	entries := make([]defragEntry, 0, len(names))
	var errs []error
	for _, name := range names {
		res, err := defragWithProgress(e, a, name)
		entry := defragEntryOf(res)
		if err != nil {
			errs = append(errs, err)
			entry.Error = err.Error()
		}
		entries = append(entries, entry)
		if !asJSON && err == nil {
			fmt.Fprintln(e.stdout, entry.summary())
		}
	}
	if asJSON {
		if err := writeJSON(e, entries); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

// defragWithProgress defragments one disk with a progress bar, shown once
// there is something to copy (offline: the daemon of a mount reports no
// progress).
func defragWithProgress(e *env, a storeAccess, name string) (image.DefragResult, error) {
	var bar *progress
	res, err := a.Defrag(name, func(done, total uint64) {
		if bar == nil {
			bar = e.newProgress(int64(total), "defrag "+name)
		}
		bar.set(int64(done))
	})
	if bar != nil {
		bar.done()
	}
	return res, err
}

func defragEntryOf(r image.DefragResult) defragEntry {
	return defragEntry{
		Name:            r.Name,
		ExtentsBefore:   r.ExtentsBefore,
		ExtentsAfter:    r.ExtentsAfter,
		AvgExtentBefore: avgExtent(r.MappedBytes, r.ExtentsBefore),
		AvgExtentAfter:  avgExtent(r.MappedBytes, r.ExtentsAfter),
		MappedBytes:     r.MappedBytes,
		MovedBytes:      r.MovedBytes,
		FreeRuns:        r.FreeRuns,
		Skipped:         r.Skipped,
	}
}

// summary is the disk's line in the text output.
func (d defragEntry) summary() string {
	if d.Skipped != "" {
		return fmt.Sprintf("%s: %s (%s, %s per extent on average)", d.Name, d.Skipped, extents(d.ExtentsBefore), formatSize(d.AvgExtentBefore))
	}
	line := fmt.Sprintf("%s: %d → %s, average extent %s → %s, moved %s", d.Name, d.ExtentsBefore, extents(d.ExtentsAfter),
		formatSize(d.AvgExtentBefore), formatSize(d.AvgExtentAfter), formatSize(d.MovedBytes))
	if d.FreeRuns > 1 {
		line += fmt.Sprintf(" (no free run held it all: it went to %d; run defrag again to join them)", d.FreeRuns)
	}
	return line
}

// extents is "1 extent" or "N extents".
func extents(n int) string {
	if n == 1 {
		return "1 extent"
	}
	return fmt.Sprintf("%d extents", n)
}
