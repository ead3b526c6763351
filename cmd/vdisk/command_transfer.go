package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/telemetry"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// diffEntry is one changed range in `vdisk diff --json`.
type diffEntry struct {
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	Kind   string `json:"kind"` // "data" or "zero"
}

func newDiffCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "diff MOUNTPOINT/OLD MOUNTPOINT/NEW | STORE OLD NEW",
		Short: "List the byte ranges where one disk differs from another",
		Long: `Diff lists the byte ranges of disk NEW that differ from disk OLD: "data" where
NEW has bytes OLD does not, "zero" where NEW reads zeros over OLD's data.
For disks related by a snapshot or a clone the answer comes from the block
maps alone, without reading data (a block written since was copied on write,
so it maps elsewhere); for unrelated disks the data is compared where both
map blocks. The last line sums it up. With two arguments both disks are
files of one vdiskfs mount, and its daemon answers; with three, STORE is not
mounted.`,
		Example: `  vdisk diff /mnt/vdisks/vm1-monday.raw /mnt/vdisks/vm1-tuesday.raw
  vdisk diff /srv/vdisks.img vm1-monday.raw vm1-tuesday.raw`,
		Args: rangeArgs(2, "STORE", "OLD", "NEW"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			if len(args) == 2 {
				mnt, old, err := mountedDisk(args[0])
				if err != nil {
					return usageErrorf("%v; for a store that is not mounted: vdisk diff STORE OLD NEW", err)
				}
				mnt2, nd, err := mountedDisk(args[1])
				if err != nil || mnt2 != mnt {
					return usageErrorf("%s is not a disk of the mount %s", args[1], mnt)
				}
				rep, err := telemetry.Diff(mnt, old, nd)
				if err != nil {
					return err
				}
				return printDiff(e, rep.Changes, image.DiffStats{Related: rep.Related, ComparedBytes: rep.ComparedBytes}, asJSON)
			}
			s, err := e.openStore(args[0], "diff", true)
			if err != nil {
				return err
			}
			defer e.closeStore(s, &err)
			return runDiff(e, s, args[1], args[2], asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the ranges as JSON")
	return cmd
}

func runDiff(e *env, s *image.Store, oldName, newName string, asJSON bool) (err error) {
	old, err := s.OpenDisk(oldName)
	if err != nil {
		return err
	}
	defer e.closeDisk(old, &err)
	nd, err := s.OpenDisk(newName)
	if err != nil {
		return err
	}
	defer e.closeDisk(nd, &err)
	changes, st, err := image.Diff(old, nd)
	if err != nil {
		return err
	}
	return printDiff(e, changes, st, asJSON)
}

func printDiff(e *env, changes []image.Change, st image.DiffStats, asJSON bool) error {
	if asJSON {
		out := make([]diffEntry, 0, len(changes))
		for _, c := range changes {
			out = append(out, diffEntry{Offset: c.Off, Length: c.Len, Kind: kindOf(c)})
		}
		return writeJSON(e, out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OFFSET\tLENGTH\tKIND")
	var data, zero int64
	for _, c := range changes {
		fmt.Fprintf(tw, "%d\t%d\t%s\n", c.Off, c.Len, kindOf(c))
		if c.Zero {
			zero += c.Len
		} else {
			data += c.Len
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	how := "from the block maps, no data read"
	if !st.Related {
		how = fmt.Sprintf("unrelated disks: %s of data compared", formatSize(st.ComparedBytes))
	}
	fmt.Fprintf(e.stdout, "%d ranges: %s of data, %s of zeros (%s)\n", len(changes), formatSize(data), formatSize(zero), how)
	return nil
}

func kindOf(c image.Change) string {
	if c.Zero {
		return "zero"
	}
	return "data"
}

func newSendCmd(e *env) *cobra.Command {
	var from string
	var raw bool
	cmd := &cobra.Command{
		Use:   "send MOUNTPOINT/NAME | STORE NAME [--from OLD] > STREAM",
		Short: "Write a disk as a stream, complete or incremental",
		Long: `Send writes disk NAME to standard output as a stream that "vdisk receive"
turns back into a disk, on this host or another (through a pipe: vdisk
send ... | ssh host vdisk receive ...). The stream carries the disk's data
and size, its mode, owner and times, and its identity when it is a
snapshot; it names no other disk but its base. With --from OLD the stream
holds only what changed since OLD, which must be a snapshot (a clone or any
writable disk can change, so it is never a base) and which the receiver
must hold (received from an earlier stream; the receiver checks that its
copy has OLD's size and digest). The ranges come from the block maps, so
only changed data is read. Send snapshots ("vdisk snapshot"): a snapshot's
identity lets the next incremental stream start from it. A disk that is
not a snapshot is sent as it is at the start of the send (through a mount,
its daemon takes a hidden snapshot first, which makes a version-1 store
version 2 as any snapshot does, and removes it at the end), and no
incremental stream can start from its copy. NAME is a disk file of a
vdiskfs mount (its daemon sends it) or, with STORE, a disk of a store that
is not mounted. A progress bar is shown on a terminal (offline). The
stream format is in FORMAT.md ("Send stream").

An encrypted disk is sent as plaintext (its key must have been given to the
mount), unless --raw: then the stream holds its ciphertext, each block's
tweak and its key slots, needs no key, and the received disk opens with the
sender's keys (vdisk unlock). A raw stream goes only to a store of the same
block size; incremental raw streams work as plain ones do.`,
		Example: `  vdisk send /mnt/vdisks/vm1-monday.raw > vm1-monday.stream
  vdisk send /srv/vdisks.img vm1-tuesday.raw --from vm1-monday.raw | ssh backup vdisk receive /srv/vdisks.img vm1-tuesday.raw`,
		Args: rangeArgs(1, "STORE", "NAME"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			out := e.stdout
			if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				return errors.New("send: standard output is a terminal: redirect the stream to a file or a pipe")
			}
			if len(args) == 1 {
				mnt, disk, err := mountedDisk(args[0])
				if err != nil {
					return usageErrorf("%v; for a store that is not mounted: vdisk send STORE NAME", err)
				}
				send := telemetry.Send
				if raw {
					send = telemetry.SendRaw
				}
				n, err := send(mnt, disk, from, out)
				if err != nil {
					return fmt.Errorf("send %s: %w", disk, err)
				}
				fmt.Fprintf(e.stderr, "sent %s: a stream of %s\n", disk, formatSize(n))
				return nil
			}
			s, err := e.openStore(args[0], "send", true)
			if err != nil {
				return err
			}
			defer e.closeStore(s, &err)
			bar := e.newProgress(-1, "send") // until the changes are known
			defer bar.done()
			st, err := transfer.Send(out, s, args[1], transfer.SendOptions{From: from, Raw: raw, Progress: func(done, total int64) {
				bar.setTotal(total)
				bar.set(done)
			}})
			if err != nil {
				return err
			}
			bar.done()
			kind := "complete"
			if st.Incremental {
				kind = "incremental from " + from
			}
			fmt.Fprintf(e.stderr, "sent %s (%s): %s of data, %s of zeros in %d records\n",
				args[1], kind, formatSize(st.DataBytes), formatSize(st.ZeroBytes), st.Records)
			if !st.Snapshot {
				fmt.Fprintf(e.stderr, "%s is not a snapshot: no incremental stream can start from its copy (send snapshots, vdisk snapshot, for that)\n", args[1])
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "send only the changes since this snapshot")
	cmd.Flags().BoolVar(&raw, "raw", false, "an encrypted disk as stored: ciphertext, tweaks and key slots, no key needed")
	return cmd
}

func newReceiveCmd(e *env) *cobra.Command {
	var mode, owner string
	var encrypt bool
	var key keyFlags
	cmd := &cobra.Command{
		Use:   "receive MOUNTPOINT|STORE NAME [STREAM] [--mode MODE] [--owner UID[:GID]]",
		Short: "Make a disk from a stream of vdisk send",
		Long: `Receive reads a stream of "vdisk send" from the file STREAM, or from standard
input when STREAM is absent or "-", and makes it disk
NAME of STORE: a read-only snapshot holding the sent disk, with its
identity, so that a later incremental stream can be received on top of it.
Clone it to use it (cp NAME.raw vm.raw on a mount, instant and thin). The
disk gets the sent disk's permission bits (without setuid, setgid and
sticky bits), owner and times; --mode and --owner set others (the owner
as numbers or names, USER, USER:GROUP or :GROUP). A stream of a vdisk from
before streams carried ownership makes a disk of mode 0600 owned by root.
An incremental stream starts from this store's copy of its base snapshot
(found by identity, whatever its name here, and only among snapshots) and
is refused, creating nothing, when the store does not hold it or when the
copy's size or digest is not the sender's. The disk appears only once the
whole stream has arrived and verified: a cut or damaged stream leaves no
disk behind. Given the MOUNTPOINT of a vdiskfs mount, its daemon receives
the disk, and it shows in the mount; given a STORE, the store must not be
mounted.

With --encrypt --key-file F the disk is encrypted on arrival under a new key
of its own, sealed in a slot F opens (as vdisk create --encrypt). An
incremental stream on an encrypted base is encrypted under the base's key,
with or without --encrypt; it needs that key (F opens the base and unlocks
it, unless a mount has it unlocked already).`,
		Example: `  vdisk receive /mnt/vdisks vm1-monday.raw < vm1-monday.stream
  vdisk receive /srv/vdisks.img vm1-monday.raw vm1-monday.stream --mode 0640 --owner qemu:kvm`,
		Args: rangeArgs(2, "STORE", "NAME", "STREAM"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			o, err := receiveFlags(mode, owner)
			if err != nil {
				return err
			}
			if encrypt && !key.given() {
				return usageErrorf("--encrypt needs --key-file (or --passphrase-file)")
			}
			encrypt = key.given() // a key alone encrypts too, or opens an encrypted base
			in := io.Reader(os.Stdin)
			if len(args) == 3 && args[2] != "-" {
				f, err := os.Open(args[2])
				if err != nil {
					return fmt.Errorf("receive: %w", err)
				}
				defer f.Close()
				in = f
			}
			if mnt, err := canonicalMountpoint(args[0]); err == nil {
				if _, err := vdiskMountAt(mnt); err == nil {
					st, err := receiveMounted(mnt, args[1], in, o, encrypt, &key)
					if err != nil {
						return err
					}
					printReceived(e, args[1], st)
					return nil
				}
			}
			s, err := e.openStore(args[0], "receive", false)
			if err != nil {
				return err
			}
			defer e.closeStore(s, &err)
			if encrypt {
				if o.Key, err = key.secret(e); err != nil {
					return err
				}
				defer o.Key.Close()
			}
			return runReceive(e, in, s, args[1], o)
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "", "the disk's permission bits, in octal (at most 0777), instead of the sent disk's")
	cmd.Flags().StringVar(&owner, "owner", "", "the disk's owner, UID[:GID] or USER[:GROUP], instead of the sent disk's")
	cmd.Flags().BoolVar(&encrypt, "encrypt", false, "encrypt the received disk under a key of its own (needs --key-file)")
	key.add(cmd, "the key of the encrypted disk", true)
	return cmd
}

// receiveFlags turns --mode and --owner into transfer.ReceiveOptions.
func receiveFlags(mode, owner string) (transfer.ReceiveOptions, error) {
	var o transfer.ReceiveOptions
	if mode != "" {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m&^0o777 != 0 {
			return o, usageErrorf("--mode %q: permission bits in octal, at most 0777 (no setuid, setgid or sticky bit)", mode)
		}
		k := uint32(m)
		o.Mode = &k
	}
	if owner == "" {
		return o, nil
	}
	u, g, hasGroup := strings.Cut(owner, ":")
	if u == "" && (!hasGroup || g == "") || hasGroup && g == "" {
		return o, usageErrorf("--owner %q: UID[:GID], USER[:GROUP] or :GROUP", owner)
	}
	if u != "" {
		uid, err := ownerID(u, "user", func(name string) (string, error) {
			usr, err := user.Lookup(name)
			if err != nil {
				return "", err
			}
			return usr.Uid, nil
		})
		if err != nil {
			return o, err
		}
		o.UID = &uid
	}
	if g != "" {
		gid, err := ownerID(g, "group", func(name string) (string, error) {
			grp, err := user.LookupGroup(name)
			if err != nil {
				return "", err
			}
			return grp.Gid, nil
		})
		if err != nil {
			return o, err
		}
		o.GID = &gid
	}
	return o, nil
}

// ownerID is v as a number, or the id of the user or group named v.
func ownerID(v, what string, lookup func(string) (string, error)) (uint32, error) {
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return uint32(n), nil
	}
	id, err := lookup(v)
	if err != nil {
		return 0, usageErrorf("--owner: no %s %q: %v", what, v, err)
	}
	n, err := strconv.ParseUint(id, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("--owner: %s %q has id %q", what, v, id)
	}
	return uint32(n), nil
}

func runReceive(e *env, in io.Reader, s *image.Store, name string, o transfer.ReceiveOptions) error {
	bar := e.newProgress(-1, "receive") // a stream's length is not known
	defer bar.done()
	o.Progress = bar.set
	st, err := transfer.Receive(in, s, name, o)
	if err != nil {
		return err
	}
	bar.done()
	printReceived(e, name, st)
	return nil
}

func printReceived(e *env, name string, st transfer.Stats) {
	kind := "complete"
	if st.Incremental {
		kind = "incremental"
	}
	fmt.Fprintf(e.stdout, "received %s (%s stream): %s disk, %s of data, %s of zeros\n",
		name, kind, formatSize(st.Size), formatSize(st.DataBytes), formatSize(st.ZeroBytes))
}
