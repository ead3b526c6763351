package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// Transfers of a running mount through its Unix socket (`vdisk diff`,
// `send` and `receive` given MOUNTPOINT/NAME): the daemon holds the store,
// so it does the work, and the socket carries the stream.
//
//	GET  /diff?old=OLD&new=NEW      200, a DiffReply
//	GET  /send?disk=NAME&from=OLD   200, the stream; an error after the
//	                                 stream began is the trailer
//	                                 Vdisk-Error, and the body ends short
//	POST /receive?name=NAME         the stream as the body; 201, the
//	  [&mode=OCTAL][&uid=N][&gid=N]  transfer.Stats, once NAME is durable;
//	                                 mode and owner override the stream's

// errorTrailer names the trailer a send that failed midway carries.
const errorTrailer = "Vdisk-Error"

// DiffReply is the answer of GET /diff.
type DiffReply struct {
	Changes       []image.Change `json:"changes"`
	Related       bool           `json:"related"`
	ComparedBytes int64          `json:"compared_bytes"`
}

func handleTransfers(mux *http.ServeMux, ctl Controller) {
	mux.HandleFunc("GET /diff", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		changes, st, err := ctl.Diff(q.Get("old"), q.Get("new"))
		if err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(DiffReply{Changes: changes, Related: st.Related, ComparedBytes: st.ComparedBytes})
	})
	mux.HandleFunc("GET /send", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		w.Header().Set("Trailer", errorTrailer)
		w.Header().Set("Content-Type", "application/octet-stream")
		cw := &countingWriter{w: w}
		send := ctl.Send
		if q.Get("raw") == "1" {
			send = rawSend(ctl)
		}
		_, err := send(cw, q.Get("disk"), q.Get("from"))
		if err == nil {
			return
		}
		if cw.n == 0 {
			w.Header().Del("Trailer")
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		w.Header().Set(errorTrailer, err.Error())
	})
	mux.HandleFunc("POST /receive", func(w http.ResponseWriter, r *http.Request) {
		o, err := receiveOptions(r.URL.Query())
		if err == nil && r.URL.Query().Get("encrypt") == "1" {
			var keys []*crypt.Secret
			if keys, err = keySecrets(r, 1); err == nil {
				defer closeSecrets(keys)
				o.Key = keys[0]
			}
		}
		if err != nil {
			drainRefused(w, r.Body)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		st, err := ctl.Receive(r.Body, r.URL.Query().Get("name"), o)
		if err != nil {
			drainRefused(w, r.Body)
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(st)
	})
}

// A receive refused before its stream has all arrived (a missing base, a
// name in use) takes in the rest of the stream, up to drainBytes and for
// at most drainTime, before it answers: a client still writing the stream
// then reads the answer, where a connection closed under it would only
// have told it "broken pipe".
const (
	drainBytes = 256 << 20
	drainTime  = 10 * time.Second
)

func drainRefused(w http.ResponseWriter, body io.Reader) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(drainTime))
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainBytes))
}

// receiveOptions reads the mode (octal, permission bits only), uid and gid
// of POST /receive; those absent stay nil.
func receiveOptions(q url.Values) (transfer.ReceiveOptions, error) {
	var o transfer.ReceiveOptions
	for _, f := range []struct {
		key  string
		base int
		dst  **uint32
	}{{"mode", 8, &o.Mode}, {"uid", 10, &o.UID}, {"gid", 10, &o.GID}} {
		v := q.Get(f.key)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, f.base, 32)
		if err != nil || f.key == "mode" && n&^0o777 != 0 {
			return o, fmt.Errorf("receive: bad %s %q", f.key, v)
		}
		k := uint32(n)
		*f.dst = &k
	}
	return o, nil
}

// ErrDaemonStopped: the daemon serving the mount stopped (killed, or
// unmounted) while a transfer went through its socket.
var ErrDaemonStopped = errors.New("telemetry: the vdiskfs daemon stopped")

// connTrace notes whether a request got a connection to the daemon, so
// that a failure after it is told from a mount nothing serves.
type connTrace struct{ connected atomic.Bool }

func (t *connTrace) request(method, url string, body io.Reader) (*http.Request, error) {
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { t.connected.Store(true) },
	})
	return http.NewRequestWithContext(ctx, method, url, body)
}

// broken is the error of a transfer (what: "send" or "receive") whose
// exchange with the daemon failed with err: before a connection was made,
// nothing serves the mount (ErrNotServing); after, the daemon stopped if
// it does not answer any more (ErrDaemonStopped; after says what that
// means for the transfer), else the connection broke.
func (t *connTrace) broken(abs, sock, what, after string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if !t.connected.Load() {
		return fmt.Errorf("%s (socket %s): %w: %v", abs, sock, ErrNotServing, err)
	}
	if answers(abs) {
		return fmt.Errorf("the connection to the vdiskfs daemon serving %s broke during the %s: %v", abs, what, err)
	}
	return &stoppedError{msg: fmt.Sprintf("the vdiskfs daemon serving %s stopped during the %s%s", abs, what, after)}
}

