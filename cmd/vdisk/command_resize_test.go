package main

import (
	"testing"
)

func TestResize(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1G")
	for _, tc := range []struct {
		args []string
		want int64
		out  string
	}{
		{[]string{"2G"}, 2 << 30, "resized a.raw from 1 GiB to 2 GiB\n"},
		{[]string{"+1M"}, 2<<30 + 1<<20, "resized a.raw from 2 GiB to 2.0 GiB (2148532224 bytes)\n"},
		{[]string{"--shrink", "--", "-1M"}, 2 << 30, ""},
		{[]string{"--shrink", "1000"}, 1000, ""},
		{[]string{"0"}, 1000, ""}, // refused below: no --shrink
	} {
		args := append([]string{"resize", store, "a.raw"}, tc.args...)
		if tc.args[0] == "0" {
			wantFail(t, exitFailure, []string{"--shrink"}, args...)
		} else if r := mustRun(t, args...); tc.out != "" && r.stdout != tc.out {
			t.Errorf("%v: output %q, want %q", tc.args, r.stdout, tc.out)
		}
		if d := diskByName(t, store, "a.raw"); d.Size != tc.want {
			t.Errorf("after %v: size %d, want %d", tc.args, d.Size, tc.want)
		}
	}
}

func TestResizeShrinkFreesBlocks(t *testing.T) {
	store := newStore(t)
	src := t.TempDir() + "/src"
	writeFile(t, src, randomBytes(1<<20, 2))
	mustRun(t, "import", store, "a.raw", src)
	mustRun(t, "resize", "--shrink", store, "a.raw", "5000")
	if d := diskByName(t, store, "a.raw"); d.Size != 5000 || d.Allocated != 8192 {
		t.Errorf("after shrink: %+v", d)
	}
}

func TestResizeErrors(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	wantFail(t, exitFailure, []string{"no such disk"}, "resize", store, "b.raw", "2M")
	wantFail(t, exitFailure, []string{"unknown suffix"}, "resize", store, "a.raw", "2Mb")
	wantFail(t, exitFailure, []string{"negative"}, "resize", "--shrink", store, "a.raw", "--", "-2M")
	wantFail(t, exitFailure, []string{"too large"}, "resize", store, "a.raw", "+8191P")
	wantFail(t, exitFailure, []string{"too large"}, "resize", store, "a.raw", "5E")
}
