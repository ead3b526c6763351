package vhostuser

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// Listener serves a Device to one frontend at a time on a Unix socket.
type Listener struct {
	path string
	ln   *net.UnixListener
	dev  Device
	log  logrus.FieldLogger

	// mu guards the connection being served and the backend request
	// channel it handed over.
	mu struct {
		sync.Mutex
		conn    *net.UnixConn // nil: none connected
		backend *net.UnixConn // SET_BACKEND_REQ_FD's channel, or nil
		closed  bool
	}
	wg sync.WaitGroup // the accept loop and the session

	connects, refused atomic.Uint64
}

// ListenerStats are a Listener's counters.
type ListenerStats struct {
	Connects, Refused uint64
	Connected         bool
}

// Listen creates the socket at path (0600, or 0660 and owned by group
// when group ≥ 0) and serves dev there. A stale socket at path (nobody
// listening) is replaced; a live one is an error.
func Listen(path string, group int, dev Device, log logrus.FieldLogger) (*Listener, error) {
	if log == nil {
		log = logrus.StandardLogger()
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("vhost-user socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	mode := os.FileMode(0o600)
	if group >= 0 {
		mode = 0o660
		if err := os.Chown(path, -1, group); err != nil {
			ln.Close()
			return nil, fmt.Errorf("vhost-user socket: %w", err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("vhost-user socket: %w", err)
	}
	l := &Listener{path: path, ln: ln, dev: dev, log: log.WithField("socket", path)}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// removeStale removes a socket at path that nobody listens on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("vhost-user socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("vhost-user socket %s: %w", path, os.ErrExist)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("vhost-user socket %s: in use: %w", path, os.ErrExist)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("vhost-user socket %s: %w", path, err)
	}
	return os.Remove(path)
}

func (l *Listener) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			l.mu.Lock()
			closed := l.mu.closed
			l.mu.Unlock()
			if !closed {
				l.log.WithError(err).Error("vhost-user: accept")
			}
			return
		}
		l.mu.Lock()
		if l.mu.closed || l.mu.conn != nil {
			closed := l.mu.closed
			l.mu.Unlock()
			c.Close()
			if !closed {
				l.refused.Add(1)
				l.log.Warn("vhost-user: a second frontend connected while one is served: refused")
			}
			continue
		}
		l.mu.conn = c
		l.mu.Unlock()
		l.connects.Add(1)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			s := newSession(l, c)
			s.run()
			l.mu.Lock()
			l.mu.conn = nil
			if l.mu.backend != nil {
				l.mu.backend.Close()
				l.mu.backend = nil
			}
			l.mu.Unlock()
			c.Close()
		}()
	}
}

// setBackend installs the backend request channel (nil: none).
func (l *Listener) setBackend(c *net.UnixConn) {
	l.mu.Lock()
	old := l.mu.backend
	l.mu.backend = c
	l.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// ConfigChanged tells the frontend that the config space changed
// (VHOST_USER_BACKEND_CONFIG_CHANGE_MSG). False when there is no frontend
// or it gave no backend channel: it reads the new config at its next
// GET_CONFIG.
func (l *Listener) ConfigChanged() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.backend == nil {
		return false
	}
	err := proto.WriteMessage(l.mu.backend, proto.Message{Request: uint32(proto.BackendConfigChangeMsg), Flags: proto.Version})
	if err != nil {
		l.log.WithError(err).Warn("vhost-user: config change message")
		return false
	}
	return true
}

// Stats returns the listener's counters.
func (l *Listener) Stats() ListenerStats {
	l.mu.Lock()
	connected := l.mu.conn != nil
	l.mu.Unlock()
	return ListenerStats{Connects: l.connects.Load(), Refused: l.refused.Load(), Connected: connected}
}

// Close stops listening, removes the socket, ends the session (its queues
// stopped) and waits for it.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.mu.closed = true
	if l.mu.conn != nil {
		l.mu.conn.Close()
	}
	l.mu.Unlock()
	err := l.ln.Close()
	l.wg.Wait()
	return err
}
