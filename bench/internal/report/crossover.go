package report

import (
	"image/color"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// CrossoverLine is one distance of the crossover plot: the hybrid's
// throughput divided by the table's (Ratio) at each retry share (Share, in
// [0, 1]), with the lowest and highest round's ratio (Low, High).
type CrossoverLine struct {
	Label            string
	Share            []float64
	Ratio, Low, High []float64
}

var distanceColors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// PlotCrossover draws hybrid ÷ table saturated throughput against the retry
// share, one line per distance with each share's round spread as an error
// bar, and the break-even line at 1, into a PNG file.
func PlotCrossover(path string, lines []CrossoverLine) error {
	p := plot.New()
	p.Title.Text = "hybrid ÷ table, saturated throughput"
	p.X.Label.Text = "retry share (%)"
	p.Y.Label.Text = "hybrid ÷ table"
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	var hi float64 = 1
	var shares []float64
	for i, l := range lines {
		c := distanceColors[i%len(distanceColors)]
		var pts plotter.XYs
		var errs plotter.YErrors
		for j, s := range l.Share {
			pts = append(pts, plotter.XY{X: 100 * s, Y: l.Ratio[j]})
			errs = append(errs, struct{ Low, High float64 }{l.Ratio[j] - l.Low[j], l.High[j] - l.Ratio[j]})
			hi = max(hi, l.High[j])
			shares = append(shares, 100*s)
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color, line.Width = c, vg.Points(1.5)
		points.Color, points.Shape = c, draw.CircleGlyph{}
		bars, err := plotter.NewYErrorBars(struct {
			plotter.XYer
			plotter.YErrorer
		}{pts, errs})
		if err != nil {
			return err
		}
		bars.Color = c
		p.Add(line, points, bars)
		p.Legend.Add(l.Label, line, points)
	}
	if len(shares) > 0 {
		even, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 1}, {X: 100, Y: 1}})
		if err != nil {
			return err
		}
		even.Color = color.Gray{Y: 0x66}
		even.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(even)
		p.Legend.Add("break-even", even)
		slices.Sort(shares)
		p.X.Tick.Marker = fixedTicks(slices.Compact(shares))
		p.X.Min, p.X.Max = -3, 100
		p.Y.Min, p.Y.Max = 0, hi*1.3
	}
	return writePanels(path, []*plot.Plot{p})
}
