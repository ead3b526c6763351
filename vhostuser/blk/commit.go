package blk

import "sync"

// committer makes the writes a Restartable disk has not made recoverable
// recoverable before they are returned: owners hand it such writes
// (hold), it runs one CommitWrites for all that are waiting, and hands
// each back to its owner (finish), failed (IOERR) if the commit failed.
// Writes that arrive during a commit wait for the next one.
type committer struct {
	disk Restartable
	// mu guards the writes waiting for a commit.
	mu struct {
		sync.Mutex
		waiting, spare []*request
		closed         bool
	}
	kick chan struct{} // a write is waiting (capacity 1)
	done chan struct{} // closed when run returns
}

func newCommitter(r Restartable) *committer {
	c := &committer{disk: r, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go c.run()
	return c
}

// hold queues r (a completed write of r.o) for the next commit.
func (c *committer) hold(r *request) {
	c.mu.Lock()
	c.mu.waiting = append(c.mu.waiting, r)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default: // a kick is pending already
	}
}

func (c *committer) run() {
	defer close(c.done)
	for range c.kick {
		c.mu.Lock()
		batch := c.mu.waiting
		c.mu.waiting = c.mu.spare[:0]
		closed := c.mu.closed
		c.mu.Unlock()
		if len(batch) > 0 {
			err := c.disk.CommitWrites()
			for _, r := range batch {
				r.committed = true
				if err != nil {
					r.status = statusIOErr
					r.o.log.WithError(err).Warn("vhost-user: commit of a completed write failed")
				}
				r.o.finish(r)
			}
		}
		c.mu.Lock()
		c.mu.spare = batch[:0]
		c.mu.Unlock()
		if closed {
			return
		}
	}
}

// close ends the committer once no write waits (every queue stopped).
func (c *committer) close() {
	c.mu.Lock()
	c.mu.closed = true
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	<-c.done
}
