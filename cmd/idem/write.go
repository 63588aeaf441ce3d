package main

import (
	"context"
	"encoding/base32"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// tokenEncoding is idem.Token.String's: lowercase base32 without padding.
var tokenEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// parseToken reads an owner token as idem.Token.String prints it (inspect's
// and pending's owner).
func parseToken(s string) (idem.Token, error) {
	var t idem.Token
	b, err := tokenEncoding.DecodeString(strings.ToUpper(s))
	if err != nil || len(b) != len(t) {
		return t, fmt.Errorf("-owner %q is not a token as inspect prints it (26 base32 characters)", s)
	}
	copy(t[:], b)
	if t == (idem.Token{}) {
		return t, fmt.Errorf("-owner %q is the zero token, which no attempt has", s)
	}
	return t, nil
}

// writeFlags are the flags of settle and release.
type writeFlags struct {
	owner string
	by    string
}

func (c *cmd) writeFlags(name string) (*flag.FlagSet, *writeFlags) {
	fs := c.flags(name)
	w := &writeFlags{}
	fs.StringVar(&w.owner, "owner", "", "the owner token of the attempt to act on, as inspect prints it (required)")
	fs.StringVar(&w.by, "by", os.Getenv("USER"), "who acts, for the audit line (default $USER)")
	fs.BoolVar(&c.cfg.Notify, "notify", false, "announce the key as the fleet's stores do with durable.Config.Notify, waking retries that wait for it")
	return fs, w
}

// settle runs "settle <scope> <key> -owner T -status N ...".
func (c *cmd) settle(ctx context.Context, args []string) error {
	fs, wf := c.writeFlags("settle")
	status := fs.Int("status", 0, "the answer's HTTP status, 100-499 but 429 (required)")
	var headers headerFlag
	fs.Var(&headers, "header", "an answer header, name:value (repeatable)")
	bodyFile := fs.String("body", "", "the answer's body from a file: @path (@- reads stdin)")
	bodyText := fs.String("body-text", "", "the answer's body as given")
	pos, err := c.parse(fs, args, 2, "<scope> <key>")
	if err != nil {
		return err
	}
	owner, err := c.checkWrite(wf)
	if err != nil {
		return err
	}
	if *status == 0 {
		return usagef("settle needs -status")
	}
	var body []byte
	switch {
	case *bodyFile != "" && *bodyText != "":
		return usagef("give -body @file or -body-text, not both")
	case *bodyFile != "":
		path, ok := strings.CutPrefix(*bodyFile, "@")
		if !ok {
			return usagef("-body %q: give a file as @path, or the text with -body-text", *bodyFile)
		}
		if path == "-" {
			body, err = io.ReadAll(os.Stdin)
		} else {
			body, err = os.ReadFile(path)
		}
		if err != nil {
			return fmt.Errorf("-body: %w", err)
		}
	default:
		body = []byte(*bodyText)
	}
	resp := idem.Response{Status: *status, Header: headers.h, Body: body}
	return c.act(ctx, "settle", pos[0], pos[1], owner, wf.by, func(g *idem.Guard) error {
		return g.Settle(ctx, pos[0], pos[1], owner, resp)
	}, slog.Int("status", *status), slog.Int("body_size", len(body)))
}

// release runs "release <scope> <key> -owner T".
func (c *cmd) release(ctx context.Context, args []string) error {
	fs, wf := c.writeFlags("release")
	pos, err := c.parse(fs, args, 2, "<scope> <key>")
	if err != nil {
		return err
	}
	owner, err := c.checkWrite(wf)
	if err != nil {
		return err
	}
	return c.act(ctx, "release", pos[0], pos[1], owner, wf.by, func(g *idem.Guard) error {
		return g.Release(ctx, pos[0], pos[1], owner)
	})
}

func (c *cmd) checkWrite(wf *writeFlags) (idem.Token, error) {
	if wf.owner == "" {
		return idem.Token{}, usagef("-owner is required: the owner token inspect or pending prints")
	}
	owner, err := parseToken(wf.owner)
	if err != nil {
		return idem.Token{}, usageError{err.Error()}
	}
	if strings.TrimSpace(wf.by) == "" {
		return idem.Token{}, usagef("-by is required when $USER is unset: the audit line names who acted")
	}
	return owner, nil
}

// errRefused is a write the command refused before running it.
var errRefused = errors.New("refused")

// act settles or releases a key through a Guard over the table's Store, so
// through the owner-checked statement of the Guard and the reconciler, after
// refusing a key that is not in progress or whose execution may still run.
// It writes one audit line to stderr, whatever the result.
func (c *cmd) act(ctx context.Context, action, scope, key string, owner idem.Token, by string,
	write func(g *idem.Guard) error, attrs ...slog.Attr) error {
	audit := slog.New(slog.NewTextHandler(c.stderr, nil))
	attrs = append([]slog.Attr{
		slog.String("by", by), slog.String("action", action),
		slog.String("key_hash", idem.KeyHash(scope, key)), slog.String("owner", owner.String()),
	}, attrs...)
	log := func(result string, err error) {
		a := append(slices.Clip(attrs), slog.String("result", result))
		level := slog.LevelInfo
		if err != nil {
			level = slog.LevelWarn
			a = append(a, slog.String("error", err.Error()))
		}
		audit.LogAttrs(ctx, level, "idem: operator "+action, a...)
	}

	st, pool, err := c.store(ctx)
	if err != nil {
		log("failed", err)
		return err
	}
	defer pool.Close()
	attrs = append(attrs, slog.String("table", c.table()))

	row, err := st.Inspect(ctx, scope, key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		err = fmt.Errorf("%s: %w: no row for key_hash %s in %s", action, errRefused, idem.KeyHash(scope, key), c.table())
	case err != nil:
		log("failed", err)
		return err
	case row.State != durable.StateInProgress:
		err = fmt.Errorf("%s: %w: the key is %s, not in progress: nothing to %s", action, errRefused, row.State, action)
	case row.Held():
		err = fmt.Errorf("%s: %w: the key is still held by its execution for %s (until %s): only its owner may end it before then",
			action, errRefused, human(row.HoldLeft), stamp(row.HoldUntil))
	}
	if err != nil {
		log("refused", err)
		return err
	}

	// The Guard's own logger is silent: the audit line says it all.
	g, err := idem.New(st, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log("failed", err)
		return err
	}
	if err := write(g); err != nil {
		result := "failed"
		if errors.Is(err, idem.ErrNotOwner) || errors.Is(err, idem.ErrNotFound) || errors.Is(err, idem.ErrCompleted) {
			result = "refused"
		}
		log(result, err)
		if errors.Is(err, idem.ErrNotOwner) {
			return fmt.Errorf("%w (the key's attempt has another owner: inspect it again)", err)
		}
		return err
	}
	log("ok", nil)
	verb := map[string]string{"settle": "settled", "release": "released"}[action]
	if c.json {
		return c.printJSON(struct {
			Result  string `json:"result"`
			KeyHash string `json:"key_hash"`
			Owner   string `json:"owner"`
			Attempt int    `json:"attempt"`
		}{verb, idem.KeyHash(scope, key), owner.String(), row.Attempt})
	}
	fmt.Fprintf(c.stdout, "%s key_hash %s (owner %s, attempt %d)\n", verb, idem.KeyHash(scope, key), owner, row.Attempt)
	return nil
}
