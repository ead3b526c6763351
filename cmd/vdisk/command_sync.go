package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vdiskfs/vdiskfs/telemetry"
)

func newSyncCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "sync MOUNTPOINT...",
		Short: "Commit a mounted store now: everything written so far becomes durable",
		Long: `Sync commits the store mounted at each MOUNTPOINT and returns once every write
acknowledged before it, to any disk of the store, is durable (as an fsync of
every disk would make it), together with the disks' sizes, names and times.

sync(1) and syncfs(2) do not reach a FUSE file system's daemon (the kernel
asks only virtiofs), so they make nothing of a vdiskfs mount durable; scripts
that need a store-wide durability point, before a snapshot of the backing or
a backup, run "vdisk sync MOUNTPOINT". Without it, writes are committed by an
fsync of the disk, a synchronous write (O_SYNC, O_DSYNC), the commit timer
(--commit-interval) and the unmount.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("%s takes at least one mount point", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var errs []error
			for _, mnt := range args {
				if err := telemetry.Sync(mnt); err != nil {
					errs = append(errs, err)
				}
			}
			if len(errs) > 0 {
				return fmt.Errorf("vdisk sync: %w", errors.Join(errs...))
			}
			return nil
		},
	}
}
