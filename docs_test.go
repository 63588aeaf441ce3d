package idem_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docPages are the Markdown pages whose Go snippets must compile: each
// ```go block is the literal source of a function in a test file of this
// repository (a runnable example, or a function one calls), so `go test`
// compiles and runs every line a reader copies.
var docPages = []string{"README.md", "docs/*.md", "examples/checkout/README.md"}

// exampleMarker names the function a snippet is taken from. It must be the
// line right before the ```go fence:
//
//	<!-- example: example_docs_test.go#ExampleGuard_Middleware_quickStart -->
//
// The path is relative to the repository root and names a _test.go file.
var exampleMarker = regexp.MustCompile(`^<!--\s*example:\s*(\S+?\.go)#([A-Za-z_][A-Za-z0-9_]*)\s*-->$`)

// TestDocsSnippetsAreExamples fails when a Go snippet of the docs is not,
// line for line, part of the function its marker names. Lines are compared
// exactly once the snippet's and the source's common indentation is removed,
// and the snippet must be one contiguous run of the function's lines: edit the
// example first, then copy it into the page.
func TestDocsSnippetsAreExamples(t *testing.T) {
	var pages []string
	for _, pattern := range docPages {
		m, err := filepath.Glob(pattern)
		require.NoError(t, err)
		pages = append(pages, m...)
	}
	require.NotEmpty(t, pages, "no documentation pages found: run from the repository root")
	checked := 0
	for _, page := range pages {
		snippets, orphans := goSnippets(t, page)
		for _, line := range orphans {
			t.Errorf("%s:%d: example marker not followed by a ```go block", page, line)
		}
		for _, s := range snippets {
			checked++
			t.Run(fmt.Sprintf("%s:%d", page, s.line), func(t *testing.T) {
				require.NotEmpty(t, s.file, "```go block without a marker on the line before it, e.g. <!-- example: example_docs_test.go#ExampleFoo -->")
				require.NotEmpty(t, strings.TrimSpace(strings.Join(s.code, "")), "empty ```go block")
				body, err := functionSource(s.file, s.fn)
				require.NoError(t, err)
				i, ok := findBlock(body, s.code)
				require.True(t, ok, "the snippet is not the source of %s#%s (first line not matched: %q); copy it from the example",
					s.file, s.fn, s.code[i])
			})
		}
	}
	require.NotZero(t, checked, "no ```go blocks found in the documentation")
}

// snippet is one ```go block of a page.
type snippet struct {
	line     int      // of the opening fence, 1-based
	file, fn string   // from the marker; empty without one
	code     []string // the block's lines
}

// goSnippets returns the ```go blocks of page with their markers, and the
// lines of markers that are not followed by a ```go block.
func goSnippets(t *testing.T, page string) (out []snippet, orphans []int) {
	t.Helper()
	src, err := os.ReadFile(page)
	require.NoError(t, err)
	lines := strings.Split(string(src), "\n")
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimSpace(lines[i])
		if exampleMarker.MatchString(trimmed) {
			if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "```go" {
				orphans = append(orphans, i+1)
			}
			continue
		}
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		// A fence: skip to its end, keeping the block if it is Go.
		open := i
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
		}
		require.Less(t, i, len(lines), "%s:%d: unterminated code block", page, open+1)
		if trimmed != "```go" {
			continue
		}
		s := snippet{line: open + 1, code: lines[open+1 : i]}
		if open > 0 {
			if m := exampleMarker.FindStringSubmatch(strings.TrimSpace(lines[open-1])); m != nil {
				s.file, s.fn = m[1], m[2]
			}
		}
		out = append(out, s)
	}
	return out, orphans
}

// functionSource returns the lines of the body of the top-level function fn
// in the test file path. A function that is not an Example or a Test must be
// called from another function of the same file, so that it runs.
func functionSource(path, fn string) ([]string, error) {
	if !strings.HasSuffix(path, "_test.go") || filepath.IsAbs(path) || strings.Contains(path, "..") {
		return nil, fmt.Errorf("marker names %q: want a _test.go file, relative to the repository root", path)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	var decl *ast.FuncDecl
	for _, d := range file.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == fn && fd.Body != nil {
			decl = fd
		}
	}
	if decl == nil {
		return nil, fmt.Errorf("no function %s in %s", fn, path)
	}
	if !strings.HasPrefix(fn, "Example") && !strings.HasPrefix(fn, "Test") && !calledInFile(file, decl) {
		return nil, fmt.Errorf("%s#%s is neither an Example or Test nor called from one in its file: it would compile but never run", path, fn)
	}
	lo := fset.Position(decl.Body.Lbrace).Offset + 1
	hi := fset.Position(decl.Body.Rbrace).Offset
	return strings.Split(string(src[lo:hi]), "\n"), nil
}

// calledInFile reports whether decl's name is used in another declaration of
// file.
func calledInFile(file *ast.File, decl *ast.FuncDecl) bool {
	used := false
	for _, d := range file.Decls {
		if d == decl {
			continue
		}
		ast.Inspect(d, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && id.Name == decl.Name.Name {
				used = true
			}
			return !used
		})
	}
	return used
}

// findBlock reports whether snippet, once dedented, equals a contiguous run
// of body's lines, once dedented. When it does not, it returns the index of
// the first snippet line that the best candidate run did not match.
func findBlock(body, snippet []string) (int, bool) {
	want := dedent(snippet)
	best := 0
	for start := 0; start+len(want) <= len(body); start++ {
		got := dedent(body[start : start+len(want)])
		i := 0
		for i < len(want) && got[i] == want[i] {
			i++
		}
		if i == len(want) {
			return 0, true
		}
		best = max(best, i)
	}
	return min(best, len(want)-1), false
}

