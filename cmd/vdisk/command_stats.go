package main

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/telemetry"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
)

func newStatsCmd(e *env) *cobra.Command {
	var asJSON bool
	var watch float64
	var count int
	cmd := &cobra.Command{
		Use:   "stats MOUNTPOINT",
		Short: "Show a mount's I/O figures: request sizes in, backend I/O sizes out",
		Long: `Show what a running mount has done, layer by layer: requests in (reads and
writes, their count and average size), what the map and coalescer made of
them, and backend I/O out (count, average size, latency), commits, free
space and each disk, and the counters of each disk served on vhost-user
(vdisk vhost-user). The headline is the average request size in against the
average backend I/O size out: for 1 MiB sequential I/O both should be about
1 MiB.

--watch SECONDS prints one line of rates per interval, like iostat (--count N
stops after N lines). --json prints the whole snapshot.`,
		Args: exactArgs("MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if watch > 0 {
				return watchStats(e, args[0], time.Duration(watch*float64(time.Second)), count)
			}
			st, err := telemetry.Fetch(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e, st)
			}
			printStats(e.stdout, st)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the whole snapshot as JSON")
	cmd.Flags().Float64Var(&watch, "watch", 0, "print rates every SECONDS")
	cmd.Flags().IntVar(&count, "count", 0, "with --watch: stop after this many lines (0: never)")
	return cmd
}

func avg(bytes, n uint64) string {
	if n == 0 {
		return "-"
	}
	return formatSize(int64(bytes / n))
}

func ms(h image.HistogramSnapshot) string {
	if h.Count == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f ms", h.Mean()*1000)
}

// printStats writes the human table of one snapshot.
func printStats(w io.Writer, st *telemetry.Stats) {
	m, c := st.Metrics, st.Metrics.Counters
	fmt.Fprintf(w, "vdiskfs at %s (store %s, pid %d)\n\n", st.Mountpoint, st.Store, st.PID)
	fmt.Fprintf(w, "average request in: read %s, write %s    average backend I/O out: read %s, write %s\n\n",
		avg(c.ReadRequestBytes, c.ReadRequests), avg(c.WriteRequestBytes, c.WriteRequests),
		avg(c.DataReadBytes, c.DataReads), avg(c.DataWriteBytes, c.DataWrites))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LAYER\tOP\tCOUNT\tBYTES\tAVG SIZE\tAVG LATENCY")
	h := m.Histograms
	fmt.Fprintf(tw, "requests in\tread\t%d\t%s\t%s\t\n", c.ReadRequests, formatSize(int64(c.ReadRequestBytes)), avg(c.ReadRequestBytes, c.ReadRequests))
	fmt.Fprintf(tw, "requests in\twrite\t%d\t%s\t%s\t\n", c.WriteRequests, formatSize(int64(c.WriteRequestBytes)), avg(c.WriteRequestBytes, c.WriteRequests))
	fmt.Fprintf(tw, "map\tlookups\t%d\t\t%.2f segments\t\n", c.Lookups, ratio(c.LookupSegments, c.Lookups))
	fmt.Fprintf(tw, "map\tallocations\t%d\t%s\t%s\t\n", c.Allocations, formatSize(int64(c.AllocatedBlocks)*int64(m.BlockSize)),
		avg(c.AllocatedBlocks*uint64(m.BlockSize), c.Allocations))
	fmt.Fprintf(tw, "coalescer\tpieces→runs\t%d→%d\t\t\t\n", c.CoalescePieces, c.CoalesceRuns)
	fmt.Fprintf(tw, "backend out\tread\t%d\t%s\t%s\t%s\n", c.DataReads, formatSize(int64(c.DataReadBytes)), avg(c.DataReadBytes, c.DataReads), ms(h["data_read_latency_seconds"]))
	fmt.Fprintf(tw, "backend out\twrite\t%d\t%s\t%s\t%s\n", c.DataWrites, formatSize(int64(c.DataWriteBytes)), avg(c.DataWriteBytes, c.DataWrites), ms(h["data_write_latency_seconds"]))
	fmt.Fprintf(tw, "backend out\tflush\t%d\t\t\t%s\n", c.Flushes, ms(h["flush_latency_seconds"]))
	fmt.Fprintf(tw, "backend out\tdiscard\t%d\t\t\t\n", c.Discards)
	fmt.Fprintf(tw, "backend out\tprepare\t\t%s\t\t\n", formatSize(int64(c.PreparedBytes)))
	fmt.Fprintf(tw, "backend out\tmetadata\t%d\t%s\t\t\n", c.MetaWrites, formatSize(int64(c.MetaWriteBytes)))
	fmt.Fprintf(tw, "backend out\terrors\t%d\t\t\t\n", c.Errors)
	for _, r := range image.DeclineReasons() {
		if n := c.PlanDeclines[r]; n > 0 {
			fmt.Fprintf(tw, "queue threads\tdeclined: %s\t%d\t\t\t\n", r, n)
		}
	}
	fmt.Fprintf(tw, "journal\tcommits\t%d\t%s\t\t%s\n", c.Commits, formatSize(int64(c.JournalBytes)), ms(h["journal_commit_latency_seconds"]))
	fmt.Fprintf(tw, "journal\tcheckpoints\t%d\t\t\t\n", c.Checkpoints)
	tw.Flush()
	bs := int64(m.BlockSize)
	var mapped int64
	for _, d := range m.Disks {
		mapped += d.Allocated
	}
	fmt.Fprintf(w, "\nfree %s of %s (%s of it reserved for placement), largest free extent %s, %d extents (average %s)\n\n",
		formatSize(int64(m.FreeBlocks)*bs), formatSize(int64(m.DataBlocks)*bs), formatSize(int64(m.ReservedBlocks)*bs),
		formatSize(int64(m.LargestFreeBlock)*bs), m.Extents, formatSize(avgExtent(mapped, m.Extents)))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DISK\tSIZE\tALLOCATED\tEXTENTS\tAVG-EXTENT\tREADS\tREAD BYTES\tWRITES\tWRITE BYTES")
	for _, d := range m.Disks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%d\t%s\n", d.Name, formatSize(d.Size), formatSize(d.Allocated), d.Extents,
			formatSize(avgExtent(d.Allocated, d.Extents)),
			d.ReadRequests, formatSize(int64(d.ReadRequestBytes)), d.WriteRequests, formatSize(int64(d.WriteRequestBytes)))
	}
	tw.Flush()
	if len(st.FUSE) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "FUSE OP\tCOUNT\tAVG LATENCY\tP99 ≤")
		ops := make([]string, 0, len(st.FUSE))
		for op := range st.FUSE {
			ops = append(ops, op)
		}
		sort.Strings(ops)
		for _, op := range ops {
			h := st.FUSE[op]
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.3g ms\n", op, h.Count, ms(h), h.Quantile(0.99)*1000)
		}
		tw.Flush()
	}
	printVhostUser(w, st.VhostUser)
}

