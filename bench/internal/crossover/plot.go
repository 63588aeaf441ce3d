package crossover

import (
	"image/color"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// line is one distance of the plot: hybrid ÷ table at each retry share (in
// [0, 1]), with the lowest and highest round's ratio.
type line struct {
	label            string
	share            []float64
	ratio, low, high []float64
}

var colors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// plotRatios draws hybrid ÷ table saturated throughput against the retry
// share, one line per distance with each share's round spread as an error
// bar, and the break-even line at 1, into a PNG file at path.
func plotRatios(path string, lines []line) error {
	p := plot.New()
	p.Title.Text = "hybrid ÷ table, saturated throughput"
	p.X.Label.Text = "retry share (%)"
	p.Y.Label.Text = "hybrid ÷ table"
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	hi := 1.0
	var shares []float64
	for i, l := range lines {
		c := colors[i%len(colors)]
		var pts plotter.XYs
		var errs plotter.YErrors
		for j, s := range l.share {
			pts = append(pts, plotter.XY{X: 100 * s, Y: l.ratio[j]})
			errs = append(errs, struct{ Low, High float64 }{l.ratio[j] - l.low[j], l.high[j] - l.ratio[j]})
			hi = max(hi, l.high[j])
			shares = append(shares, 100*s)
		}
		if len(pts) == 0 {
			continue
		}
		ln, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		ln.Color, ln.Width = c, vg.Points(1.5)
		points.Color, points.Shape = c, draw.CircleGlyph{}
		bars, err := plotter.NewYErrorBars(struct {
			plotter.XYer
			plotter.YErrorer
		}{pts, errs})
		if err != nil {
			return err
		}
		bars.Color = c
		p.Add(ln, points, bars)
		p.Legend.Add(l.label, ln, points)
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
		p.X.Tick.Marker = ticks(slices.Compact(shares))
		p.X.Min, p.X.Max = -3, 100
		p.Y.Min, p.Y.Max = 0, hi*1.3
	}
	img := vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(5.5*vg.Inch, 4.2*vg.Inch), vgimg.UseDPI(110))}
	p.Draw(draw.New(img))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ticks labels exactly the given values (the shares).
type ticks []float64

func (t ticks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, v := range t {
		if v >= lo && v <= hi {
			out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		}
	}
	return out
}
