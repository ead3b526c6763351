package loadgen

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Engine opens queues of asynchronous block I/O on one target.
type Engine interface {
	// Open returns a queue of depth slots, each with a buffer of bs
	// bytes aligned for direct I/O.
	Open(depth, bs int) (Queue, error)
}

// Queue is one submitter's queue (one goroutine's).
type Queue interface {
	// Buffer is slot's buffer.
	Buffer(slot int) []byte
	// Submit queues slot's request: its buffer written to or read from
	// byte offset off.
	Submit(slot int, write bool, off int64) error
	// Flush hands what Submit queued to the device and, with wait,
	// sleeps until at least one request completes (or a bound passes),
	// returning at once when one has completed already.
	Flush(wait bool) error
	// Reap calls fn for every completed request and returns how many;
	// a request that failed or moved fewer bytes than asked is an error.
	Reap(fn func(slot int)) (int, error)
	// Close frees the queue; nothing may be in flight.
	Close() error
}

// Result is one run's figures, in fio's terms: what completed after the
// ramp.
type Result struct {
	Bytes, IOs uint64
	Elapsed    time.Duration // the measured window
	Wall       time.Duration // the whole run, ramp included
	P50, P99   time.Duration // submission to completion
	Mean       time.Duration
	CPU        time.Duration // this process's user+system time over the run
}

// BW is bytes per second over the measured window.
func (r Result) BW() float64 { return float64(r.Bytes) / r.Elapsed.Seconds() }

// IOPS is requests per second over the measured window.
func (r Result) IOPS() float64 { return float64(r.IOs) / r.Elapsed.Seconds() }

// Run runs shape s on a target of size bytes through e.
func Run(ctx context.Context, e Engine, s Shape, size int64) (Result, error) {
	blocks := size / int64(s.BS)
	if blocks < 1 {
		return Result{}, fmt.Errorf("target of %d bytes is smaller than bs=%d", size, s.BS)
	}
	// One thread submits and reaps, as fio's job does.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	q, err := e.Open(s.Depth, s.BS)
	if err != nil {
		return Result{}, err
	}
	defer q.Close()
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x9e3779b97f4a7c15))
	if s.Write {
		for i := 0; i < s.Depth; i++ {
			b := q.Buffer(i)
			for j := 0; j+8 <= len(b); j += 8 {
				v := rng.Uint64()
				for k := range 8 {
					b[j+k] = byte(v >> (8 * k))
				}
			}
		}
	}
	// next is the offset of the next request; false: the pass is over.
	var perm []uint32
	if s.Random && !s.TimeBased {
		perm = make([]uint32, blocks)
		for i := range perm {
			perm[i] = uint32(i)
		}
		rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	}
	var pos int64
	next := func() (int64, bool) {
		switch {
		case perm != nil:
			if pos >= int64(len(perm)) {
				return 0, false
			}
			pos++
			return int64(perm[pos-1]) * int64(s.BS), true
		case s.Random:
			return rng.Int64N(blocks) * int64(s.BS), true
		default:
			if pos >= blocks {
				if !s.TimeBased {
					return 0, false
				}
				pos = 0
			}
			pos++
			return (pos - 1) * int64(s.BS), true
		}
	}

	var h histogram
	cpu0 := processCPU()
	start := time.Now()
	measureFrom := start.Add(s.Ramp)
	var end time.Time
	if s.Runtime > 0 {
		end = measureFrom.Add(s.Runtime)
	}
	submitted := make([]time.Time, s.Depth)
	free := make([]int, 0, s.Depth)
	for i := s.Depth - 1; i >= 0; i-- {
		free = append(free, i)
	}
	var res Result
	inFlight := 0
	stopping := false
	last := start
	onDone := func(slot int) {
		now := time.Now()
		free = append(free, slot)
		inFlight--
		if now.Before(measureFrom) || (!end.IsZero() && now.After(end)) {
			return
		}
		res.IOs++
		res.Bytes += uint64(s.BS)
		h.add(now.Sub(submitted[slot]))
		last = now
	}
	for {
		if !stopping && ((!end.IsZero() && time.Now().After(end)) || ctx.Err() != nil) {
			stopping = true
		}
		for !stopping && len(free) > 0 {
			off, ok := next()
			if !ok {
				stopping = true
				break
			}
			slot := free[len(free)-1]
			free = free[:len(free)-1]
			if err := q.Submit(slot, s.Write, off); err != nil {
				return res, err
			}
			submitted[slot] = time.Now()
			inFlight++
			// Each request goes to the device as soon as it is made, as
			// fio's default iodepth_batch_submit=1 does: held back to be
			// submitted with the next wait, a request's measured latency
			// included the reaping of the others.
			if err := q.Flush(false); err != nil {
				return res, err
			}
		}
		if inFlight == 0 {
			break
		}
		// Reap what is ready first; wait only when nothing is.
		n, err := q.Reap(onDone)
		if err != nil {
			return res, err
		}
		if n > 0 {
			continue
		}
		if err := q.Flush(true); err != nil {
			return res, err
		}
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.Wall = time.Since(start)
	res.CPU = processCPU() - cpu0
	if !end.IsZero() && s.TimeBased {
		res.Elapsed = s.Runtime
	} else {
		res.Elapsed = last.Sub(measureFrom)
	}
	if res.IOs == 0 || res.Elapsed <= 0 {
		return res, fmt.Errorf("no request completed in the measured window")
	}
	res.P50, res.P99, res.Mean = h.quantile(0.5), h.quantile(0.99), h.mean()
	return res, nil
}

func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// histogram counts latencies in buckets 1% apart (as fio's, coarser than
// any difference worth reporting).
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    time.Duration
}

const (
	histStep    = 1.01
	histBuckets = 2400 // 1.01^2400 ns is far beyond any latency
)

func (h *histogram) add(d time.Duration) {
	i := 0
	if d > 1 {
		i = min(int(math.Log(float64(d))/math.Log(histStep)), histBuckets-1)
	}
	h.counts[i]++
	h.n++
	h.sum += d
}

// quantile is the upper bound of the bucket holding the q-th quantile.
func (h *histogram) quantile(q float64) time.Duration {
	want := uint64(math.Ceil(q * float64(h.n)))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= want && c > 0 {
			return time.Duration(math.Pow(histStep, float64(i+1)))
		}
	}
	return 0
}

func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}
