package report

import (
	"os"

	"gonum.org/v1/plot/vg/vgimg"
)

func writePNG(path string, img vgimg.PngCanvas) error {
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
