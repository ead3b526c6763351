package main

// Stores on Ceph RBD images.
//
// Every command that takes STORE also takes an RBD store name,
// rbd:POOL/IMAGE or rbd:POOL/NAMESPACE/IMAGE, with QEMU's optional
// suffixes :id=USER, :conf=FILE and :OPTION=VALUE (backend.RBDName), and
// the flags --ceph-conf and --ceph-user (or --id). Before the command runs,
// storeName folds the flags into the name, so that everything after it
// carries them: the mount daemon's arguments, the mount's source in
// /proc/mounts, and so vdisk umount. Without them librados reads CEPH_CONF
// and CEPH_ARGS, as the ceph and rbd commands do.

import (
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// cephFlags are --ceph-conf and --ceph-user (--id).
type cephFlags struct {
	conf, user string
}

// storeCommands are the commands whose first argument is STORE (for mount,
// only when it is given two).
var storeCommands = map[string]bool{
	"format": true, "mount": true, "create": true, "ls": true, "info": true, "rm": true,
	"resize": true, "rename": true, "import": true, "export": true, "fsck": true,
}

// addStoreFlags gives c the Ceph flags and resolves its STORE argument with
// storeName before c runs.
func addStoreFlags(e *env, c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&e.ceph.conf, "ceph-conf", "", "for an rbd:POOL/IMAGE store: the Ceph configuration file (default $CEPH_CONF, else /etc/ceph/ceph.conf)")
	f.StringVar(&e.ceph.user, "ceph-user", "", "for an rbd:POOL/IMAGE store: the Ceph client id, client.ID (default from $CEPH_ARGS, else admin)")
	f.StringVar(&e.ceph.user, "id", "", "the same as --ceph-user")
	run := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		i := 0
		if cmd.Name() == "mount" && len(args) < 2 {
			i = -1 // the default store
		}
		if i < 0 || i >= len(args) {
			if e.ceph != (cephFlags{}) {
				return usageErrorf("--ceph-conf and --ceph-user apply to an rbd:POOL/IMAGE store only")
			}
			return run(cmd, args)
		}
		name, err := e.storeName(args[i])
		if err != nil {
			return err
		}
		args = slices.Clone(args)
		args[i] = name
		return run(cmd, args)
	}
}

// storeName returns the STORE argument s with the Ceph flags folded in when
// it is an RBD store name, and s itself otherwise (where the flags are an
// error).
func (e *env) storeName(s string) (string, error) {
	if !backend.IsRBD(s) {
		if e.ceph != (cephFlags{}) {
			return "", usageErrorf("--ceph-conf and --ceph-user apply to an rbd:POOL/IMAGE store only, not to %s", s)
		}
		return s, nil
	}
	n, err := backend.ParseRBDName(s)
	if err != nil {
		return "", usageErrorf("%v", err)
	}
	if e.ceph.conf != "" {
		// Absolute: the name outlives this command's directory (the mount
		// daemon, vdisk umount).
		if n.Conf, err = filepath.Abs(e.ceph.conf); err != nil {
			return "", err
		}
	}
	if e.ceph.user != "" {
		n.User = e.ceph.user
	}
	return n.String(), nil
}
