package target

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// TestMinimalHandler checks that the minimal SQL behind HTTP answers what
// the guard's middleware answers (the handler's answer once, the same bytes
// replayed, 422 for the key with another body), and pins its round trips,
// which docs/strategies.md gives: the claim returns nothing for a taken key,
// so a replay or a refusal reads the row in a second statement.
func TestMinimalHandler(t *testing.T) {
	env := open(t)
	for _, strategy := range []string{Table, Hybrid} {
		t.Run(strategy, func(t *testing.T) {
			var runs int
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs++
				Handler(0).ServeHTTP(w, r)
			})
			h, err := MinimalHandler(env, strategy, func(r *http.Request) string { return r.Header.Get("X-User") }, next)
			require.NoError(t, err)
			srv := httptest.NewServer(h)
			defer srv.Close()
			type trips struct{ pg, redis int64 }
			var got []trips
			post := func(body string) (*http.Response, string) {
				pg0, redis0 := env.PGStatements.Count(), env.RedisCmds.Count()
				defer func() { got = append(got, trips{env.PGStatements.Count() - pg0, env.RedisCmds.Count() - redis0}) }()
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
				require.NoError(t, err)
				req.Header.Set(idem.HeaderKey, "k-"+strategy)
				req.Header.Set("X-User", "user-1")
				resp, err := srv.Client().Do(req)
				require.NoError(t, err)
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				resp.Body.Close()
				return resp, string(b)
			}
			first, firstBody := post(`{"a":1}`)
			require.Equal(t, http.StatusCreated, first.StatusCode)
			require.Empty(t, first.Header.Get(idem.HeaderReplayed))
			again, againBody := post(`{"a":1}`)
			require.Equal(t, http.StatusCreated, again.StatusCode)
			require.Equal(t, "true", again.Header.Get(idem.HeaderReplayed))
			require.Equal(t, firstBody, againBody)
			require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
			reused, _ := post(`{"a":2}`)
			require.Equal(t, http.StatusUnprocessableEntity, reused.StatusCode)
			require.Equal(t, 1, runs)
			if strategy == Table {
				require.Equal(t, []trips{{2, 0}, {2, 0}, {2, 0}}, got, "insert and update; insert (nothing) and read, twice")
			} else {
				require.Equal(t, []trips{{2, 1}, {1, 1}, {1, 1}}, got, "SET NX, insert and update; SET NX (refused) and read, twice")
			}
		})
	}
	_, err := MinimalHandler(env, "nope", nil, nil)
	require.Error(t, err)
}
