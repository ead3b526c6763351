package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func newRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "rm STORE|MOUNTPOINT NAME...",
		Short: "Remove disks and free their space",
		Long: `Rm removes each named disk and frees its blocks. A name that cannot be removed
is reported and the others are still removed; the exit code is then 8.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, rm unlinks the disks' files on the mount; a disk still open
there keeps its blocks until its last user closes it.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return fmt.Errorf("%s takes a store and at least one disk name, got %d arguments", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			a, err := e.openAccess(args[0], "rm", false)
			if err != nil {
				return err
			}
			defer e.closeAccess(a, &err)
			var errs []error
			for _, name := range args[1:] {
				if err := a.Remove(name); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintf(e.stdout, "removed %s\n", name)
			}
			return errors.Join(errs...)
		},
	}
}
