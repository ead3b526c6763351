package contrib

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ncw/directio"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/telemetry"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// source is a telemetry source over a real store on the memory backend,
// with FUSE latency histograms for the operations the mount times.
type source struct {
	s   *image.Store
	ops map[string]image.HistogramSnapshot
}

func (s source) Metrics() image.Metrics                        { return s.s.Metrics() }
func (s source) OpMetrics() map[string]image.HistogramSnapshot { return s.ops }
func (s source) StoreFailed() bool                             { return false }

// scrape serves /metrics for a store with one written disk, as a mount
// does, and parses the text a Prometheus scrape gets.
func scrape(t *testing.T) map[string]*dto.MetricFamily {
	mem := backend.NewMem(64 << 20)
	if err := image.Format(mem, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(mem, image.Options{CommitInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Create("vm.raw", 0, image.Attr{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	d, err := s.OpenDisk("vm.raw")
	if err != nil {
		t.Fatal(err)
	}
	buf := directio.AlignedBlock(1 << 20)
	if _, err := d.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Close()
	ops := map[string]image.HistogramSnapshot{}
	for _, op := range []string{"READ", "WRITE", "FSYNC"} { // a subset of fs's timed operations
		h := image.NewLatencyHistogram()
		h.ObserveDuration(time.Millisecond)
		ops[op] = h.Snapshot()
	}
	rec := httptest.NewRecorder()
	telemetry.Handler(source{s, ops}, "/mnt", "store.img").ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// served maps every series name /metrics serves (a histogram serves
// NAME_bucket, NAME_sum and NAME_count) to the label names it carries.
func served(fams map[string]*dto.MetricFamily) map[string][]string {
	out := map[string][]string{}
	for name, f := range fams {
		var labels []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		names := []string{name}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names = []string{name + "_bucket", name + "_sum", name + "_count"}
			labels = append(labels, "le")
		}
		for _, n := range names {
			out[n] = labels
		}
	}
	return out
}

// selector is a vdiskfs metric named in a PromQL expression, with the label
// names of its {...} matchers.
var selector = regexp.MustCompile(`\b(vdiskfs_[a-z0-9_]+)\b(\{[^}]*\})?`)
var matcher = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)

// problems lists every vdiskfs metric in expr that /metrics does not
// serve, or that is selected by a label it does not carry (instance and job
// are added by the scrape), and counts the vdiskfs metrics named.
func problems(expr string, srv map[string][]string) (probs []string, named int) {
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		named++
		labels, ok := srv[m[1]]
		if !ok {
			probs = append(probs, m[1]+" is not served by /metrics")
			continue
		}
		for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
			if l := lm[1]; l != "instance" && l != "job" && !slices.Contains(labels, l) {
				probs = append(probs, m[1]+" has no label "+l)
			}
		}
	}
	return probs, named
}

// checkExpr fails the test for each of expr's problems.
func checkExpr(t *testing.T, where, expr string, srv map[string][]string) int {
	t.Helper()
	probs, named := problems(expr, srv)
	for _, p := range probs {
		t.Errorf("%s: %s (expr %q)", where, p, expr)
	}
	return named
}

// collectExprs returns every string under a key "expr", "query" or
// "definition" in a decoded JSON or YAML document.
func collectExprs(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "query" || k == "definition") {
				*out = append(*out, s)
				continue
			}
			collectExprs(x, out)
		}
	case []any:
		for _, x := range v {
			collectExprs(x, out)
		}
	}
}

