package blk

import (
	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/vhostuser"
)

// server is a Server's state: the listener and the device it serves.
type server struct {
	dev *device
	l   *vhostuser.Listener
}

func serve(d Disk, cfg Config) (*server, error) {
	if cfg.Log == nil {
		cfg.Log = logrus.StandardLogger()
	}
	cfg.Log = cfg.Log.WithField("disk", cfg.ID)
	dev := newDevice(d, cfg)
	l, err := vhostuser.Listen(cfg.Socket, cfg.SocketGroup, dev, cfg.Log)
	if err != nil {
		if dev.commit != nil {
			dev.commit.close()
		}
		return nil, err
	}
	return &server{dev: dev, l: l}, nil
}

func (s *server) configChanged() { s.l.ConfigChanged() }

// close closes the listener (every queue stopped, so no write waits for
// a commit), then the committer.
func (s *server) close() error {
	err := s.l.Close()
	if s.dev.commit != nil {
		s.dev.commit.close()
	}
	return err
}

func (s *server) stats() Stats {
	st := s.dev.st.snapshot()
	ls := s.l.Stats()
	st.Connects, st.Refused, st.Connected = ls.Connects, ls.Refused, ls.Connected
	if ls.Connects > 0 {
		st.Reconnects = ls.Connects - 1
	}
	return st
}