// dedent removes the indentation common to the non-blank lines and trailing
// white space.
func dedent(lines []string) []string {
	prefix := ""
	first := true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		ind := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first {
			prefix, first = ind, false
			continue
		}
		for !strings.HasPrefix(ind, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.TrimRight(strings.TrimPrefix(l, prefix), " \t")
	}
	return out
}

// docPackages are the packages whose names the docs mention as pkg.Name,
// and their directories.
var docPackages = map[string]string{
	"idem": ".", "durable": "durable", "reconcile": "reconcile", "lock": "lock",
	"idemtest": "idemtest", "grpcidem": "grpcidem", "migrations": "migrations",
	"pgidem": "pgidem", "pgtest": "idemtest/pgtest", "idemclient": "idemclient",
}

// docName matches pkg.Name and pkg.Name.Member in prose and code.
var docName = regexp.MustCompile(`\b(idem|durable|reconcile|lock|idemtest|grpcidem|migrations|pgidem|pgtest|idemclient)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

// TestDocsNamesExist fails when README.md, a page of docs/ or a README
// mentions a pkg.Name (idem.Guard, durable.Store.Claim, idem.Config.Lock)
// that the package does not declare: an exported top-level name, or a method,
// field or interface method of an exported type.
func TestDocsNamesExist(t *testing.T) {
	members := declaredNames(t)
	var pages []string
	for _, pattern := range []string{"README.md", "docs/*.md", "*/README.md", "examples/*/README.md"} {
		m, err := filepath.Glob(pattern)
		require.NoError(t, err)
		pages = append(pages, m...)
	}
	require.NotEmpty(t, pages)
	checked := 0
	for _, page := range pages {
		src, err := os.ReadFile(page)
		require.NoError(t, err)
		for i, line := range strings.Split(string(src), "\n") {
			checked += checkNames(t, members, fmt.Sprintf("%s:%d", page, i+1), line)
		}
	}
	t.Logf("%d names checked", checked)
	require.Greater(t, checked, 100, "the docs name the API as pkg.Name")
}

// TestCommentNamesExist is TestDocsNamesExist for the comments of the
// non-test Go files of every module of the repository and for the SQL of
// migrations/ (its comments, and the COMMENT ON text it writes into the
// database's catalog): a doc comment or a column comment must not name what
// no longer exists.
func TestCommentNamesExist(t *testing.T) {
	members := declaredNames(t)
	checked := 0
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, group := range f.Comments {
			for _, c := range group.List {
				line := fset.Position(c.Slash).Line
				for i, text := range strings.Split(c.Text, "\n") {
					checked += checkNames(t, members, fmt.Sprintf("%s:%d", path, line+i), text)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	sqls, err := filepath.Glob("migrations/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, sqls)
	for _, path := range sqls {
		src, err := os.ReadFile(path)
		require.NoError(t, err)
		for i, line := range strings.Split(string(src), "\n") {
			checked += checkNames(t, members, fmt.Sprintf("%s:%d", path, i+1), line)
		}
	}
	t.Logf("%d names checked", checked)
	require.Greater(t, checked, 100, "the comments name the API as pkg.Name")
}

// declaredNames returns, for every pkg.Name that docPackages declare, the
// names of its members; the key exists for every name.
func declaredNames(t *testing.T) map[string]map[string]bool {
	t.Helper()
	members := map[string]map[string]bool{}
	for pkg, dir := range docPackages {
		for name, ms := range exportedNames(t, dir) {
			members[pkg+"."+name] = ms
		}
	}
	return members
}

// checkNames reports, at where, every pkg.Name and pkg.Name.Member of text
// that is not declared, and returns how many names it checked.
func checkNames(t *testing.T, members map[string]map[string]bool, where, text string) int {
	t.Helper()
	found := docName.FindAllStringSubmatch(text, -1)
	for _, m := range found {
		ms, ok := members[m[1]+"."+m[2]]
		if !ok {
			t.Errorf("%s: %s.%s is not declared by package %s", where, m[1], m[2], m[1])
			continue
		}
		if m[3] != "" && !ms[m[3]] {
			t.Errorf("%s: %s has no method or field %s", where, m[0], m[3])
		}
	}
	return len(found)
}

// exportedNames returns the exported top-level names declared by the
// non-test files of dir, each with the exported methods, fields and
// interface methods of the type it names.
func exportedNames(t *testing.T, dir string) map[string]map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	names := map[string]map[string]bool{}
	add := func(name string) map[string]bool {
		if names[name] == nil {
			names[name] = map[string]bool{}
		}
		return names[name]
	}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					add(d.Name.Name)
					continue
				}
				recv := d.Recv.List[0].Type
				for {
					switch x := recv.(type) {
					case *ast.StarExpr:
						recv = x.X
						continue
					case *ast.IndexExpr:
						recv = x.X
						continue
					}
					break
				}
				if id, ok := recv.(*ast.Ident); ok {
					add(id.Name)[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(n.Name)
						}
					case *ast.TypeSpec:
						ms := add(s.Name.Name)
						var fields *ast.FieldList
						switch x := s.Type.(type) {
						case *ast.StructType:
							fields = x.Fields
						case *ast.InterfaceType:
							fields = x.Methods
						}
						if fields == nil {
							continue
						}
						for _, fld := range fields.List {
							for _, n := range fld.Names {
								ms[n.Name] = true
							}
							if len(fld.Names) == 0 { // embedded: its name
								typ := fld.Type
								if st, ok := typ.(*ast.StarExpr); ok {
									typ = st.X
								}
								switch e := typ.(type) {
								case *ast.Ident:
									ms[e.Name] = true
								case *ast.SelectorExpr:
									ms[e.Sel.Name] = true
								}
							}
						}
					}
				}
			}
		}
	}
	return names
}