// Every metric the Grafana dashboard and the alert rules use is one that a
// mount's /metrics serves, with the labels they select on.
func TestDashboardAndAlertsUseServedMetrics(t *testing.T) {
	srv := served(scrape(t))
	var dash any
	b, err := os.ReadFile("grafana/vdiskfs.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana/vdiskfs.json: %v", err)
	}
	var exprs []string
	collectExprs(dash, &exprs)
	used := 0
	for _, e := range exprs {
		used += checkExpr(t, "grafana/vdiskfs.json", e, srv)
	}
	if used < 30 {
		t.Errorf("the dashboard names only %d vdiskfs metrics", used)
	}

	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	b, err = os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("prometheus/alerts.yml: %v", err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %q lacks expr, severity or summary", r.Alert)
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("alert %q: for: %v", r.Alert, err)
				}
			}
			checkExpr(t, "prometheus/alerts.yml "+r.Alert, r.Expr, srv)
		}
	}
	// The alerts issue 20 asks for.
	for _, want := range []string{"VdiskfsStoreNearlyFull", "VdiskfsStoreRefusesWrites", "VdiskfsFsyncLatencyHigh", "VdiskfsBackendErrors"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alerts.yml has no %s", want)
		}
	}
}

// The metric-name check catches a name /metrics does not serve, and a
// label a served metric does not carry.
func TestProblemsCatchesUnknownNames(t *testing.T) {
	srv := served(scrape(t))
	probs, named := problems(`rate(vdiskfs_no_such_metric_total[5m]) + vdiskfs_free_bytes{disk="x"} + vdiskfs_capacity_bytes`, srv)
	if len(probs) != 2 || named != 3 {
		t.Fatalf("problems %q, %d named; want the unknown metric and the unknown label, 3 named", probs, named)
	}
}

// systemd-analyze verify accepts the units (with the unit's /usr/bin/vdisk
// pointed at a fresh build, and its man: references at the generated man
// pages) and says nothing: it exits 0 even for unknown settings, which it
// only warns about.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		testutil.Missing(t, "no systemd-analyze here (tools/test.sh installs systemd)")
	}
	bin := testutil.VdiskBinary(t, false)
	docs := t.TempDir()
	if out, err := exec.Command(bin, "gendocs", docs).CombinedOutput(); err != nil {
		t.Fatalf("gendocs: %v: %s", err, out)
	}
	units, err := filepath.Glob("systemd/*.service")
	if err != nil || len(units) == 0 {
		t.Fatalf("no units in contrib/systemd: %v", err)
	}
	dir := t.TempDir()
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte("/usr/bin/vdisk ")) {
			t.Errorf("%s does not run /usr/bin/vdisk (where the package and make install PREFIX=/usr put it)", u)
		}
		b = bytes.ReplaceAll(b, []byte("/usr/bin/vdisk "), []byte(bin+" "))
		name := filepath.Base(u)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, "@.service") {
			name = strings.TrimSuffix(name, "@.service") + "@mnt-vdisks.service" // an instance: /mnt/vdisks
		}
		cmd := exec.Command(analyze, "verify", filepath.Join(dir, name))
		cmd.Env = append(os.Environ(), "MANPATH="+filepath.Join(docs, "man"), "SYSTEMD_LOG_COLOR=0")
		out, err := cmd.CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
	}
}

// promtool (Debian package prometheus), where installed, parses the alert
// rules and every dashboard query (Grafana's $__rate_interval and $instance
// replaced by what they stand for) as PromQL. CI does not install it: the
// metric-name test above is the one that must pass there.
func TestQueriesParseWithPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool here (package prometheus)")
	}
	if out, err := exec.Command(promtool, "check", "rules", "prometheus/alerts.yml").CombinedOutput(); err != nil {
		t.Errorf("promtool check rules alerts.yml: %v\n%s", err, out)
	}
	var dash any
	b, err := os.ReadFile("grafana/vdiskfs.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	collectExprs(dash, &exprs)
	var rules bytes.Buffer
	rules.WriteString("groups:\n- name: dashboard\n  rules:\n")
	n := 0
	for _, e := range exprs {
		if strings.HasPrefix(e, "label_values(") {
			continue // a Grafana variable query, not PromQL
		}
		e = strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*").Replace(e)
		q, _ := json.Marshal(e) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "  - record: dashboard:query%d\n    expr: %s\n", n, q)
		n++
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(path, rules.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules (the dashboard's %d queries): %v\n%s", n, err, out)
	}
}
