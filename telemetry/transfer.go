package telemetry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

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
//	                                 transfer.Stats, once NAME is durable

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
		_, err := ctl.Send(cw, q.Get("disk"), q.Get("from"))
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
		st, err := ctl.Receive(r.Body, r.URL.Query().Get("name"))
		if err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(st)
	})
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
	c, abs, sock, err := client(mountpoint, 0)
	if err != nil {
		return DiffReply{}, err
	}
	resp, err := c.Get("http://vdiskfs/diff?" + url.Values{"old": {old}, "new": {new}}.Encode())
	if err != nil {
		return DiffReply{}, fmt.Errorf("%s (socket %s): %w: %v", abs, sock, ErrNotServing, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return DiffReply{}, errorOf(resp)
	}
	var rep DiffReply
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return DiffReply{}, fmt.Errorf("diff reply of %s: %w", abs, err)
	}
	return rep, nil
}

// Send copies the stream of the mount's disk (incremental from from when
// not "") to w.
func Send(mountpoint, disk, from string, w io.Writer) (int64, error) {
	c, abs, sock, err := client(mountpoint, 0)
	if err != nil {
		return 0, err
	}
	resp, err := c.Get("http://vdiskfs/send?" + url.Values{"disk": {disk}, "from": {from}}.Encode())
	if err != nil {
		return 0, fmt.Errorf("%s (socket %s): %w: %v", abs, sock, ErrNotServing, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, errorOf(resp)
	}
	n, err := io.Copy(w, resp.Body)
	if msg := resp.Trailer.Get(errorTrailer); msg != "" {
		return n, &remoteError{msg: msg}
	}
	if err != nil {
		return n, fmt.Errorf("send from %s: %w", abs, err)
	}
	return n, nil
}

// Receive sends the stream r to the mount, which makes it its disk name.
func Receive(mountpoint, name string, r io.Reader) (transfer.Stats, error) {
	c, abs, sock, err := client(mountpoint, 0)
	if err != nil {
		return transfer.Stats{}, err
	}
	resp, err := c.Post("http://vdiskfs/receive?"+url.Values{"name": {name}}.Encode(), "application/octet-stream", io.NopCloser(r))
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return transfer.Stats{}, fmt.Errorf("%s (socket %s): %w: %v", abs, sock, ErrNotServing, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return transfer.Stats{}, errorOf(resp)
	}
	var st transfer.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return transfer.Stats{}, fmt.Errorf("receive reply of %s: %w", abs, err)
	}
	return st, nil
}
