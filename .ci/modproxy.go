//go:build ignore

// Modproxy lays out modules of this repository, each at a commit, as a
// file-based Go module proxy (GOPROXY=file://DIR): for every module
// DIR/<module>/@v/list and <version>.info, .mod and .zip, the zip holding
// <module>@<version>/... as the go command builds it from a VCS checkout:
// the module's directory at the commit, less nested modules (directories
// with a go.mod of their own), plus the repository's LICENSE when the
// module has none. It prints "<module> <version>" per module.
//
// The version is the one the go command gives the commit: the tag vX.Y.Z
// on it, or the pseudo-version of its commit time (UTC) and 12-hex hash
// after the latest vX.Y.Z tag reachable from it (v0.0.0-... with none).
//
// Usage (from the repository root):
//
//	go run .ci/modproxy.go -dir DIR MODULE=SUBDIR@REV ...
//	go run .ci/modproxy.go -dir DIR github.com/idemguard/idem=.@HEAD github.com/idemguard/idem/grpcidem=grpcidem@HEAD
//
// Without -dir it only prints the versions. .ci/pin and .ci/consumer use it.
package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

func main() {
	dir := flag.String("dir", "", "the proxy's directory (created); empty: print the versions only")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: go run .ci/modproxy.go [-dir DIR] MODULE=SUBDIR@REV ...")
		os.Exit(2)
	}
	for _, arg := range flag.Args() {
		mod, rest, ok1 := strings.Cut(arg, "=")
		sub, rev, ok2 := strings.Cut(rest, "@")
		if !ok1 || !ok2 || mod == "" || rev == "" {
			fail(fmt.Errorf("%q: want MODULE=SUBDIR@REV", arg))
		}
		sub = strings.Trim(path.Clean(sub), "/")
		if sub == "." {
			sub = ""
		}
		v, when, err := version(rev)
		if err != nil {
			fail(fmt.Errorf("%s: %w", arg, err))
		}
		if *dir != "" {
			if err := publish(*dir, mod, sub, rev, v, when); err != nil {
				fail(fmt.Errorf("%s: %w", arg, err))
			}
		}
		fmt.Println(mod, v)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "modproxy:", err)
	os.Exit(1)
}

func git(args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("git", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

var semverTag = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// version returns the go command's version of commit rev and its commit
// time.
func version(rev string) (string, time.Time, error) {
	out, err := git("show", "-s", "--format=%H %ct", rev+"^{commit}")
	if err != nil {
		return "", time.Time{}, err
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return "", time.Time{}, fmt.Errorf("unexpected git show output %q", out)
	}
	secs, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", time.Time{}, err
	}
	hash, when := f[0], time.Unix(secs, 0).UTC()
	tags, err := git("tag", "--merged", hash, "--list", "v*")
	if err != nil {
		return "", time.Time{}, err
	}
	var best []int
	bestTag := ""
	for _, t := range strings.Fields(string(tags)) {
		m := semverTag.FindStringSubmatch(t)
		if m == nil {
			continue
		}
		n := []int{atoi(m[1]), atoi(m[2]), atoi(m[3])}
		if best == nil || slices.Compare(n, best) > 0 {
			best, bestTag = n, t
		}
	}
	stamp := when.Format("20060102150405") + "-" + hash[:12]
	if best == nil {
		return "v0.0.0-" + stamp, when, nil
	}
	if on, err := git("rev-parse", bestTag+"^{commit}"); err == nil && strings.TrimSpace(string(on)) == hash {
		return bestTag, when, nil
	}
	return fmt.Sprintf("v%d.%d.%d-0.%s", best[0], best[1], best[2]+1, stamp), when, nil
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// publish writes module mod at version v, from directory sub of rev, into
// the proxy at dir.
func publish(dir, mod, sub, rev, v string, when time.Time) error {
	files, err := moduleFiles(rev, sub)
	if err != nil {
		return err
	}
	gomod, ok := files["go.mod"]
	if !ok {
		return fmt.Errorf("no go.mod in %q at %s", sub, rev)
	}
	if got := modulePath(gomod); got != mod {
		return fmt.Errorf("go.mod in %q at %s declares module %q", sub, rev, got)
	}
	esc, err := escape(mod)
	if err != nil {
		return err
	}
	vdir := filepath.Join(dir, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	var zbuf bytes.Buffer
	zw := zip.NewWriter(&zbuf)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: mod + "@" + v + "/" + name, Method: zip.Deflate, Modified: when})
		if err != nil {
			return err
		}
		if _, err := w.Write(files[name]); err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{v, when})
	if err != nil {
		return err
	}
	for ext, b := range map[string][]byte{".info": info, ".mod": gomod, ".zip": zbuf.Bytes()} {
		if err := os.WriteFile(filepath.Join(vdir, v+ext), b, 0o644); err != nil {
			return err
		}
	}
	list := filepath.Join(vdir, "list")
	old, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(old))
	if !slices.Contains(versions, v) {
		versions = append(versions, v)
	}
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// moduleFiles returns the files of the module in directory sub of rev, by
// path relative to it: the regular files of its tree less those under a
// nested directory holding a go.mod, and the repository's LICENSE when sub
// is not the root and has none.
func moduleFiles(rev, sub string) (map[string][]byte, error) {
	tree := rev
	if sub != "" {
		tree = rev + ":" + sub
	}
	out, err := git("archive", "--format=tar", tree)
	if err != nil {
		return nil, err
	}
	all := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue // directories; the go command skips symbolic links too
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		all[h.Name] = b
	}
	var nested []string
	for name := range all {
		if d := path.Dir(name); path.Base(name) == "go.mod" && d != "." {
			nested = append(nested, d+"/")
		}
	}
	files := map[string][]byte{}
	for name, b := range all {
		if slices.ContainsFunc(nested, func(d string) bool { return strings.HasPrefix(name, d) }) {
			continue
		}
		if slices.Contains(strings.Split(name, "/"), "vendor") {
			return nil, fmt.Errorf("%s: vendor directories are not handled", name)
		}
		files[name] = b
	}
	if _, ok := files["LICENSE"]; !ok && sub != "" {
		if lic, err := git("show", rev+":LICENSE"); err == nil {
			files["LICENSE"] = lic
		}
	}
	return files, nil
}

var moduleLine = regexp.MustCompile(`(?m)^module\s+"?([^"\s]+)"?\s*$`)

func modulePath(gomod []byte) string {
	if m := moduleLine.FindSubmatch(gomod); m != nil {
		return string(m[1])
	}
	return ""
}

// escape is the proxy protocol's case encoding of a module path: each
// upper-case letter as '!' and its lower case.
func escape(mod string) (string, error) {
	var b strings.Builder
	for _, r := range mod {
		switch {
		case r == '!' || r > unicode.MaxASCII:
			return "", fmt.Errorf("module path %q: not handled", mod)
		case unicode.IsUpper(r):
			b.WriteByte('!')
			b.WriteRune(unicode.ToLower(r))
		default:
			b.WriteRune(r)
		}
	}
	return b.String(), nil
}
