package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/vdiskfs/vdiskfs/image"
)

func newCreateCmd(e *env) *cobra.Command {
	mode := modeValue(0o644)
	cmd := &cobra.Command{
		Use:     "create STORE NAME SIZE",
		Short:   "Create an empty disk",
		Long:    "Create makes an empty disk called NAME of SIZE bytes. It takes no space until written.",
		Example: "  vdisk create /srv/vdisks.img vm1.raw 20G --mode 0600",
		Args:    exactArgs("STORE", "NAME", "SIZE"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			size, err := parseSize(args[2])
			if err != nil {
				return err
			}
			s, err := e.openStore(args[0], "create", false)
			if err != nil {
				return err
			}
			defer e.closeStore(s, &err)
			info, err := s.Create(args[1], size, image.Attr{Mode: uint32(mode), UID: uint32(os.Getuid()), GID: uint32(os.Getgid())})
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "created %s: %s\n", info.Name, formatSizeExact(info.Size))
			return nil
		},
	}
	cmd.Flags().Var(&mode, "mode", "permission bits of the disk file, in octal")
	return cmd
}
