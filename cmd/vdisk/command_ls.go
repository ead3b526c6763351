package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/telemetry"
)

// lsEntry is one disk in `vdisk ls --json`.
type lsEntry struct {
	Name      string    `json:"name"`
	ID        uint64    `json:"id"`
	Size      int64     `json:"size"`
	Allocated int64     `json:"allocated"`
	Extents   int       `json:"extents"`
	AvgExtent int64     `json:"avg_extent_bytes"` // allocated / extents
	Mode      string    `json:"mode"`
	UID       uint32    `json:"uid"`
	GID       uint32    `json:"gid"`
	Modified  time.Time `json:"modified"`
	Changed   time.Time `json:"changed"`
	// Sharing: Shared is the part of Allocated in blocks other disks map
	// too, Exclusive the rest (Allocated = Exclusive + Shared). A snapshot
	// or a clone names its origin (empty once that disk is removed;
	// OriginID stays).
	Exclusive int64  `json:"exclusive_bytes"`
	Shared    int64  `json:"shared_bytes"`
	Snapshot  bool   `json:"snapshot"`
	Clone     bool   `json:"clone"`
	Origin    string `json:"origin"`
	OriginID  uint64 `json:"origin_id,omitempty"`
	// Encrypted: the disk's data is encrypted; Locked: its key has not
	// been given to the mount (vdisk unlock, mount --key-dir).
	Encrypted bool `json:"encrypted"`
	Locked    bool `json:"locked"`
	// VhostUser is the sockets the disk is served on (vdisk vhost-user),
	// for a store listed through its mount.
	VhostUser []string `json:"vhost_user,omitempty"`
}

// lsEntryOf is the JSON entry of a disk.
func lsEntryOf(d image.DiskInfo) lsEntry {
	return lsEntry{Name: d.Name, ID: d.ID, Size: d.Size, Allocated: d.Allocated, Extents: d.Extents,
		AvgExtent: avgExtent(d.Allocated, d.Extents), Mode: fmt.Sprintf("%04o", d.Mode&0o7777), UID: d.UID, GID: d.GID,
		Modified: d.Mtime, Changed: d.Ctime, Exclusive: d.Allocated - d.Shared, Shared: d.Shared,
		Snapshot: d.Snapshot, Clone: d.Clone, Origin: d.Origin, OriginID: d.OriginID,
		Encrypted: d.Encrypted, Locked: d.Locked}
}

func newLsCmd(e *env) *cobra.Command {
	var asJSON, bytes bool
	cmd := &cobra.Command{
		Use:   "ls STORE|MOUNTPOINT",
		Short: "List the disks of a store",
		Long: `Ls lists the disks of STORE sorted by name: size, space allocated (every block
the disk maps, as du counts it), split into exclusive (blocks no other disk
maps: what removing the disk frees) and shared (blocks it shares with clones
and snapshots), number of extents in the block map and their average size (a
disk written in random order has more, smaller extents, and reads back in
smaller I/Os), modification time, and origin: "snapshot of DISK" or "clone of
DISK" (a whole-disk cp on the mount), else "-". When the store holds
encrypted disks, a last column ENCRYPTION says "encrypted", "locked"
(encrypted, its key not given to the mount: vdisk unlock), or "-".

STORE may be mounted: given its mount point, or its path while a daemon
serves it, ls asks the daemon, and lists what the mount shows now, with
the sockets each disk is served on as a vhost-user-blk device (a
VHOST-USER column, when any is).`,
		Args: exactArgs("STORE"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			a, err := e.openAccess(args[0], "ls", true)
			if err != nil {
				return err
			}
			defer e.closeAccess(a, &err)
			disks, err := a.List() // sorted by name
			if err != nil {
				return err
			}
			served := map[string][]string{} // disk -> sockets
			if m, ok := a.(mountedStore); ok {
				us, err := telemetry.VhostUsers(m.mnt)
				if err != nil && !errors.Is(err, image.ErrNotExist) { // a daemon without the door answers 404
					return err
				}
				for _, u := range us {
					served[u.Disk] = append(served[u.Disk], u.Socket)
				}
			}
			if asJSON {
				out := make([]lsEntry, 0, len(disks))
				for _, d := range disks {
					le := lsEntryOf(d)
					le.VhostUser = served[d.Name]
					out = append(out, le)
				}
				return writeJSON(e, out)
			}
			size := formatSize
			if bytes {
				size = func(n int64) string { return strconv.FormatInt(n, 10) }
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
			enc := anyEncrypted(disks)
			header := "NAME\tSIZE\tALLOCATED\tEXCLUSIVE\tSHARED\tEXTENTS\tAVG-EXTENT\tMODIFIED\tORIGIN" + encryptionColumn(enc, nil)
			if len(served) > 0 {
				header += "\tVHOST-USER"
			}
			fmt.Fprintln(tw, header)
			for _, d := range disks {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s%s", d.Name, size(d.Size), size(d.Allocated),
					size(d.Allocated-d.Shared), size(d.Shared), d.Extents, size(avgExtent(d.Allocated, d.Extents)),
					d.Mtime.Local().Format("2006-01-02 15:04:05"), originOf(d), encryptionColumn(enc, &d))
				if len(served) > 0 {
					socks := "-"
					if len(served[d.Name]) > 0 {
						socks = strings.Join(served[d.Name], ",")
					}
					fmt.Fprintf(tw, "\t%s", socks)
				}
				fmt.Fprintln(tw)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().BoolVarP(&bytes, "bytes", "b", false, "print sizes in bytes")
	return cmd
}

// writeJSON prints v as indented JSON on stdout.
func writeJSON(e *env, v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
