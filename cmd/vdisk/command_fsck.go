package main

import (
	"errors"
	"fmt"
	"slices"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/telemetry"
)

// codeUnreadable is the finding fsck reports when the store is too damaged
// to open at all (Open fails with image.ErrCorrupt).
const codeUnreadable = "store-unreadable"

// fsckSummary is what a check counted.
type fsckSummary struct {
	Disks        int    `json:"disks"`
	Extents      int    `json:"extents"`
	MappedBlocks uint64 `json:"mapped_blocks"`
	AvgExtent    int64  `json:"avg_extent_bytes"` // fragmentation: mapped bytes per extent
	BlockSize    int    `json:"block_size"`
	DataBlocks   uint64 `json:"data_blocks"`
	UsedBlocks   uint64 `json:"used_blocks"`
	FreeBlocks   uint64 `json:"free_blocks"`
	LeakedBlocks uint64 `json:"leaked_blocks"`
}

// fsckFinding is an image.Finding in fsck's JSON output.
type fsckFinding struct {
	Severity string `json:"severity"` // "fatal" or "leak"
	Code     string `json:"code"`     // image.Code*, or codeUnreadable
	Disk     string `json:"disk,omitempty"`
	Message  string `json:"message"`
}

func (f fsckFinding) String() string {
	return image.Finding{Severity: severityOf(f.Severity), Code: f.Code, Disk: f.Disk, Message: f.Message}.String()
}

func severityOf(s string) image.Severity {
	if s == image.Leak.String() {
		return image.Leak
	}
	return image.Fatal
}

// fsckCheck is one run of Store.Check.
type fsckCheck struct {
	Findings []fsckFinding `json:"findings"`
	Summary  fsckSummary   `json:"summary"`
}

// fsckResult is the output of `vdisk fsck --json`: the check, what a repair
// did and what a check found after it, and the exit code with its meaning.
type fsckResult struct {
	Store string `json:"store"`
	// Mountpoint is set when the store is mounted: its daemon checked it,
	// as it is now (fsckMounted).
	Mountpoint string `json:"mountpoint,omitempty"`
	fsckCheck
	// Repaired lists the repair's actions, one sentence each (--repair).
	Repaired []string `json:"repaired"`
	// RepairError is set when the repair failed or left findings.
	RepairError string `json:"repair_error,omitempty"`
	// After is the check after a repair.
	After    *fsckCheck `json:"after,omitempty"`
	ExitCode int        `json:"exit_code"`
	Result   string     `json:"result"`
}

