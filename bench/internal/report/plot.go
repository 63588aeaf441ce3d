package report

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

type series struct {
	strategy, impl string
	color          color.Color
}

var (
	tableColor  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	hybridColor = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

// allSeries: a colour per strategy; the guard solid with circles, the
// ceiling dashed with squares, the minimal dotted with triangles.
var allSeries = []series{
	{"table", "guard", tableColor},
	{"hybrid", "guard", hybridColor},
	{"table", "ceiling", tableColor},
	{"hybrid", "ceiling", hybridColor},
	{"table", "minimal", tableColor},
	{"hybrid", "minimal", hybridColor},
}

// PlotP99 draws p99 latency against offered load, one panel per scenario,
// both axes logarithmic, into a PNG file.
func (r *Report) PlotP99(path string) error {
	return r.plot(path, "p99 latency (ms)", true, func(row Row) float64 {
		return float64(row.P99) / float64(time.Millisecond)
	}, false)
}

// PlotThroughput draws achieved against offered throughput, one panel per
// scenario, both axes logarithmic, into a PNG file. The dotted diagonal is
// a system that keeps up.
func (r *Report) PlotThroughput(path string) error {
	return r.plot(path, "achieved (req/s)", true, func(row Row) float64 { return row.Achieved }, true)
}

func (r *Report) plot(path, ylabel string, logY bool, y func(Row) float64, diagonal bool) error {
	scenarios := r.Scenarios()
	if len(scenarios) == 0 {
		scenarios = []string{"(no data)"}
	}
	var panels []*plot.Plot
	for _, sc := range scenarios {
		p := plot.New()
		p.Title.Text = sc
		for _, row := range r.Rows {
			if row.Scenario == sc {
				p.Title.Text = fmt.Sprintf("%s: %s", sc, row.Pattern)
				break
			}
		}
		p.X.Label.Text = "offered (req/s)"
		p.Y.Label.Text = ylabel
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		p.Legend.Left = true
		var maxOffered float64
		for _, s := range allSeries {
			rows := r.Series(sc, s.strategy, s.impl)
			var pts plotter.XYs
			for _, row := range rows {
				v := y(row)
				if row.Offered <= 0 || (logY && v <= 0) {
					continue
				}
				pts = append(pts, plotter.XY{X: row.Offered, Y: v})
				maxOffered = max(maxOffered, row.Offered)
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color = s.color
			line.Width = vg.Points(1.5)
			points.Color = s.color
			switch s.impl {
			case "ceiling":
				line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				points.Shape = draw.BoxGlyph{}
			case "minimal":
				line.Dashes = []vg.Length{vg.Points(1.5), vg.Points(2.5)}
				points.Shape = draw.TriangleGlyph{}
			default:
				points.Shape = draw.CircleGlyph{}
			}
			p.Add(line, points)
			p.Legend.Add(s.strategy+" "+s.impl, line, points)
		}
		if maxOffered > 0 { // log scales need data: an empty panel keeps linear axes
			var offered []float64
			for _, row := range r.Rows {
				if row.Scenario == sc && !slices.Contains(offered, row.Offered) {
					offered = append(offered, row.Offered)
				}
			}
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = fixedTicks(offered)
			p.X.Min, p.X.Max = slices.Min(offered)/1.15, slices.Max(offered)*1.15
			if logY {
				p.Y.Scale = plot.LogScale{}
				p.Y.Tick.Marker = ticks125{}
				// Room above the data for the legend.
				p.Y.Max *= 4
			} else {
				p.Y.Max *= 1.35
			}
		}
		if diagonal && maxOffered > 0 {
			minOffered := maxOffered
			for _, row := range r.Rows {
				if row.Scenario == sc && row.Offered > 0 {
					minOffered = min(minOffered, row.Offered)
				}
			}
			if err := addOffered(p, minOffered, maxOffered); err != nil {
				return err
			}
		}
		panels = append(panels, p)
	}
	return writePanels(path, panels)
}

// addOffered draws the achieved = offered diagonal from lo to hi on p, dashed
// grey, with its legend entry.
func addOffered(p *plot.Plot, lo, hi float64) error {
	d, err := plotter.NewLine(plotter.XYs{{X: lo, Y: lo}, {X: hi, Y: hi}})
	if err != nil {
		return err
	}
	d.Color = color.Gray{Y: 0x99}
	d.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	p.Add(d)
	p.Legend.Add("offered", d)
	return nil
}

// writePanels draws panels side by side, one per scenario, aligned, into a
// PNG file at path.
func writePanels(path string, panels []*plot.Plot) error {
	const panelW, panelH = 5.5 * vg.Inch, 4.2 * vg.Inch
	img := vgimg.PngCanvas{Canvas: vgimg.NewWith(
		vgimg.UseWH(panelW*vg.Length(len(panels)), panelH), vgimg.UseDPI(110))}
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{panels}, tiles, draw.New(img))
	for j, p := range panels {
		p.Draw(canvases[0][j])
	}
	return writePNG(path, img)
}

// fixedTicks labels exactly the given values (the offered rates).
type fixedTicks []float64

func (t fixedTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, v := range t {
		if v >= lo && v <= hi {
			out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		}
	}
	return out
}

// ticks125 labels 1, 2 and 5 times each power of ten, with minor ticks at
// the other integers, for a logarithmic axis.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	if !(lo > 0) || !(hi > lo) {
		return out
	}
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		base := math.Pow(10, e)
		for m := 1; m <= 9; m++ {
			v := float64(m) * base
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			out = append(out, t)
		}
	}
	return out
}
