package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/telemetry"
)

func newVhostUserCmd(e *env) *cobra.Command {
	var stop bool
	cmd := &cobra.Command{
		Use:   "vhost-user MOUNTPOINT/DISK SOCKET | vhost-user --stop SOCKET",
		Short: "Serve a disk of a mount to a virtual machine as a vhost-user-blk device",
		Long: `vhost-user asks the daemon of the mount that holds DISK to serve it as a
vhost-user-blk device on the Unix socket SOCKET, and returns once the socket
listens. A virtual machine then reaches the disk through its own memory,
without the kernel's FUSE copy: QEMU with

  -object memory-backend-memfd,id=mem,size=RAM,share=on -machine memory-backend=mem
  -chardev socket,id=vu0,path=SOCKET,reconnect=1
  -device vhost-user-blk-pci,chardev=vu0,num-queues=N

and cloud-hypervisor with --memory size=RAM,shared=on and
--disk vhost_user=on,socket=SOCKET,num_queues=N. One frontend at a time: a
second connection while one is served is refused. The disk stays a file in
the mount: cp, vdisk snapshot, send and stats work while the VM runs, and a
resize of the file reaches the guest as a config change. A flush from the
guest is an fsync of the file.

The daemon creates SOCKET (mode 0600, or 0660 and the group of the mount's
--socket-group), owned by the user it runs as; the caller must be allowed to
write DISK and to create files in SOCKET's directory. "vdisk mount
--vhost-user-dir DIR" serves every disk as DIR/NAME.sock without this
command.

--stop SOCKET ends the server on SOCKET: the frontend is disconnected and
the socket removed; removing the disk, or unmounting, ends it too. "vdisk ls
MOUNTPOINT" shows the served disks, "vdisk stats MOUNTPOINT" their counters.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if stop {
				if len(args) != 1 {
					return usageErrorf("vhost-user --stop takes 1 argument (SOCKET), got %d", len(args))
				}
				return nil
			}
			if len(args) != 2 {
				return usageErrorf("vhost-user takes 2 arguments (MOUNTPOINT/DISK SOCKET), got %d", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if stop {
				return stopVhostUser(e, args[0])
			}
			mnt, disk, err := mountedDisk(args[0])
			if err != nil {
				return usageErrorf("%v", err)
			}
			u, err := telemetry.ServeVhostUser(mnt, disk, args[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "serving %s on %s (vhost-user-blk)\n", filepath.Join(mnt, u.Disk), u.Socket)
			return nil
		},
	}
	cmd.Flags().BoolVar(&stop, "stop", false, "stop serving on SOCKET")
	return cmd
}

// stopVhostUser asks each vdiskfs mount of this mount namespace in turn to
// stop its server on socket, until one does. Mounts whose daemon does not
// answer (dead mounts) are passed over.
func stopVhostUser(e *env, socket string) error {
	ms, err := readMountinfo(0)
	if err != nil {
		return err
	}
	var errs []error
	silent := 0
	for _, m := range ms {
		if !isVdiskMount(m) {
			continue
		}
		err := telemetry.StopVhostUser(m.mountpoint, socket)
		switch {
		case err == nil:
			fmt.Fprintf(e.stdout, "stopped serving on %s (mount %s)\n", socket, m.mountpoint)
			return nil
		case errors.Is(err, telemetry.ErrNotServing):
			silent++
		case !errors.Is(err, image.ErrNotExist):
			errs = append(errs, fmt.Errorf("mount %s: %w", m.mountpoint, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if silent > 0 {
		return fmt.Errorf("no vdiskfs mount serves %s (%d mounts here did not answer): %w", socket, silent, image.ErrNotExist)
	}
	return fmt.Errorf("no vdiskfs mount serves %s: %w", socket, image.ErrNotExist)
}
