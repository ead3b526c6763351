package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// chartColumns is how many workload panels go side by side.
const chartColumns = 4

// panelMetric chooses what a workload's panel shows: IOPS when its average
// I/O is small (4 KiB random I/O), MB/s otherwise.
func panelMetric(cells []*cell) (key, label string) {
	for _, c := range cells {
		mb, iops := float64(c.get("mb_per_s").Median), float64(c.get("iops").Median)
		if iops > 0 && !math.IsNaN(mb) && mb*1e6/iops < 64*1024 {
			return "iops", "IOPS"
		}
	}
	return "mb_per_s", "MB/s"
}

// panel draws one workload: a bar per target at its median, with a
// min–max error bar, labelled with the ratio to the baseline.
func (r *report) panel(workload string) (*plot.Plot, error) {
	var cells []*cell
	for i := range r.Results {
		if r.Results[i].Workload == workload {
			cells = append(cells, &r.Results[i])
		}
	}
	p := plot.New()
	p.Title.Text = workload
	p.Title.TextStyle.Font.Size = vg.Points(11)
	key, label := panelMetric(cells)
	p.Y.Label.Text = label
	p.Y.Min = 0
	names := make([]string, len(cells))
	var top float64
	for i, c := range cells {
		names[i] = c.Target
		s := c.get(key)
		med := float64(s.Median)
		if math.IsNaN(med) {
			continue
		}
		bar, err := plotter.NewBarChart(plotter.Values{med}, vg.Points(26))
		if err != nil {
			return nil, err
		}
		bar.XMin = float64(i)
		bar.Color = plotutil.Color(targetColor(r.Targets, c.Target))
		bar.LineStyle.Width = 0
		p.Add(bar)
		lo, hi := float64(s.Min), float64(s.Max)
		top = max(top, hi, med)
		if s.N > 1 && hi > lo {
			eb, err := plotter.NewYErrorBars(errPoint{x: float64(i), y: med, lo: med - lo, hi: hi - med})
			if err != nil {
				return nil, err
			}
			eb.LineStyle.Width = vg.Points(1)
			p.Add(eb)
		}
		text := fmtNum(med, 0)
		if c.Target != r.Baseline && !math.IsNaN(float64(s.Ratio)) {
			text += fmt.Sprintf("\n%.2f×", float64(s.Ratio))
		}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: []plotter.XY{{X: float64(i), Y: 0}}, Labels: []string{text}})
		if err != nil {
			return nil, err
		}
		for j := range lb.TextStyle {
			lb.TextStyle[j].XAlign = draw.XCenter
			lb.TextStyle[j].Font.Size = vg.Points(8)
			lb.TextStyle[j].Color = color.Black
		}
		lb.Offset = vg.Point{Y: vg.Points(3)}
		p.Add(lb)
	}
	p.Y.Max = top * 1.12
	p.Y.Tick.Marker = niceTicks{}
	p.NominalX(names...)
	p.X.Tick.Label.Font.Size = vg.Points(8)
	if len(names) > 2 {
		p.X.Tick.Label.Rotation = math.Pi / 6
		p.X.Tick.Label.XAlign = draw.XRight
		p.X.Tick.Label.YAlign = draw.YCenter
	}
	p.Y.Tick.Label.Font.Size = vg.Points(8)
	p.Y.Label.TextStyle.Font.Size = vg.Points(9)
	return p, nil
}

// niceTicks marks 0 and 3 to 6 round steps (1, 2, 2.5 or 5 × 10^k),
// labelled without trailing zeros.
type niceTicks struct{}

func (niceTicks) Ticks(lo, hi float64) []plot.Tick {
	span := hi - lo
	if span <= 0 || math.IsNaN(span) || math.IsInf(span, 0) {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'f', -1, 64)}}
	}
	mag := math.Pow(10, math.Floor(math.Log10(span/5)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if span/(m*mag) <= 6 {
			step = m * mag
			break
		}
	}
	var ts []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ts
}

// targetColor gives every target the same color in every panel.
func targetColor(targets []string, t string) int {
	for i, x := range targets {
		if x == t {
			return i
		}
	}
	return len(targets)
}

// errPoint is one bar's median and its distances to min and max.
type errPoint struct{ x, y, lo, hi float64 }

func (e errPoint) Len() int                      { return 1 }
func (e errPoint) XY(int) (float64, float64)     { return e.x, e.y }
func (e errPoint) YError(int) (float64, float64) { return e.lo, e.hi }

// writeChart draws every workload's panel in a grid, to PNG or SVG by the
// file name's extension.
func (r *report) writeChart(path string) error {
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".png" && ext != ".svg" {
		return fmt.Errorf("--chart %s: use a .png or .svg file name", path)
	}
	names := r.workloadNames()
	rows := (len(names) + chartColumns - 1) / chartColumns
	cols := min(len(names), chartColumns)
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	for i, w := range names {
		p, err := r.panel(w)
		if err != nil {
			return err
		}
		plots[i/chartColumns][i%chartColumns] = p
	}
	const titleH = 0.45 // inches
	w := vg.Length(cols) * vg.Length(max(2.6, 0.75*float64(len(r.Targets)))) * vg.Inch
	h := vg.Length(rows)*2.5*vg.Inch + titleH*vg.Inch
	var (
		canvas vg.CanvasWriterTo
		dc     draw.Canvas
	)
	if ext == ".svg" {
		c := vgsvg.New(w, h)
		canvas, dc = c, draw.New(c)
	} else {
		c := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
		canvas, dc = vgimg.PngCanvas{Canvas: c}, draw.New(c)
	}
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	title := plot.New().Title.TextStyle
	title.Font.Size = vg.Points(12)
	title.XAlign = draw.XCenter
	title.YAlign = draw.YTop
	rounds := "1 round"
	if r.Config.Rounds > 1 {
		rounds = fmt.Sprintf("%d rounds, whiskers min–max", r.Config.Rounds)
	}
	dc.FillText(title, vg.Point{X: w / 2, Y: h - vg.Points(6)},
		fmt.Sprintf("%s: median of %s; label: median, × %s", strings.Join(r.Targets, " vs "), rounds, r.Baseline))
	body := draw.Crop(dc, 0, 0, 0, -titleH*vg.Inch)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(12), PadY: vg.Points(12),
		PadTop: vg.Points(4), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	canvases := plot.Align(plots, tiles, body)
	for i := range plots {
		for j := range plots[i] {
			if plots[i][j] != nil {
				plots[i][j].Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = canvas.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
