package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fioStats is one direction of one job in fio's JSON output.
type fioStats struct {
	IOBytes  int64   `json:"io_bytes"`
	BWBytes  float64 `json:"bw_bytes"`
	IOPS     float64 `json:"iops"`
	TotalIOs int64   `json:"total_ios"`
	ShortIOs int64   `json:"short_ios"`
	DropIOs  int64   `json:"drop_ios"`
}

type fioJob struct {
	Name  string   `json:"jobname"`
	Error int      `json:"error"`
	Read  fioStats `json:"read"`
	Write fioStats `json:"write"`
	Trim  fioStats `json:"trim"`
}

type fioOutput struct {
	Version string   `json:"fio version"`
	Jobs    []fioJob `json:"jobs"`
}

// runFio runs one fio job with --output-format=json and fails the test on
// a non-zero exit, an unparsable output, or any job error.
func runFio(t *testing.T, name string, args ...string) fioJob {
	t.Helper()
	args = append([]string{"--name=" + name, "--output-format=json", "--eta=never"}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "fio", args...)
	cmd.Dir = t.TempDir() // fio leaves its verify state files there
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	out := stdout.Bytes()
	if i := bytes.IndexByte(out, '{'); i > 0 { // fio may print notes first
		out = out[i:]
	}
	var res fioOutput
	jsonErr := json.Unmarshal(out, &res)
	if err != nil || jsonErr != nil || len(res.Jobs) != 1 || res.Jobs[0].Error != 0 {
		t.Fatalf("fio %s: exit %v, json %v, jobs %+v\nargs: fio %s\nstderr:\n%s\nstdout:\n%s",
			name, err, jsonErr, res.Jobs, strings.Join(args, " "), stderr.String(), lastLines(stdout.String(), 40))
	}
	j := res.Jobs[0]
	var parts []string
	for _, d := range []struct {
		what string
		s    fioStats
	}{{"write", j.Write}, {"trim", j.Trim}, {"read/verify", j.Read}} {
		if d.s.IOBytes > 0 && !(d.what == "write" && d.s.BWBytes == 0) { // verify_only replays writes without doing them
			parts = append(parts, fmt.Sprintf("%s %s at %.0f MiB/s, %.0f IOPS", d.what, mib(d.s.IOBytes), d.s.BWBytes/(1<<20), d.s.IOPS))
		}
		if d.s.ShortIOs != 0 || d.s.DropIOs != 0 {
			t.Errorf("fio %s: %s: %d short and %d dropped I/Os", name, d.what, d.s.ShortIOs, d.s.DropIOs)
		}
	}
	t.Logf("fio %s (%s): %s; %v", name, res.Version, strings.Join(parts, "; "), elapsed.Round(time.Millisecond))
	for _, a := range args {
		if a == "--do_verify=1" && j.Read.IOBytes == 0 {
			t.Errorf("fio %s: the verification read nothing", name)
		}
	}
	return j
}

// fioVerify are the verification options of every writing job: a crc32c
// header in every block, everything read back and checked after the
// writes, the first mismatch fatal.
var fioVerify = []string{"--verify=crc32c", "--do_verify=1", "--verify_fatal=1"}

