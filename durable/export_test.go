package durable

// For the tests of package durable_test.
var (
	ErrStatementCache = errStatementCache
	Translate         = translate
)
