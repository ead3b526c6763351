package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/vdiskfs/vdiskfs/image"
)

func newRenameCmd(e *env) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rename STORE OLD NEW",
		Short: "Rename a disk",
		Long: `Rename gives disk OLD the name NEW. If a disk called NEW exists, rename refuses
unless --force is given, which removes that disk first (like mv).`,
		Args: exactArgs("STORE", "OLD", "NEW"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			oldName, newName := args[1], args[2]
			s, err := e.openStore(args[0], "rename", false)
			if err != nil {
				return err
			}
			defer e.closeStore(s, &err)
			if _, err := s.Stat(oldName); err != nil {
				return err
			}
			if _, err := s.Stat(newName); err == nil && oldName != newName && !force {
				return fmt.Errorf("rename %q: %q: %w (use --force to replace it)", oldName, newName, image.ErrExist)
			}
			if err := s.Rename(oldName, newName); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "renamed %s to %s\n", oldName, newName)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "replace a disk already called NEW")
	return cmd
}