// TestFioVerify runs fio against vdisks with crc32c verification: 1 MiB
// sequential direct writes, 4 KiB random direct writes at iodepth 32 with
// libaio and with io_uring, buffered writes of unaligned sizes at
// unaligned offsets, and trims through a direct-I/O loop device. Every
// job's data is verified again by fio (verify_only) after vdiskfs is
// unmounted and mounted again, and the store is fsck'ed.
func TestFioVerify(t *testing.T) {
	requireRoot(t)
	testStart := time.Now()
	needTools(t, "fio:fio", "losetup:util-linux")
	size, seqSize, smallSize := "256M", "256M", "32M"
	if testing.Short() {
		size, seqSize, smallSize = "64M", "128M", "8M"
	}

	store := newStore(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	m := mountStore(t, store, mnt)
	disk := func(name string) string {
		p := filepath.Join(mnt, name)
		run(t, time.Minute, "truncate", "-s", "512M", p)
		return p
	}

	type job struct {
		name string
		args []string
	}
	jobs := []job{
		{"seq-1m-direct-io_uring", []string{"--filename=" + disk("seq.raw"), "--rw=write", "--bs=1M", "--direct=1",
			"--ioengine=io_uring", "--iodepth=8", "--size=" + seqSize}},
		{"rand-4k-direct-libaio-qd32", []string{"--filename=" + disk("rand-libaio.raw"), "--rw=randwrite", "--bs=4k", "--direct=1",
			"--ioengine=libaio", "--iodepth=32", "--size=" + size}},
		{"rand-4k-direct-io_uring-qd32", []string{"--filename=" + disk("rand-uring.raw"), "--rw=randwrite", "--bs=4k", "--direct=1",
			"--ioengine=io_uring", "--iodepth=32", "--size=" + size}},
		// 512 B sectors, as cloud-hypervisor reports them: O_DIRECT
		// requests that are 512-aligned but mostly not 4 KiB-aligned.
		{"rand-512-direct-io_uring-qd32", []string{"--filename=" + disk("rand-512.raw"), "--rw=randwrite", "--bs=512", "--direct=1",
			"--ioengine=io_uring", "--iodepth=32", "--size=" + smallSize}},
		// Four processes writing one disk at once, each in its own
		// 64 MiB, 4-64 KiB direct requests.
		{"parallel-4-jobs-direct-libaio", []string{"--filename=" + disk("parallel.raw"), "--rw=randwrite", "--bsrange=4k-64k", "--direct=1",
			"--ioengine=libaio", "--iodepth=16", "--numjobs=4", "--offset_increment=64M", "--size=" + smallSize, "--group_reporting"}},
		// Sizes from 512 B to 64 KiB, any byte count (bs_unaligned), at
		// offsets 1,000,000 + multiples of 512: nothing 4 KiB-aligned,
		// through the page cache, with an fsync every 32 writes.
		{"mixed-unaligned-buffered", []string{"--filename=" + disk("unaligned.raw"), "--rw=randwrite", "--bsrange=512-64k", "--bs_unaligned=1",
			"--offset=1000000", "--direct=0", "--ioengine=psync", "--fsync=32", "--end_fsync=1", "--size=64M"}},
	}
	for _, j := range jobs {
		runFio(t, j.name, append(j.args, fioVerify...)...)
	}

	// Trim: fio trims only block devices, so through a loop device with
	// direct I/O, which turns discards into punch holes on the vdisk.
	// trimwrite trims each block and writes it again (verified); then a
	// plain trim of 32 MiB must read back as zeros and free the space.
	trimFile := disk("trim.raw")
	loop := attachLoop(t, trimFile)
	runFio(t, "randtrimwrite-64k-loop", append([]string{"--filename=" + loop.dev, "--rw=randtrimwrite", "--bs=64k", "--direct=1",
		"--ioengine=libaio", "--iodepth=16", "--size=128M"}, fioVerify...)...)
	allocBefore, _ := usage(t, trimFile)
	tr := runFio(t, "trim-32m-loop", "--filename="+loop.dev, "--rw=trim", "--bs=1M", "--offset=32M", "--size=32M")
	if tr.Trim.IOBytes != 32<<20 {
		t.Errorf("fio trim: %d bytes trimmed, want %d", tr.Trim.IOBytes, 32<<20)
	}
	loop.detach(t)
	allocAfter, apparent := usage(t, trimFile)
	t.Logf("trim.raw: allocated %s before the 32 MiB trim, %s after, apparent %s", mib(allocBefore), mib(allocAfter), mib(apparent))
	if allocBefore-allocAfter != 32<<20 {
		t.Errorf("trimming 32 MiB freed %d bytes of trim.raw", allocBefore-allocAfter)
	}
	checkZeros(t, trimFile, 32<<20, 32<<20)

	for _, name := range []string{"seq.raw", "rand-libaio.raw", "rand-uring.raw", "rand-512.raw", "parallel.raw", "unaligned.raw"} {
		alloc, apparent := usage(t, filepath.Join(mnt, name))
		t.Logf("%s: allocated %s of apparent %s", name, mib(alloc), mib(apparent))
	}

	// Again through a fresh daemon: fio replays each job's offsets and
	// checks every block's header and crc without writing.
	m.unmount(t)
	m = mountStore(t, store, mnt)
	for _, j := range jobs {
		runFio(t, j.name+"-verify_only", append(append(j.args, fioVerify...), "--verify_only=1")...)
	}
	checkZeros(t, trimFile, 32<<20, 32<<20)
	m.unmount(t)
	fsckClean(t, store)
	t.Logf("TestFioVerify: %v in all", time.Since(testStart).Round(time.Millisecond))
}

// checkZeros fails unless bytes [off, off+n) of path read as zeros.
func checkZeros(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := io.ReadFull(io.NewSectionReader(f, off, n), buf); err != nil {
		t.Fatalf("read %s at %d: %v", path, off, err)
	}
	if i := firstDiff(buf, make([]byte, n)); i >= 0 {
		t.Fatalf("%s: byte %d is %#x after trim, want 0", path, off+int64(i), buf[i])
	}
}
