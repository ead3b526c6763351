package telemetry

// The catalog of a running mount through its Unix socket (`vdisk ls`,
// `info` and `fsck` given a mount point, or the path of a mounted store):
// the daemon holds the store, so it answers.
//
//	GET  /disks   200, []image.DiskInfo sorted by name (image.Store.List)
//	GET  /info    200, a StoreInfo
//	POST /check   200, the image.Report of image.Store.Check, run now on
//	              the mounted store (it stops writers while it runs)
//	POST /defrag?disk=NAME
//	              200, the image.DefragResult of image.Store.Defrag,
//	              once the disk is moved and committed
//
// Every admitted peer may list, describe and check (peer.go): they read
// the store's metadata, never a disk's data, and GET /stats names every
// disk and its size to the same peers already. Defrag needs the peer to
// be allowed to read the disk: it moves the disk's blocks without changing
// a byte, costing the I/O of reading and writing it. Disks are created,
// removed, renamed, resized, imported and exported through the mount
// itself, which is what the kernel sees and where its permission checks
// apply; there is no endpoint for them.

import (
	"encoding/json"
	"net/http"
	"net/url"
	"time"

	"github.com/vdiskfs/vdiskfs/image"
)

// StoreInfo is the answer of GET /info: the store's capacity, use and
// metadata (image.Store.Info) and its format version.
type StoreInfo struct {
	Info    image.Info `json:"info"`
	Version int        `json:"format_version"`
}

func handleCatalog(mux *http.ServeMux, ctl Controller) {
	mux.HandleFunc("GET /disks", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, ctl.List())
	})
	mux.HandleFunc("GET /info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, StoreInfo{Info: ctl.Info(), Version: ctl.Version()})
	})
	mux.HandleFunc("POST /check", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, ctl.Check())
	})
	mux.HandleFunc("POST /defrag", func(w http.ResponseWriter, r *http.Request) {
		res, err := ctl.Defrag(r.URL.Query().Get("disk"))
		if err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// List lists the disks of the store mounted at mountpoint, sorted by name,
// through the mount's socket.
func List(mountpoint string) ([]image.DiskInfo, error) {
	var disks []image.DiskInfo
	err := getJSON(mountpoint, http.MethodGet, "disks", 30*time.Second, &disks)
	return disks, err
}

// Info describes the store mounted at mountpoint through the mount's
// socket.
func Info(mountpoint string) (StoreInfo, error) {
	var in StoreInfo
	err := getJSON(mountpoint, http.MethodGet, "info", 30*time.Second, &in)
	return in, err
}

// Check runs image.Store.Check on the store mounted at mountpoint, through
// the mount's socket, and returns its report. It waits as long as the check
// takes; writes to the mount wait meanwhile.
func Check(mountpoint string) (*image.Report, error) {
	var rep image.Report
	if err := getJSON(mountpoint, http.MethodPost, "check", 0, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// Defrag moves the disk called disk of the store mounted at mountpoint
// into contiguous blocks (image.Store.Defrag), through the mount's socket,
// and returns once that is committed. It waits as long as the copy takes.
func Defrag(mountpoint, disk string) (image.DefragResult, error) {
	var res image.DefragResult
	err := getJSON(mountpoint, http.MethodPost, "defrag?disk="+url.QueryEscape(disk), 0, &res)
	return res, err
}

// getJSON makes the request method /what of the mount's socket and decodes
// its JSON answer into v, waiting at most timeout (0: as long as it takes).
func getJSON(mountpoint, method, what string, timeout time.Duration, v any) error {
	return doJSON(mountpoint, method, what, nil, http.StatusOK, timeout, v)
}
