package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idemguard/idem/durable"
)

// migrate runs "migrate up", "migrate down" and "migrate status".
func (c *cmd) migrate(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("migrate needs up, down or status")
	}
	sub, args := args[0], args[1:]
	fs := c.flags("migrate " + sub)
	var (
		to         int64
		deleteKeys bool
	)
	switch sub {
	case "up":
		fs.IntVar(&c.cfg.Partitions, "partitions", 0, "create the table hash-partitioned into this many partitions (durable.Config.Partitions); an existing table must have them")
	case "status":
	case "down":
		fs.Int64Var(&to, "to", -1, "undo every applied migration above this version (default: the newest one only)")
		fs.BoolVar(&deleteKeys, "delete-keys", false, "allow undoing migration 1, which drops the table with every key and answer")
	default:
		return usagef("unknown migrate command %q: want up, down or status", sub)
	}
	if _, err := c.parse(fs, args, 0, ""); err != nil {
		return err
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := durable.MigrationStatus(ctx, pool, &c.cfg)
	if err != nil {
		return err
	}
	table := c.table()

	switch sub {
	case "status":
		return c.printMigrations(table, before)
	case "up":
		if err := durable.Migrate(ctx, pool, &c.cfg); err != nil {
			return err
		}
	case "down":
		if to == -1 {
			to = 0
			// One step: down to the applied version below the newest.
			var applied []int64
			for _, v := range before {
				if v.Applied {
					applied = append(applied, v.Version)
				}
			}
			if len(applied) == 0 {
				fmt.Fprintf(c.stdout, "%s: no migration is applied; nothing to undo\n", table)
				return nil
			}
			if len(applied) > 1 {
				to = applied[len(applied)-2]
			}
		}
		if to < 0 {
			return usagef("-to %d: a version is 0 or more", to)
		}
		for _, v := range before {
			if v.Applied && v.Version == 1 && to < 1 && !deleteKeys {
				return usagef("undoing migration 1 drops %s with every key and answer: add -delete-keys to do it", table)
			}
		}
		if err := durable.MigrateDownTo(ctx, pool, &c.cfg, to); err != nil {
			return err
		}
	}
	after, err := durable.MigrationStatus(ctx, pool, &c.cfg)
	if err != nil {
		return err
	}
	var changed []int64
	for i, v := range after {
		if i < len(before) && before[i].Version == v.Version && before[i].Applied != v.Applied {
			changed = append(changed, v.Version)
		}
	}
	if c.json {
		return c.printJSON(struct {
			Table   string          `json:"table"`
			Action  string          `json:"action"`
			Changed []int64         `json:"changed"`
			Status  []migrationJSON `json:"status"`
		}{table, sub, changed, migrationsJSON(after)})
	}
	verb := map[string]string{"up": "applied", "down": "undid"}[sub]
	switch {
	case len(changed) == 0 && sub == "down":
		fmt.Fprintf(c.stdout, "%s: no migration above version %d is applied; nothing to undo\n", table, to)
		return nil
	case len(changed) == 0:
		fmt.Fprintf(c.stdout, "%s: up to date; nothing to do\n", table)
		return nil
	}
	fmt.Fprintf(c.stdout, "%s: %s migration(s) %v\n", table, verb, changed)
	return nil
}

// table names the table as the flags give it, for messages.
func (c *cmd) table() string {
	if c.cfg.Schema == "" {
		return "idempotency_keys"
	}
	return c.cfg.Schema + ".idempotency_keys"
}

func (c *cmd) printMigrations(table string, vs []durable.MigrationVersion) error {
	if c.json {
		return c.printJSON(struct {
			Table  string          `json:"table"`
			Status []migrationJSON `json:"status"`
		}{table, migrationsJSON(vs)})
	}
	fmt.Fprintf(c.stdout, "%s\n", table)
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VERSION\tAPPLIED\tAPPLIED AT\tFILE")
	pending := 0
	for _, v := range vs {
		applied, name := "no", v.Name
		if v.Applied {
			applied = "yes"
		} else {
			pending++
		}
		if name == "" {
			name = "(not in this build: applied by a newer one)"
		}
		fmt.Fprintf(w, "%04d\t%s\t%s\t%s\n", v.Version, applied, stamp(v.AppliedAt), name)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if pending > 0 {
		fmt.Fprintf(c.stdout, "%d migration(s) to apply: run `idem migrate up`%s\n", pending, c.sameFlags())
	}
	return nil
}

// migrationJSON is a migration version in -json output.
type migrationJSON struct {
	Version   int64      `json:"version"`
	File      string     `json:"file,omitempty"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

func migrationsJSON(vs []durable.MigrationVersion) []migrationJSON {
	out := make([]migrationJSON, len(vs))
	for i, v := range vs {
		out[i] = migrationJSON{Version: v.Version, File: v.Name, Applied: v.Applied, AppliedAt: optTime(v.AppliedAt)}
	}
	return out
}
