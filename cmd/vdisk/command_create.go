package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newCreateCmd(e *env) *cobra.Command {
	mode := modeValue(0o644)
	var encrypt bool
	var key keyFlags
	cmd := &cobra.Command{
		Use:   "create STORE|MOUNTPOINT NAME SIZE",
		Short: "Create an empty disk",
		Long: `Create makes an empty disk called NAME of SIZE bytes, owned by the caller. It
takes no space until written.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, create makes the disk through the mount (as touch and truncate
would), and the disk shows there at once.

With --encrypt the disk's data is encrypted (AES-XTS-256) under a random key
of its own, kept sealed in a key slot opened by --key-file (or, for a store
that is not mounted, --passphrase-file); through a mount the key file is
passed to the daemon open, and the disk is unlocked there at once. The store
becomes format version 3. See vdisk unlock and vdisk key.`,
		Example: `  vdisk create /srv/vdisks.img vm1.raw 20G --mode 0600
  vdisk create /mnt/vdisks vm2.raw 20G
  vdisk create /mnt/vdisks vm3.raw 20G --encrypt --key-file vm3.key`,
		Args: exactArgs("STORE", "NAME", "SIZE"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			size, err := parseSize(args[2])
			if err != nil {
				return err
			}
			if encrypt != key.given() {
				return usageErrorf("--encrypt needs --key-file (or --passphrase-file), and they need --encrypt")
			}
			a, err := e.openAccess(args[0], "create", false)
			if err != nil {
				return err
			}
			defer e.closeAccess(a, &err)
			if encrypt {
				return createEncrypted(e, a, args[1], size, uint32(mode), &key)
			}
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
	cmd.Flags().BoolVar(&encrypt, "encrypt", false, "encrypt the disk's data under a key of its own (needs --key-file)")
	key.add(cmd, "the key of the encrypted disk", true)
	return cmd
}