func newFsckCmd(e *env) *cobra.Command {
	var repair, force, asJSON bool
	cmd := &cobra.Command{
		Use:   "fsck STORE|MOUNTPOINT",
		Short: "Check a store and optionally repair it",
		Long: `Fsck checks every structure of STORE: superblocks, journal, each disk's name
and block map, that no two disks share a block, and that the free map holds
exactly the blocks nobody uses. It prints one line per finding, a summary,
and what the exit code means. Leaked blocks (space used by nothing) put no
data at risk; every other finding is fatal.

With --repair, fsck first checks read-only, then reopens the store for writing
and fixes what it found: it never invents data; a range of a disk it cannot
trust is unmapped (reads zeros) and the output says how much each disk lost.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, fsck asks the daemon to check the store as it is now (writes
wait while it runs) and reports as above. A repair needs the store
unmounted, so --repair on a mounted store is refused: vdisk umount it
first.

Exit codes: 0 clean; 1 findings were repaired; 2 only leaks found (no
--repair); 4 errors left uncorrected; 8 operational error (also: --repair
of a mounted store).`,
		Args: exactArgs("STORE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runFsck(e, args[0], repair, force, asJSON)
		},
	}
	cmd.Flags().BoolVar(&repair, "repair", false, "repair what the check finds")
	cmd.Flags().BoolVar(&force, "force", false, "with --repair: take over a store whose owner record names another host (only after fencing that host)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func runFsck(e *env, path string, repair, force, asJSON bool) error {
	if mnt, store, ok := mountOf(path); ok {
		return fsckMounted(e, mnt, store, repair, asJSON)
	}
	res := fsckResult{Store: path, Repaired: []string{}}
	// Check read-only first, even with --repair: opening for writing heals
	// some damage on its own (it rewrites both superblock copies and deletes
	// disks unlinked while open) and repairs, which would hide the damage
	// from the report.
	s, err := openForFsck(e, path, false, false)
	if err != nil {
		if !errors.Is(err, image.ErrCorrupt) {
			return err // missing, locked, not a store, I/O error: exit 8
		}
		res.Findings = []fsckFinding{{Severity: image.Fatal.String(), Code: codeUnreadable, Message: err.Error()}}
		return finishFsck(e, &res, exitUncorrected, nil, asJSON)
	}
	rep := e.checkWithProgress(s)
	res.fsckCheck = checkOf(rep, s.BlockSize())
	before := s.List()
	if err := s.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	if code := checkExitCode(rep); code == exitOK || !repair {
		return finishFsck(e, &res, code, nil, asJSON)
	}

	// Options.Repair opens read-write despite the damage; Repair fixes it.
	s, err = openForFsck(e, path, true, force)
	if err != nil {
		if !errors.Is(err, image.ErrCorrupt) {
			return err
		}
		res.RepairError = err.Error()
		return finishFsck(e, &res, exitUncorrected, nil, asJSON)
	}
	// Report the findings that went away, Repair's own sentences (which
	// disk ranges it dropped), and how each disk changed.
	actions, rerr := s.Repair()
	afterRep := s.Check()
	for _, f := range rep.Findings {
		if !slices.Contains(afterRep.Findings, f) {
			res.Repaired = append(res.Repaired, "fixed: "+f.String())
		}
	}
	res.Repaired = append(res.Repaired, actions...)
	res.Repaired = append(res.Repaired, diskChanges(before, s.List())...)
	after := checkOf(afterRep, s.BlockSize())
	res.After = &after
	code := exitRepaired
	if rerr != nil || len(after.Findings) > 0 {
		code = exitUncorrected
		if rerr == nil {
			rerr = fmt.Errorf("%d finding(s) remain", len(after.Findings))
		}
		res.RepairError = rerr.Error()
	}
	var closeErr error
	if err := s.Close(); err != nil {
		closeErr = fmt.Errorf("close store: %w", err)
	}
	return finishFsck(e, &res, code, closeErr, asJSON)
}

// fsckMounted checks the store mounted at mnt through its daemon
// (telemetry.Check: image.Store.Check on the live store, which holds
// writes back while it runs) and reports as an offline check does, with
// the same exit codes. A repair needs the store unmounted: it rewrites
// metadata the daemon holds in memory. So --repair is refused, saying
// how to go about it.
func fsckMounted(e *env, mnt, store string, repair, asJSON bool) error {
	if repair {
		return fmt.Errorf("fsck --repair: the store %s is mounted at %s, and a repair needs it unmounted: run vdisk umount %s, then vdisk fsck --repair %s (vdisk fsck %s checks it while mounted)",
			store, mnt, mnt, store, mnt)
	}
	in, err := telemetry.Info(mnt)
	if err != nil {
		return err
	}
	rep, err := telemetry.Check(mnt)
	if err != nil {
		return err
	}
	res := fsckResult{Store: store, Mountpoint: mnt, Repaired: []string{}}
	res.fsckCheck = checkOf(rep, in.Info.BlockSize)
	return finishFsck(e, &res, checkExitCode(rep), nil, asJSON)
}

// openForFsck opens the store even when it has fatal findings: read-only,
// or read-write for Store.Repair (image.Options.Repair). The store logs what it
// finds while opening as warnings; fsck prints those findings itself, so
// below --log-level info they are not logged again.
func openForFsck(e *env, path string, repair, force bool) (*image.Store, error) {
	log := e.log
	if log.GetLevel() < logrus.InfoLevel {
		log = logrus.New()
		log.SetOutput(e.log.Out)
		log.SetFormatter(e.log.Formatter)
		log.SetLevel(logrus.ErrorLevel)
	}
	return e.openPath(path, image.Options{
		Logger:         log,
		ReadOnly:       !repair,
		Tolerant:       true,
		Repair:         repair,
		Force:          force,
		CommitInterval: -1,
		Program:        "vdisk fsck",
	})
}

// diskChanges describes how the disks changed between two listings: renamed,
// removed, or holding less data (a repair unmaps ranges it cannot trust).
func diskChanges(before, after []image.DiskInfo) []string {
	byID := make(map[uint64]image.DiskInfo, len(after))
	for _, d := range after {
		byID[d.ID] = d
	}
	var out []string
	for _, b := range before {
		a, ok := byID[b.ID]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("disk %q (id %d) is gone", b.Name, b.ID))
			continue
		case a.Name != b.Name:
			out = append(out, fmt.Sprintf("disk %q (id %d) is now called %q", b.Name, b.ID, a.Name))
		}
		if a.Allocated < b.Allocated {
			out = append(out, fmt.Sprintf("disk %q: %s of data unmapped; those ranges read as zeros now", a.Name, formatSize(b.Allocated-a.Allocated)))
		}
	}
	return out
}

