package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vdiskfs/vdiskfs/image"
)

func newResizeCmd(e *env) *cobra.Command {
	var shrink bool
	cmd := &cobra.Command{
		Use:   "resize STORE|MOUNTPOINT NAME SIZE",
		Short: "Grow or shrink a disk",
		Long: `Resize sets the size of disk NAME to SIZE, or changes it by +SIZE or -SIZE.
Growing adds a hole (it reads as zeros and takes no space). Shrinking frees
every block past the new size and loses their data, so it needs --shrink.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, resize truncates the file on the mount, as truncate(1) would.`,
		Example: `  vdisk resize /srv/vdisks.img vm1.raw 40G
  vdisk resize /srv/vdisks.img vm1.raw +10G
  vdisk resize --shrink /srv/vdisks.img vm1.raw -- -10G
  vdisk resize /mnt/vdisks vm1.raw +10G`,
		Args: exactArgs("STORE", "NAME", "SIZE"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			name, arg := args[1], args[2]
			sign := int64(0)
			switch {
			case strings.HasPrefix(arg, "+"):
				sign, arg = 1, arg[1:]
			case strings.HasPrefix(arg, "-"):
				sign, arg = -1, arg[1:]
			}
			n, err := parseSize(arg)
			if err != nil {
				return err
			}
			a, err := e.openAccess(args[0], "resize", false)
			if err != nil {
				return err
			}
			defer e.closeAccess(a, &err)
			old, err := a.Size(name)
			if err != nil {
				return err
			}
			size := n
			if sign != 0 {
				size = old + sign*n
				if sign > 0 && size < old || size > image.MaxDiskSize {
					return fmt.Errorf("resize %s: %s + %s: %w", name, formatSize(old), formatSize(n), image.ErrTooLarge)
				}
				if size < 0 {
					return fmt.Errorf("resize %s: %s - %s is negative", name, formatSize(old), formatSize(n))
				}
			}
			if size < old && !shrink {
				return fmt.Errorf("resize %s from %s to %s would drop data past the new end: use --shrink", name, formatSize(old), formatSize(size))
			}
			if err := a.Resize(name, size); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "resized %s from %s to %s\n", name, formatSizeExact(old), formatSizeExact(size))
			return nil
		},
	}
	cmd.Flags().BoolVar(&shrink, "shrink", false, "allow making the disk smaller (data past the new size is lost)")
	return cmd
}
