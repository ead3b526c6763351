// Package contrib holds no code: it is the operator files shipped beside the
// binary (systemd units, fstab example, Grafana dashboard, Prometheus
// alerts). Its tests check them against the code: the units with
// systemd-analyze verify, the dashboard's and alerts' metric names against
// what a mount's /metrics serves.
package contrib
