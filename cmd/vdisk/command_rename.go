package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vdiskfs/vdiskfs/image"
)

func newRenameCmd(e *env) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rename STORE|MOUNTPOINT OLD NEW",
		Short: "Rename a disk",
		Long: `Rename gives disk OLD the name NEW. If a disk called NEW exists, rename refuses
unless --force is given, which removes that disk first (like mv).

STORE may be mounted: given its mount point, or its path while a daemon
serves it, rename renames the file on the mount (a hypervisor that has the
disk open keeps using it).`,
		Args: exactArgs("STORE", "OLD", "NEW"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			oldName, newName := args[1], args[2]
			a, err := e.openAccess(args[0], "rename", false)
			if err != nil {
				return err
			}
			defer e.closeAccess(a, &err)
			if err := a.Rename(oldName, newName, force); err != nil {
				if errors.Is(err, image.ErrExist) {
					return fmt.Errorf("%w (use --force to replace it)", err)
				}
				return err
			}
			fmt.Fprintf(e.stdout, "renamed %s to %s\n", oldName, newName)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "replace a disk already called NEW")
	return cmd
}
