package fs

import (
	"os"
	"runtime"
)

// MinProcs is the least GOMAXPROCS a process serving a mount should run
// with, whatever the number of CPUs.
//
// Every FUSE request is served on a goroutine that makes blocking system
// calls: go-fuse's readers wait in read(2) on /dev/fuse, and a request's
// backend I/O is a pread or pwrite on an O_DIRECT descriptor that sleeps
// until the device answers. A goroutine in a system call keeps its P (the
// runtime's licence to run Go code) until the call returns or sysmon takes
// the P back, which sysmon does on a tick of 20 µs to 10 ms. With
// GOMAXPROCS equal to a small machine's 2 CPUs, two sleeping calls leave no
// P for the next request: the device sees a couple of I/Os in flight
// instead of the client's queue depth, and requests wait for sysmon while
// the CPUs idle. Eight was the smallest count that let a 2-CPU machine
// keep fio's 4 KiB random reads at iodepth 32 in flight at the device;
// more bought nothing and made runs noisier. More Ps cost nothing while
// idle: a P only runs when a goroutine is runnable.
//
// go-fuse also sizes its pool of /dev/fuse readers from GOMAXPROCS (2 to
// 16) when the server is created, so the value must be set before Mount.
const MinProcs = 8

// TuneRuntime raises GOMAXPROCS to MinProcs when it is lower, unless the
// GOMAXPROCS environment variable sets it (the operator's choice wins). It
// changes the whole process, so a daemon calls it once, before Mount;
// package fs itself never does. It returns the value in effect.
func TuneRuntime() int {
	cur := runtime.GOMAXPROCS(0)
	if os.Getenv("GOMAXPROCS") != "" || cur >= MinProcs {
		return cur
	}
	runtime.GOMAXPROCS(MinProcs)
	return MinProcs
}
