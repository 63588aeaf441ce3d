package idem_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A program that imports the Guard and tests it over the in-memory store
// links no driver: the store's contract lives in package idem, and durable
// (pgx) and lock (go-redis) are imported only by whoever uses them. Neither
// does a client built on idemclient.
func TestContractLinksNoDriver(t *testing.T) {
	goTool, err := exec.LookPath("go") // go test puts its GOROOT/bin first in PATH
	require.NoError(t, err)
	for _, pkg := range []string{"github.com/idemguard/idem", "github.com/idemguard/idem/idemtest", "github.com/idemguard/idem/idemclient"} {
		out, err := exec.Command(goTool, "list", "-deps", pkg).CombinedOutput()
		require.NoError(t, err, "go list -deps %s: %s", pkg, out)
		for _, dep := range strings.Fields(string(out)) {
			for _, driver := range []string{"github.com/jackc/pgx", "github.com/redis/go-redis", "github.com/idemguard/idem/durable", "github.com/idemguard/idem/lock"} {
				require.False(t, strings.HasPrefix(dep, driver), "%s links %s", pkg, dep)
			}
		}
	}
}
