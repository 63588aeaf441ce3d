package idem

// SetMaxWaiters changes how many requests may wait at once on g (1024), for
// a test of the bound.
func SetMaxWaiters(g *Guard, n int64) { g.maxWaiters = n }
