package main

import (
	"testing"
)

func TestSync(t *testing.T) {
	mnt, s := serveFakeMount(t) // 8 MiB written, nothing committed
	before := s.Counters()
	if before.Commits != 0 {
		t.Fatalf("%d commits before vdisk sync, want 0 (no timer)", before.Commits)
	}
	if r := mustRun(t, "sync", mnt); r.stdout != "" {
		t.Errorf("vdisk sync printed %q, want nothing", r.stdout)
	}
	after := s.Counters()
	if after.Commits != 1 || after.Flushes <= before.Flushes {
		t.Errorf("vdisk sync: %d commits, %d flushes (before %d), want 1 commit and a flush", after.Commits, after.Flushes, before.Flushes)
	}
	// Nothing new to commit: a second sync writes no journal.
	mustRun(t, "sync", mnt)
	if n := s.Counters().Commits; n != 1 {
		t.Errorf("a second vdisk sync with nothing new wrote a commit: %d commits", n)
	}
	wantFail(t, exitFailure, []string{"no vdiskfs mount is serving"}, "sync", t.TempDir())
	wantFail(t, exitFailure, []string{"takes at least one mount point"}, "sync")
}
