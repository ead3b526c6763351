package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newCreateCmd(e *env) *cobra.Command {
	mode := modeValue(0o644)
	cmd := &cobra.Command{
		Use:   "create STORE|MOUNTPOINT NAME SIZE",
		Short: "Create an empty disk",
		Long: `Create makes an empty disk called NAME of SIZE bytes, owned by the caller. It
takes no space until written.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, create makes the disk through the mount (as touch and truncate
would), and the disk shows there at once.`,
		Example: `  vdisk create /srv/vdisks.img vm1.raw 20G --mode 0600
  vdisk create /mnt/vdisks vm2.raw 20G`,
		Args: exactArgs("STORE", "NAME", "SIZE"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			size, err := parseSize(args[2])
			if err != nil {
				return err
			}
			a, err := e.openAccess(args[0], "create", false)
			if err != nil {
				return err
			}
			defer e.closeAccess(a, &err)
			d, err := a.Create(args[1], size, uint32(mode))
			if err != nil {
				return err
			}
			if err := d.Close(); err != nil {
				return fmt.Errorf("create %s: %w", args[1], err)
			}
			fmt.Fprintf(e.stdout, "created %s: %s\n", args[1], formatSizeExact(size))
			return nil
		},
	}
	cmd.Flags().Var(&mode, "mode", "permission bits of the disk file, in octal")
	return cmd
}
