package backend

import (
	"fmt"
	"os"
	"strings"
)

// RBDPrefix starts the name of a store on a Ceph RBD image.
const RBDPrefix = "rbd:"

// RBDName is a parsed RBD store name, in QEMU's syntax:
//
//	rbd:POOL/IMAGE[:KEY=VALUE...]
//	rbd:POOL/NAMESPACE/IMAGE[:KEY=VALUE...]
//
// The keys id (or user) and conf name the Ceph client (client.ID) and the
// configuration file; any other key is a Ceph configuration option set on
// the connection (rbd:pool/img:mon_host=10.0.0.1). A ':' or '\' inside a
// value is escaped with a backslash.
type RBDName struct {
	Pool, Namespace, Image string
	// User is the client id (client.User); "" takes it from CEPH_ARGS
	// (--id, --user, --name) and else librados's default, admin.
	User string
	// Conf is the configuration file; "" takes $CEPH_CONF and else
	// librados's search (/etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf).
	Conf string
	// Options are further configuration options, in order.
	Options [][2]string
}

// IsRBD reports whether name is an RBD store name (it starts with "rbd:").
func IsRBD(name string) bool { return strings.HasPrefix(name, RBDPrefix) }

// ParseRBDName parses an RBD store name (see RBDName).
func ParseRBDName(name string) (RBDName, error) {
	var n RBDName
	if !IsRBD(name) {
		return n, fmt.Errorf("%q is not an RBD store name (rbd:POOL/IMAGE)", name)
	}
	fields := splitEscaped(strings.TrimPrefix(name, RBDPrefix))
	parts := strings.Split(fields[0], "/")
	switch len(parts) {
	case 2:
		n.Pool, n.Image = parts[0], parts[1]
	case 3:
		n.Pool, n.Namespace, n.Image = parts[0], parts[1], parts[2]
	default:
		return n, fmt.Errorf("RBD store name %q: want rbd:POOL/IMAGE or rbd:POOL/NAMESPACE/IMAGE", name)
	}
	if n.Pool == "" || n.Image == "" || (len(parts) == 3 && n.Namespace == "") {
		return n, fmt.Errorf("RBD store name %q: empty pool, namespace or image name", name)
	}
	if strings.ContainsAny(fields[0], "@") {
		return n, fmt.Errorf("RBD store name %q: a store is an image, not a snapshot (no @SNAP)", name)
	}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return n, fmt.Errorf("RBD store name %q: option %q is not KEY=VALUE", name, f)
		}
		switch k {
		case "id", "user":
			n.User = v
		case "conf":
			n.Conf = v
		default:
			n.Options = append(n.Options, [2]string{k, v})
		}
	}
	return n, nil
}

// String is the name in the syntax ParseRBDName reads.
func (n RBDName) String() string {
	var b strings.Builder
	b.WriteString(RBDPrefix)
	b.WriteString(n.ImageSpec())
	if n.User != "" {
		b.WriteString(":id=" + escapeValue(n.User))
	}
	if n.Conf != "" {
		b.WriteString(":conf=" + escapeValue(n.Conf))
	}
	for _, o := range n.Options {
		b.WriteString(":" + o[0] + "=" + escapeValue(o[1]))
	}
	return b.String()
}

// ImageSpec is POOL/IMAGE or POOL/NAMESPACE/IMAGE, the rbd command's
// image-spec: the image without the client's options.
func (n RBDName) ImageSpec() string {
	if n.Namespace != "" {
		return n.Pool + "/" + n.Namespace + "/" + n.Image
	}
	return n.Pool + "/" + n.Image
}

// SameStore reports whether a and b name the same store: the same image for
// RBD names (whatever the client options), the same file otherwise.
func SameStore(a, b string) bool {
	if IsRBD(a) || IsRBD(b) {
		na, errA := ParseRBDName(a)
		nb, errB := ParseRBDName(b)
		return errA == nil && errB == nil && na.ImageSpec() == nb.ImageSpec()
	}
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// cephArgsUser returns the client id CEPH_ARGS gives (--id ID, --user ID,
// --name client.ID, -n client.ID, and the --opt=value forms), or "".
func cephArgsUser(cephArgs string) string {
	args := strings.Fields(cephArgs)
	user := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		key, val, hasVal := strings.Cut(a, "=")
		switch key {
		case "--id", "--user", "--name", "-n":
		default:
			continue
		}
		if !hasVal {
			if i+1 == len(args) {
				break
			}
			i++
			val = args[i]
		}
		if key == "--name" || key == "-n" {
			val = strings.TrimPrefix(val, "client.")
		}
		user = val
	}
	return user
}

// splitEscaped splits s at every ':' not escaped by a backslash, and
// removes the escapes.
func splitEscaped(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == ':':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(out, cur.String())
}

func escapeValue(v string) string {
	return strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace(v)
}
