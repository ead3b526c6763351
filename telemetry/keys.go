package telemetry

// Keys of encrypted disks through the control socket.
//
// A key never travels as bytes: the client opens its key file and passes
// the open descriptor with the request (SCM_RIGHTS, attached to the
// request's first bytes), and the daemon reads the key from it, checking
// the file as crypt.ReadKeyFile does, with the peer (who opened it) as the
// owner it must have. So the key is not in the client's or the daemon's
// socket buffers, not in a request a proxy or a log could keep, and the
// daemon reads only a file the peer could open. A connection keeps at most
// maxRights descriptors, passed with its first byte; any it holds when it
// closes are closed.
//
//	POST /unlock?disk=NAME                         one key file: Store.Unlock
//	POST /lock?disk=NAME                           Store.Lock (no key)
//	POST /create-encrypted?name=N&size=S&mode=M    one key file: a new encrypted disk, the peer's
//	POST /keys/add?disk=NAME                       two: a key of the disk, the key to add
//	POST /keys/remove?disk=NAME&slot=ID            one: a key of the disk
//	GET  /keys?disk=NAME                           the disk's key slots (no key needed)

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// KeyController is what a mount that serves encrypted disks does with the
// keys passed to it (the daemon's Controller, when it is one).
type KeyController interface {
	Unlock(name string, key *crypt.Secret) (int, error)
	Lock(name string) (int, error)
	CreateEncrypted(name string, size int64, a image.Attr, key *crypt.Secret) (image.DiskInfo, error)
	AddKey(name string, have, add *crypt.Secret) (uint32, error)
	RemoveKey(name string, have *crypt.Secret, slot uint32) error
	KeySlots(name string) ([]image.KeySlot, error)
}

// maxRights bounds the descriptors a connection holds for its requests.
const maxRights = 4

// rights are the descriptors a connection's peer passed (SCM_RIGHTS) with
// its first byte, which no request took yet. mu guards fds.
type rights struct {
	mu     sync.Mutex
	fds    []int
	looked atomic.Bool // the first byte was read (readMsg)
}

// readMsg reads from c like Read. Its first call reads the connection's
// first byte alone with recvmsg, keeping the descriptors that come with it
// (closing those past maxRights: a client passes them with its first
// write); every later call is a plain read, which the race detector sees
// (it does not see recvmsg), and which costs nothing more on a stream.
func (rt *rights) readMsg(c *net.UnixConn, b []byte) (int, error) {
	if rt.looked.Load() || len(b) == 0 {
		return c.Read(b)
	}
	rt.looked.Store(true)
	oob := make([]byte, unix.CmsgSpace(maxRights*4))
	n, oobn, _, _, err := c.ReadMsgUnix(b[:1], oob)
	if oobn > 0 {
		rt.keep(oob[:oobn])
	}
	// As Read says it: no negative count on an error, and the end of the
	// stream is io.EOF.
	n = max(n, 0)
	if n == 0 && err == nil && len(b) > 0 {
		err = io.EOF
	}
	return n, err
}

func (rt *rights) keep(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if len(rt.fds) < maxRights {
				rt.fds = append(rt.fds, fd)
			} else {
				unix.Close(fd)
			}
		}
	}
}

// take returns the n descriptors passed first, as files, or an error when
// fewer were passed.
func (rt *rights) take(n int) ([]*os.File, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.fds) < n {
		return nil, fmt.Errorf("%d key file descriptors passed (SCM_RIGHTS), want %d", len(rt.fds), n)
	}
	out := make([]*os.File, n)
	for i, fd := range rt.fds[:n] {
		out[i] = os.NewFile(uintptr(fd), "key file")
	}
	rt.fds = append(rt.fds[:0], rt.fds[n:]...)
	return out, nil
}

func (rt *rights) closeAll() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, fd := range rt.fds {
		unix.Close(fd)
	}
	rt.fds = nil
}

type rightsKey struct{}

