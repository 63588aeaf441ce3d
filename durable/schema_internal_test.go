package durable

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/migrations"
)

// TestSchemaVersionIsTheLastMigration: the version a build serves is the
// number of its last migration, and that migration records it in the view
// the Store reads.
func TestSchemaVersionIsTheLastMigration(t *testing.T) {
	files, err := loadMigrations(migrations.FS)
	require.NoError(t, err)
	last := files[len(files)-1]
	require.EqualValues(t, schemaVersion, last.version)
	require.Contains(t, last.up, "CREATE OR REPLACE VIEW idempotency_keys_schema AS SELECT "+strconv.Itoa(schemaVersion)+" AS version;")
	require.True(t, strings.Contains(last.down, "DROP VIEW IF EXISTS idempotency_keys_schema;") || last.version > 1,
		"the first migration's down file drops the view")
}
