package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newMountCmd is a placeholder: the fs package provides the real command and
// replaces this file, keeping this signature.
func newMountCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "mount STORE MOUNTPOINT",
		Short: "Mount a store: each disk becomes a raw image file",
		Args:  exactArgs("STORE", "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("vdisk mount is provided by the fs package (not built yet)")
		},
	}
}