// answers reports whether the daemon of the mount at abs answers GET
// /stats within a few seconds. A socket that takes connections proves
// nothing: a dying daemon's listener takes them until its last thread has
// exited.
func answers(abs string) bool {
	c, _, _, err := client(abs, 5*time.Second)
	if err != nil {
		return false
	}
	resp, err := c.Get("http://vdiskfs/stats")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stoppedError is ErrDaemonStopped with the message broken makes.
type stoppedError struct{ msg string }

func (e *stoppedError) Error() string        { return e.msg }
func (e *stoppedError) Is(target error) bool { return target == ErrDaemonStopped }

// errorsOf is an io.Reader or io.Writer that keeps the error of the one
// it wraps, so that a failure of the local side of a transfer (the
// stream's source or destination) is told from the daemon's.
type errorsOf struct {
	r   io.Reader
	w   io.Writer
	err error
}

func (e *errorsOf) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

func (e *errorsOf) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

// countingWriter counts what went through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Diff asks the mount at mountpoint for the changes of its disk new from
// its disk old (image.Diff).
func Diff(mountpoint, old, new string) (DiffReply, error) {
	var rep DiffReply
	err := doJSON(mountpoint, http.MethodGet, "diff?"+url.Values{"old": {old}, "new": {new}}.Encode(), nil, http.StatusOK, 0, &rep)
	return rep, err
}

// Send copies the stream of the mount's disk (incremental from from when
// not "") to w. When the daemon stops during the send, the error says so
// (ErrDaemonStopped), and what w got is a stream cut short.
func Send(mountpoint, disk, from string, w io.Writer) (int64, error) {
	return sendWith(mountpoint, url.Values{"disk": {disk}, "from": {from}}, w)
}

// SendRaw is Send of a raw stream of an encrypted disk (keys.go).
func SendRaw(mountpoint, disk, from string, w io.Writer) (int64, error) {
	return sendWith(mountpoint, url.Values{"disk": {disk}, "from": {from}, "raw": {"1"}}, w)
}

func sendWith(mountpoint string, q url.Values, w io.Writer) (int64, error) {
	c, abs, sock, err := client(mountpoint, 0)
	if err != nil {
		return 0, err
	}
	var tr connTrace
	req, err := tr.request("GET", "http://vdiskfs/send?"+q.Encode(), nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, tr.broken(abs, sock, "send", "", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, errorOf(resp)
	}
	dst := &errorsOf{w: w}
	n, err := io.Copy(dst, resp.Body)
	if msg := resp.Trailer.Get(errorTrailer); msg != "" {
		return n, &remoteError{msg: msg}
	}
	if dst.err != nil {
		return n, fmt.Errorf("send from %s: write the stream: %w", abs, dst.err)
	}
	if err != nil {
		return n, tr.broken(abs, sock, "send", " (the stream written is cut short, and a receiver refuses it)", err)
	}
	return n, nil
}

// Receive sends the stream r to the mount, which makes it its disk name,
// with o's mode and owner when set (o.Progress is not used). When the
// daemon stops during the receive, the error says so (ErrDaemonStopped).
func Receive(mountpoint, name string, r io.Reader, o transfer.ReceiveOptions) (transfer.Stats, error) {
	return receiveWith(mountpoint, name, r, o, nil)
}

// ReceiveEncrypted is Receive of an encrypted disk (transfer.ReceiveOptions.Key)
// under the key of the key file key, passed to the daemon open (keys.go).
func ReceiveEncrypted(mountpoint, name string, r io.Reader, o transfer.ReceiveOptions, key *os.File) (transfer.Stats, error) {
	return receiveWith(mountpoint, name, r, o, key)
}

func receiveWith(mountpoint, name string, r io.Reader, o transfer.ReceiveOptions, key *os.File) (transfer.Stats, error) {
	c, abs, sock, err := client(mountpoint, 0)
	if err != nil {
		return transfer.Stats{}, err
	}
	q := url.Values{"name": {name}}
	if key != nil {
		c = withRights(c, sock, key)
		q.Set("encrypt", "1")
	}
	if o.Mode != nil {
		q.Set("mode", strconv.FormatUint(uint64(*o.Mode), 8))
	}
	if o.UID != nil {
		q.Set("uid", strconv.FormatUint(uint64(*o.UID), 10))
	}
	if o.GID != nil {
		q.Set("gid", strconv.FormatUint(uint64(*o.GID), 10))
	}
	var tr connTrace
	src := &errorsOf{r: r}
	req, err := tr.request("POST", "http://vdiskfs/receive?"+q.Encode(), io.NopCloser(src))
	if err != nil {
		return transfer.Stats{}, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	after := fmt.Sprintf(" (a receive is all or nothing: %s is in the store only if it had arrived whole)", name)
	resp, err := c.Do(req)
	if err != nil {
		if src.err != nil {
			return transfer.Stats{}, fmt.Errorf("receive into %s: read the stream: %w", abs, src.err)
		}
		return transfer.Stats{}, tr.broken(abs, sock, "receive", after, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return transfer.Stats{}, errorOf(resp)
	}
	var st transfer.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return transfer.Stats{}, tr.broken(abs, sock, "receive", after, err)
	}
	return st, nil
}