// keySecrets reads n key files passed with r's request, each owned by the
// peer, and closes them.
func keySecrets(r *http.Request, n int) ([]*crypt.Secret, error) {
	rt, _ := r.Context().Value(rightsKey{}).(*rights)
	p, err := peerFrom(r.Context())
	if rt == nil || err != nil {
		return nil, errors.New("this connection cannot pass key files")
	}
	files, err := rt.take(n)
	if err != nil {
		return nil, err
	}
	var out []*crypt.Secret
	for i, f := range files {
		s, err := crypt.ReadKeyFile(f, int(p.UID))
		f.Close()
		if err != nil {
			for _, f := range files[i+1:] {
				f.Close()
			}
			closeSecrets(out)
			return nil, fmt.Errorf("key file %d: %w", i+1, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func closeSecrets(ss []*crypt.Secret) {
	for _, s := range ss {
		s.Close()
	}
}

// keysOf is ctl's KeyController, nil when it has none.
func keysOf(ctl Controller) KeyController {
	if g, ok := ctl.(guard); ok {
		ctl = g.Controller
	}
	kc, _ := ctl.(KeyController)
	return kc
}

// UnlockReply is the answer of POST /unlock.
type UnlockReply struct {
	Disks int `json:"disks"` // the disks unlocked: every one with the key
}

// KeySlotReply is the answer of POST /keys/add.
type KeySlotReply struct {
	Slot uint32 `json:"slot"`
}

// handleKeys adds the key requests (the top of this file) to mux.
func handleKeys(mux *http.ServeMux, ctl Controller) {
	kc := keysOf(ctl)
	if kc == nil {
		return
	}
	withKeys := func(n int, fn func(w http.ResponseWriter, r *http.Request, keys []*crypt.Secret) (any, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			keys, err := keySecrets(r, n)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			defer closeSecrets(keys)
			reply, err := fn(w, r, keys)
			if err != nil {
				http.Error(w, err.Error(), statusOf(err))
				return
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(reply)
		}
	}
	q := func(r *http.Request, k string) string { return r.URL.Query().Get(k) }
	mux.HandleFunc("POST /unlock", withKeys(1, func(_ http.ResponseWriter, r *http.Request, k []*crypt.Secret) (any, error) {
		n, err := kc.Unlock(q(r, "disk"), k[0])
		return UnlockReply{Disks: n}, err
	}))
	mux.HandleFunc("POST /lock", withKeys(0, func(_ http.ResponseWriter, r *http.Request, _ []*crypt.Secret) (any, error) {
		n, err := kc.Lock(q(r, "disk"))
		return UnlockReply{Disks: n}, err
	}))
	mux.HandleFunc("POST /create-encrypted", withKeys(1, func(_ http.ResponseWriter, r *http.Request, k []*crypt.Secret) (any, error) {
		size, err := strconv.ParseInt(q(r, "size"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("size: %w", image.ErrInvalid)
		}
		mode, err := strconv.ParseUint(q(r, "mode"), 8, 32)
		if err != nil {
			return nil, fmt.Errorf("mode: %w", image.ErrInvalid)
		}
		p, _ := peerFrom(r.Context())
		return kc.CreateEncrypted(q(r, "name"), size, image.Attr{Mode: uint32(mode) & 0o7777, UID: p.UID, GID: p.GID}, k[0])
	}))
	mux.HandleFunc("POST /keys/add", withKeys(2, func(_ http.ResponseWriter, r *http.Request, k []*crypt.Secret) (any, error) {
		id, err := kc.AddKey(q(r, "disk"), k[0], k[1])
		return KeySlotReply{Slot: id}, err
	}))
	mux.HandleFunc("POST /keys/remove", withKeys(1, func(_ http.ResponseWriter, r *http.Request, k []*crypt.Secret) (any, error) {
		id, err := strconv.ParseUint(q(r, "slot"), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("slot: %w", image.ErrInvalid)
		}
		return KeySlotReply{Slot: uint32(id)}, kc.RemoveKey(q(r, "disk"), k[0], uint32(id))
	}))
	mux.HandleFunc("GET /keys", withKeys(0, func(_ http.ResponseWriter, r *http.Request, _ []*crypt.Secret) (any, error) {
		return kc.KeySlots(q(r, "disk"))
	}))
}

// keyRequest sends a request to the socket of the mount at mountpoint with
// the descriptors of files passed alongside (SCM_RIGHTS), and decodes its
// JSON answer into reply.
func keyRequest(mountpoint, method, what string, query url.Values, reply any, files ...*os.File) error {
	return doJSON(mountpoint, method, what+"?"+query.Encode(), nil, http.StatusOK, 0, reply, files...)
}

// Unlock gives the mount at mountpoint the key of its disk called disk,
// from the key file key (passed open, not read here), and returns how
// many disks it unlocked (every one with that key).
func Unlock(mountpoint, disk string, key *os.File) (int, error) {
	var rep UnlockReply
	err := keyRequest(mountpoint, http.MethodPost, "unlock", url.Values{"disk": {disk}}, &rep, key)
	return rep.Disks, err
}

// Lock asks the mount at mountpoint to forget the key of its disk called
// disk (refused while a disk with the key is open), and returns how many
// disks it locked.
func Lock(mountpoint, disk string) (int, error) {
	var rep UnlockReply
	err := keyRequest(mountpoint, http.MethodPost, "lock", url.Values{"disk": {disk}}, &rep)
	return rep.Disks, err
}

// CreateEncrypted asks the mount at mountpoint to make an encrypted disk
// called name of size bytes with permission bits mode, owned by the
// caller, with one key slot opened by the key file key.
func CreateEncrypted(mountpoint, name string, size int64, mode uint32, key *os.File) (image.DiskInfo, error) {
	var rep image.DiskInfo
	q := url.Values{"name": {name}, "size": {strconv.FormatInt(size, 10)}, "mode": {strconv.FormatUint(uint64(mode), 8)}}
	err := keyRequest(mountpoint, http.MethodPost, "create-encrypted", q, &rep, key)
	return rep, err
}

// AddKey adds a key slot opened by the key file add to the disk of the
// mount at mountpoint called disk; have is a key file that opens it.
func AddKey(mountpoint, disk string, have, add *os.File) (uint32, error) {
	var rep KeySlotReply
	err := keyRequest(mountpoint, http.MethodPost, "keys/add", url.Values{"disk": {disk}}, &rep, have, add)
	return rep.Slot, err
}

// RemoveKey removes key slot slot of the disk of the mount at mountpoint
// called disk; have is a key file that opens it.
func RemoveKey(mountpoint, disk string, have *os.File, slot uint32) error {
	var rep KeySlotReply
	q := url.Values{"disk": {disk}, "slot": {strconv.FormatUint(uint64(slot), 10)}}
	return keyRequest(mountpoint, http.MethodPost, "keys/remove", q, &rep, have)
}

// KeySlots lists the key slots of the disk of the mount at mountpoint
// called disk.
func KeySlots(mountpoint, disk string) ([]image.KeySlot, error) {
	var rep []image.KeySlot
	err := keyRequest(mountpoint, http.MethodGet, "keys", url.Values{"disk": {disk}}, &rep)
	return rep, err
}

// withRights is c for one request whose connection passes files with its
// first bytes (SCM_RIGHTS): a streaming request (a receive) with a key.
func withRights(c *http.Client, sock string, files ...*os.File) *http.Client {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	oob := unix.UnixRights(fds...)
	return &http.Client{Timeout: c.Timeout, Transport: expectContinue{&http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", sock)
			if err != nil {
				return nil, err
			}
			return &rightsConn{UnixConn: conn.(*net.UnixConn), oob: oob}, nil
		},
		DisableKeepAlives:     true,
		ExpectContinueTimeout: time.Second,
	}}}
}

// rightsConn passes oob with the first bytes it writes.
type rightsConn struct {
	*net.UnixConn
	mu  sync.Mutex
	oob []byte
}

func (c *rightsConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	oob := c.oob
	c.oob = nil
	c.mu.Unlock()
	if oob == nil {
		return c.UnixConn.Write(b)
	}
	n, _, err := c.UnixConn.WriteMsgUnix(b, oob, nil)
	if err == nil && n < len(b) {
		var m int
		m, err = c.UnixConn.Write(b[n:])
		n += m
	}
	return n, err
}

// RawSender is a Controller that sends raw streams of encrypted disks
// (transfer.SendOptions.Raw), which need no key.
type RawSender interface {
	SendRaw(w io.Writer, disk, from string) (transfer.Stats, error)
}

// rawSend is ctl's SendRaw, or one that says it has none.
func rawSend(ctl Controller) func(w io.Writer, disk, from string) (transfer.Stats, error) {
	if rs, ok := ctl.(RawSender); ok {
		return rs.SendRaw
	}
	return func(io.Writer, string, string) (transfer.Stats, error) {
		return transfer.Stats{}, fmt.Errorf("this mount sends no raw streams: %w", transfer.ErrRaw)
	}
}

// SendRaw is Send's check for a raw stream: the peer must be able to
// read the disk (and its base), as for any send.
func (g guard) SendRaw(w io.Writer, disk, from string) (transfer.Stats, error) {
	for _, name := range []string{disk, from} {
		if name == "" {
			continue
		}
		if err := g.readable(name); err != nil {
			return transfer.Stats{}, err
		}
	}
	return rawSend(g.Controller)(w, disk, from)
}
