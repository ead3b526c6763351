package iouring

import (
	"runtime"
	"time"
)

// yieldEvery is the longest a ring's owner goes without passing through
// the Go scheduler: half the runtime's preemption time slice (10 ms).
const yieldEvery = 5 * time.Millisecond

// Yielder keeps a ring's owner from looking to the Go runtime like a
// goroutine that runs past its time slice. An owner is locked to its
// thread and sleeps in io_uring_enter instead of parking, so its P's
// scheduling tick never moves: the runtime's monitor (sysmon) preempts it
// with a signal every slice and takes its P while it sleeps, and with
// every P idle the monitor sleeps too, until the owner's next return from
// io_uring_enter wakes it; it then polls every 20 µs before backing off
// again, a wake-up cycle that is not the owner's work. Passing through
// the scheduler (runtime.Gosched) every yieldEvery moves the tick, at the
// cost of one hand-over of the P to another thread and back.
//
// The owner asks Due once per loop, before it sleeps; when it says so,
// the owner submits what is on its ring (so that no I/O waits for the
// yield) and calls Yield. The zero value is ready. Only the owner uses it.
type Yielder struct {
	last time.Time // the owner's last pass through the scheduler
}

// Due says yieldEvery has passed since the last Yield.
func (y *Yielder) Due() bool { return time.Since(y.last) >= yieldEvery }

// Yield passes through the Go scheduler.
func (y *Yielder) Yield() {
	runtime.Gosched()
	y.last = time.Now()
}
