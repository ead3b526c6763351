// Package loadgen is the compare tool's own load generator, for targets
// fio cannot reach: a vhost-user-blk socket (driven through package
// vhostuser/frontend) and, to calibrate the generator against fio, a
// plain file driven through io_uring.
//
// A Shape is read from a fio job (rw, bs, iodepth, runtime, ramp_time,
// time_based, randseed): one submitter keeps iodepth requests of bs bytes
// in flight, sequential from offset 0 (wrapping at the end when time
// based) or uniformly random and block aligned, and measures each
// request from submission to completion after the ramp. Jobs with options
// the generator does not reproduce (several jobs, mixed directions, size
// or offset limits) are refused rather than run differently from fio.
//
// # Engines
//
// An Engine opens a Queue: depth slots, each with a bs-byte buffer the
// device reads or writes; Submit queues slot i's request, Flush submits
// and, when asked, waits until at least one completes; Reap reports the
// completions. A Queue belongs to one goroutine. Run hands each request
// to the device as soon as it is made (Submit, then Flush without
// waiting), as fio does by default (iodepth_batch_submit=1), and waits
// only when nothing has completed.
package loadgen
