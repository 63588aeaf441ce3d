package durable

import "time"

// For the tests of package durable_test.
var (
	ErrStatementCache = errStatementCache
	Translate         = translate
)

// SchemaClock moves the clock on which s counts when to read its table's
// schema version again.
func SchemaClock(s *Store, now func() time.Time) { s.schema.now = now }
