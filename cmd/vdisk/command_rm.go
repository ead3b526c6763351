package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func newRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "rm STORE NAME...",
		Short: "Remove disks and free their space",
		Long: `Rm removes each named disk and frees its blocks. A name that cannot be removed
is reported and the others are still removed; the exit code is then 8.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return fmt.Errorf("%s takes a store and at least one disk name, got %d arguments", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			s, err := e.openStore(args[0], "rm", false)
			if err != nil {
				return err
			}
			defer e.closeStore(s, &err)
			var errs []error
			for _, name := range args[1:] {
				if err := s.Remove(name); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintf(e.stdout, "removed %s\n", name)
			}
			return errors.Join(errs...)
		},
	}
}