// checkExitCode is fsck's exit code for a check without repair.
func checkExitCode(rep *image.Report) int {
	switch {
	case rep.Clean():
		return exitOK
	case rep.Fatal():
		return exitUncorrected
	default:
		return exitLeaks
	}
}

func checkOf(rep *image.Report, bs int) fsckCheck {
	f := make([]fsckFinding, 0, len(rep.Findings))
	for _, x := range rep.Findings {
		f = append(f, fsckFinding{Severity: x.Severity.String(), Code: x.Code, Disk: x.Disk, Message: x.Message})
	}
	return fsckCheck{Findings: f, Summary: fsckSummary{
		Disks: rep.Disks, Extents: rep.Extents, MappedBlocks: rep.MappedBlocks,
		AvgExtent: avgExtent(int64(rep.MappedBlocks)*int64(bs), rep.Extents), BlockSize: bs, DataBlocks: rep.DataBlocks,
		UsedBlocks: rep.UsedBlocks, FreeBlocks: rep.FreeBlocks, LeakedBlocks: rep.LeakedBlocks,
	}}
}

// finishFsck prints res and returns the error that makes run exit with code
// (exitFailure, with closeErr printed, if the store did not close).
func finishFsck(e *env, res *fsckResult, code int, closeErr error, asJSON bool) error {
	if closeErr != nil {
		code = exitFailure
	}
	res.ExitCode, res.Result = code, exitMeaning(code)
	if asJSON {
		if err := writeJSON(e, res); err != nil {
			return err
		}
	} else {
		w := e.stdout
		if res.Mountpoint != "" {
			fmt.Fprintf(w, "checking %s, mounted at %s (online: its daemon checks it as it is now)\n", res.Store, res.Mountpoint)
		} else {
			fmt.Fprintf(w, "checking %s\n", res.Store)
		}
		printCheck(e, "", res.fsckCheck)
		for _, a := range res.Repaired {
			fmt.Fprintf(w, "repaired: %s\n", a)
		}
		if res.RepairError != "" {
			fmt.Fprintf(w, "repair failed: %s\n", res.RepairError)
		}
		if res.After != nil {
			printCheck(e, "after repair: ", *res.After)
		}
		fmt.Fprintf(w, "result: %s (exit %d)\n", res.Result, code)
		if res.Mountpoint != "" && code != exitOK {
			fmt.Fprintf(w, "to repair: vdisk umount %s, then vdisk fsck --repair %s\n", res.Mountpoint, res.Store)
		}
	}
	if code == exitOK {
		return nil
	}
	return &exitCodeError{code: code, err: closeErr}
}

func printCheck(e *env, prefix string, c fsckCheck) {
	for _, f := range c.Findings {
		fmt.Fprintf(e.stdout, "%s%s\n", prefix, f)
	}
	sm := c.Summary
	if sm.BlockSize == 0 {
		return // the store did not open: nothing was counted
	}
	fmt.Fprintf(e.stdout, "%s%d disks, %d extents; %d used, %d free, %d leaked of %d blocks of %s\n",
		prefix, sm.Disks, sm.Extents, sm.UsedBlocks, sm.FreeBlocks, sm.LeakedBlocks, sm.DataBlocks, formatSize(int64(sm.BlockSize)))
	if sm.Extents > 0 {
		fmt.Fprintf(e.stdout, "%sfragmentation: %d extents map %d blocks, %s per extent on average\n",
			prefix, sm.Extents, sm.MappedBlocks, formatSize(sm.AvgExtent))
	}
}

// checkWithProgress runs Store.Check with a progress bar (in extents) on a
// terminal, for stores large enough to make the wait noticeable.
func (e *env) checkWithProgress(s *image.Store) *image.Report {
	const showAbove = 200000 // extents; below this Check takes well under a second
	total := s.Info().Extents
	if total < showAbove {
		return s.Check()
	}
	bar := e.newProgressOf(int64(total), "checking extents", false)
	defer bar.done()
	return s.CheckProgress(func(done, _ int) { bar.set(int64(done)) })
}
