package bigtable

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Files a report is written to.
const (
	MarkdownFile = "report.md"
	CSVFile      = "results.csv"
)

// Write writes report.md and results.csv into dir, creating it.
func (rep *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var md strings.Builder
	rep.Markdown(&md)
	if err := os.WriteFile(filepath.Join(dir, MarkdownFile), []byte(md.String()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, CSVFile))
	if err != nil {
		return err
	}
	if err := rep.CSV(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func us(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

func size(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%.0f kiB", float64(b)/(1<<10))
	}
}

func count(n int64) string {
	switch {
	case n >= 1_000_000 && n%100_000 == 0:
		return strconv.FormatFloat(float64(n)/1e6, 'f', -1, 64) + "M"
	case n >= 1_000 && n%100 == 0:
		return strconv.FormatFloat(float64(n)/1e3, 'f', -1, 64) + "k"
	default:
		return strconv.FormatInt(n, 10)
	}
}

// Markdown writes the report.
func (rep *Report) Markdown(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# Big table: claim, replay and sweeper at %s live rows\n\n", sizesList(rep.Steps))
	if rep.Interrupted {
		p("**INTERRUPTED**: the figures below are what ran.\n\n")
	}
	p("Command: `%s` (%s, started %s).\n\n", rep.Command, rep.Finished.Sub(rep.Started).Round(time.Second), rep.Started.UTC().Format(time.RFC3339))
	p("Table %s, created with `durable.Migrate` (migrations %v applied), dropped at the end. ", rep.Table, rep.Migrations)
	if rep.Partitions > 0 {
		p("Hash-partitioned on user_id into %d partitions (`durable.Config.Partitions`); sizes and statistics are summed over them. ", rep.Partitions)
	}
	p("Rows loaded with `INSERT ... SELECT FROM generate_series` in chunks (not through the store): ")
	p("user_id `user-<n %% 1e6>`, a uuid-like key, 32-byte request_hash, 16-byte owner_token, 1%% in progress, ")
	p("the rest answered (201, Location and Content-Type headers, a ~300-byte JSON body); created_at uniform over the last %v ", rep.Retention-rep.Headroom)
	p("(retention %v less %v of headroom, so no live row expires during the run), ", rep.Retention, rep.Headroom)
	p("plus %.1f%% of the live rows just past the retention (created 24h01m to 25h01m ago: one hour of keys, what an hourly sweep finds). ", 100*rep.ExpiredShare)
	p("Then `VACUUM ANALYZE`. Sizes are loaded in ascending order, each on top of the last.\n\n")
	p("Every operation goes through the real `*durable.Store` / `*durable.Sweeper`: %d samples per operation and concurrency %v. ", rep.Samples, rep.Concurrency)
	p("Replays pick answered keys uniformly over the whole table: the worst case for caching (real retries come seconds after the first request, on hot pages). ")
	p("Latency is per call, closed loop, on one pgx pool.\n\n")
	p("**Noise**: the bench, PostgreSQL and other agents' work share 2 cores; percentiles, maxima above all, move from run to run.\n\n")

	p("## Server\n\n| setting | value |\n|---|---|\n")
	for _, s := range rep.Settings {
		p("| %s | %s |\n", s.Name, s.Value)
	}
	if len(rep.Steps) > 0 {
		p("| fillfactor (table) | %s |\n", rep.Steps[0].Sizes.Fillfactor)
	}
	p("\n## Load\n\n| live rows | rows inserted | load time | rows/s | VACUUM ANALYZE |\n|---:|---:|---:|---:|---:|\n")
	for _, s := range rep.Steps {
		p("| %s | %d | %s | %.0f | %s |\n", count(s.Live), s.Loaded, s.Load.Round(time.Second/10), float64(s.Loaded)/s.Load.Seconds(), s.Vacuum.Round(time.Second/10))
	}

	p("\n## Size on disk\n\nAfter `VACUUM ANALYZE`, before the operations; indexes as found in the catalog. *bytes per million keys* divides by every row present (live and expired).\n\n")
	p("| live rows | rows present | relation | size | bytes per million keys |\n|---:|---:|---|---:|---:|\n")
	for _, s := range rep.Steps {
		for _, r := range s.Sizes.Relations {
			p("| %s | %d | %s | %s | %s |\n", count(s.Live), s.Sizes.Rows, r.Name, size(r.Bytes), size(perMillion(r.Bytes, s.Sizes.Rows)))
		}
		p("| %s | %d | **total** | **%s** | **%s** |\n", count(s.Live), s.Sizes.Rows, size(s.Sizes.Total), size(int64(s.Sizes.BytesPerMillion())))
	}
	if len(rep.Steps) > 0 {
		p("\nIndexes:\n\n")
		for _, r := range rep.Steps[0].Sizes.Relations {
			if r.Kind == "index" {
				p("- `%s`\n", r.Def)
			}
		}
	}

	p("\n## Latency\n\n| live rows | operation | concurrency | samples | errors | p50 | p99 | max |\n|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range rep.Steps {
		for _, o := range s.Ops {
			p("| %s | %s | %d | %d | %d | %s | %s | %s |\n", count(s.Live), o.Op, o.Conc, o.Samples, o.Errors, us(o.P50), us(o.P99), us(o.Max))
		}
	}
	for _, s := range rep.Steps {
		for _, o := range s.Ops {
			if o.FirstError != "" {
				p("\nFirst error of %s at %s, concurrency %d: `%s`\n", o.Op, count(s.Live), o.Conc, o.FirstError)
			}
		}
	}

	p("\n## HOT updates of the answer writes\n\nGrowth of the table's `n_tup_upd` and `n_tup_hot_upd` while the claims and Completes of new keys ran (each Complete is one update; a claim of a new key inserts).\n\n")
	p("| live rows | concurrency | n_tup_upd | n_tup_hot_upd | HOT share |\n|---:|---:|---:|---:|---:|\n")
	for _, s := range rep.Steps {
		for _, h := range s.Hot {
			p("| %s | %d | %d | %d | %.0f%% |\n", count(s.Live), h.Conc, h.Upd, h.HotUpd, 100*h.Share())
		}
	}

	p("\n## Sweeper\n\n`Sweeper.SweepOnce` with its defaults (batches of 1000 rows, 10 ms pause between batches) over the expired rows; a batch is one DELETE.\n\n")
	p("| live rows | expired rows | deleted | time | rows/s | batches | batch p50 | batch p99 | batch max |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range rep.Steps {
		w := s.Sweep
		p("| %s | %d | %d | %s | %.0f | %d | %s | %s | %s |\n", count(s.Live), w.Expired, w.Deleted, w.Took.Round(time.Millisecond), w.RowsPerSecond(), w.Batch.Samples, us(w.Batch.P50), us(w.Batch.P99), us(w.Batch.Max))
	}

	if len(rep.Phases) > 0 {
		ph0 := rep.Phases[0]
		p("\n## With the sweeper running concurrently, autovacuum off and on\n\n")
		p("At %s live rows: %s of mixed load on %d connections (half claim + Complete of new keys, half replayed claims) while the Sweeper sweeps a fresh batch of %d expired rows (then looks again every second). ",
			count(ph0.Live), ph0.Duration, ph0.Conc, ph0.Expired)
		p("The table's own autovacuum threshold is lowered for the phase (`autovacuum_vacuum_scale_factor = 0`, threshold a quarter of the batch), so that when the server's autovacuum is on, the sweeper's deletes bring the table's turn into the phase, as a few hours of sweeps would in production (the default scale factor 0.2 needs dead rows of a fifth of the table). ")
		p("The server's autovacuum is turned on only with `-autovacuum` (ALTER SYSTEM, restored at the end).\n\n")
		p("| autovacuum | operation | samples | errors | p50 | p99 | max |\n|---|---|---:|---:|---:|---:|---:|\n")
		for _, ph := range rep.Phases {
			for _, o := range ph.Ops {
				p("| %s | %s | %d | %d | %s | %s | %s |\n", ph.Autovacuum, o.Op, o.Samples, o.Errors, us(o.P50), us(o.P99), us(o.Max))
			}
		}
		p("\n| autovacuum | sweeper deleted | sweeper busy | batch p50 | batch p99 | batch max | autovacuum seen on the table | autovacuum runs finished | n_dead_tup start → end |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, ph := range rep.Phases {
			w := ph.Sweep
			p("| %s | %d of %d | %s | %s | %s | %s | %d s | %d | %d → %d |\n", ph.Autovacuum, w.Deleted, w.Expired, w.Took.Round(time.Millisecond), us(w.Batch.P50), us(w.Batch.P99), us(w.Batch.Max), ph.AutovacuumSeconds, ph.AutovacuumRuns, ph.DeadBefore, ph.DeadAt)
		}
	}
	if len(rep.Notes) > 0 {
		p("\n## Notes\n\n")
		for _, n := range rep.Notes {
			p("- %s\n", n)
		}
	}
}

func perMillion(b, rows int64) int64 {
	if rows == 0 {
		return 0
	}
	return int64(float64(b) / float64(rows) * 1e6)
}

func sizesList(steps []Step) string {
	var s []string
	for _, st := range steps {
		s = append(s, count(st.Live))
	}
	if len(s) == 0 {
		return "no"
	}
	return strings.Join(s, ", ")
}

// CSV writes every figure as one row: live_rows, section, item,
// concurrency, metric, value, unit.
func (rep *Report) CSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	row := func(live int64, section, item string, conc int, metric string, value any, unit string) {
		c := ""
		if conc > 0 {
			c = strconv.Itoa(conc)
		}
		_ = cw.Write([]string{strconv.FormatInt(live, 10), section, item, c, metric, fmt.Sprint(value), unit})
	}
	_ = cw.Write([]string{"live_rows", "section", "item", "concurrency", "metric", "value", "unit"})
	for _, s := range rep.Settings {
		row(0, "server", s.Name, 0, "setting", s.Value, "")
	}
	row(0, "schema", "migrations", 0, "versions applied", fmt.Sprint(rep.Migrations), "")
	lat := func(live int64, section string, o OpResult) {
		row(live, section, o.Op, o.Conc, "samples", o.Samples, "")
		row(live, section, o.Op, o.Conc, "errors", o.Errors, "")
		row(live, section, o.Op, o.Conc, "p50", o.P50.Microseconds(), "us")
		row(live, section, o.Op, o.Conc, "p99", o.P99.Microseconds(), "us")
		row(live, section, o.Op, o.Conc, "max", o.Max.Microseconds(), "us")
	}
	for _, s := range rep.Steps {
		row(s.Live, "load", "rows inserted", 0, "count", s.Loaded, "rows")
		row(s.Live, "load", "expired rows", 0, "count", s.Expired, "rows")
		row(s.Live, "load", "load time", 0, "duration", s.Load.Milliseconds(), "ms")
		row(s.Live, "load", "VACUUM ANALYZE", 0, "duration", s.Vacuum.Milliseconds(), "ms")
		row(s.Live, "size", "fillfactor", 0, "setting", s.Sizes.Fillfactor, "")
		for _, r := range s.Sizes.Relations {
			row(s.Live, "size", r.Name, 0, "bytes", r.Bytes, "B")
		}
		row(s.Live, "size", "total", 0, "bytes", s.Sizes.Total, "B")
		row(s.Live, "size", "total", 0, "bytes per million keys", int64(s.Sizes.BytesPerMillion()), "B")
		for _, o := range s.Ops {
			lat(s.Live, "latency", o)
		}
		for _, h := range s.Hot {
			row(s.Live, "hot", "complete", h.Conc, "n_tup_upd", h.Upd, "")
			row(s.Live, "hot", "complete", h.Conc, "n_tup_hot_upd", h.HotUpd, "")
			row(s.Live, "hot", "complete", h.Conc, "HOT share", strconv.FormatFloat(h.Share(), 'f', 4, 64), "")
		}
		sweepRows(row, s.Live, "sweeper", s.Sweep)
	}
	for _, ph := range rep.Phases {
		section := "phase autovacuum=" + ph.Autovacuum
		for _, o := range ph.Ops {
			lat(ph.Live, section, o)
		}
		sweepRows(row, ph.Live, section, ph.Sweep)
		row(ph.Live, section, "autovacuum", 0, "seconds seen on the table", ph.AutovacuumSeconds, "s")
		row(ph.Live, section, "autovacuum", 0, "runs finished", ph.AutovacuumRuns, "")
	}
	cw.Flush()
	return cw.Error()
}

func sweepRows(row func(int64, string, string, int, string, any, string), live int64, section string, w SweepResult) {
	row(live, section, "sweep", 0, "expired rows", w.Expired, "rows")
	row(live, section, "sweep", 0, "deleted", w.Deleted, "rows")
	row(live, section, "sweep", 0, "time", w.Took.Milliseconds(), "ms")
	row(live, section, "sweep", 0, "rows/s", int64(w.RowsPerSecond()), "rows/s")
	row(live, section, "sweep batch", 0, "batches", w.Batch.Samples, "")
	row(live, section, "sweep batch", 0, "p50", w.Batch.P50.Microseconds(), "us")
	row(live, section, "sweep batch", 0, "p99", w.Batch.P99.Microseconds(), "us")
	row(live, section, "sweep batch", 0, "max", w.Batch.Max.Microseconds(), "us")
}