// printVhostUser writes the counters of the disks served on vhost-user:
// per request type, then each device's events.
func printVhostUser(w io.Writer, us []telemetry.VhostUser) {
	if len(us) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VHOST-USER DISK\tOP\tCOUNT\tBYTES\tERRORS\tAVG LATENCY")
	for _, u := range us {
		s := u.Stats
		for _, op := range []struct {
			name string
			o    blk.OpStats
		}{{"read", s.Read}, {"write", s.Write}, {"flush", s.Flush}, {"discard", s.Discard}, {"write_zeroes", s.WriteZeroes}, {"get_id", s.GetID}} {
			if op.o.Requests == 0 && op.name != "read" && op.name != "write" {
				continue
			}
			lat := "-"
			if op.o.Requests > 0 {
				lat = fmt.Sprintf("%.3f ms", float64(op.o.Latency.Sum.Microseconds())/1000/float64(op.o.Requests))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\n", u.Disk, op.name, op.o.Requests, formatSize(int64(op.o.Bytes)), op.o.Errors, lat)
		}
	}
	tw.Flush()
	for _, u := range us {
		s := u.Stats
		state := "no frontend"
		if s.Connected {
			state = "connected"
		}
		fmt.Fprintf(w, "%s on %s: %s, %d in flight, %d connects (%d reconnects, %d refused), %d resubmitted, %d on the blocking path, %d vectored, %d staged, %d held for a commit, %d bad, %d unsupported\n",
			u.Disk, u.Socket, state, s.Inflight, s.Connects, s.Reconnects, s.Refused, s.Resubmitted, s.Fallbacks, s.Vectored, s.Staged, s.Held, s.Bad, s.Unsupported)
	}
}

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// watchStats prints one line of rates per interval, iostat style.
func watchStats(e *env, mnt string, every time.Duration, count int) error {
	prev, err := telemetry.Fetch(mnt)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "time\tr/s\tw/s\trMB/s\twMB/s\treq KiB\tbe r/s\tbe w/s\tbe KiB\tflush/s\tcommit/s\t")
	tw.Flush()
	for i := 0; count == 0 || i < count; i++ {
		time.Sleep(every)
		cur, err := telemetry.Fetch(mnt)
		if err != nil {
			return err
		}
		a, b := prev.Metrics.Counters, cur.Metrics.Counters
		dt := cur.Time.Sub(prev.Time).Seconds()
		rate := func(x, y uint64) float64 { return float64(y-x) / dt }
		reqs := (b.ReadRequests - a.ReadRequests) + (b.WriteRequests - a.WriteRequests)
		reqBytes := (b.ReadRequestBytes - a.ReadRequestBytes) + (b.WriteRequestBytes - a.WriteRequestBytes)
		ios := (b.DataReads - a.DataReads) + (b.DataWrites - a.DataWrites)
		ioBytes := (b.DataReadBytes - a.DataReadBytes) + (b.DataWriteBytes - a.DataWriteBytes)
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t\n",
			cur.Time.Format("15:04:05"),
			rate(a.ReadRequests, b.ReadRequests), rate(a.WriteRequests, b.WriteRequests),
			rate(a.ReadRequestBytes, b.ReadRequestBytes)/1e6, rate(a.WriteRequestBytes, b.WriteRequestBytes)/1e6,
			ratio(reqBytes, reqs)/1024,
			rate(a.DataReads, b.DataReads), rate(a.DataWrites, b.DataWrites), ratio(ioBytes, ios)/1024,
			rate(a.Flushes, b.Flushes), rate(a.Commits, b.Commits))
		tw.Flush()
		prev = cur
	}
	return nil
}
