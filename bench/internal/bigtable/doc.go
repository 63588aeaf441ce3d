// Package bigtable benches the durable store on a big table: the claim of a
// new key, the replay of an answered one (Claim and Get), the Complete of a
// fresh claim and the Sweeper, at several sizes of live rows (1M, 10M, 30M).
//
// The table is created with durable.Migrate in a schema of its own
// (idem_bigtable_<hex>), so it always has the current migrations' schema; its
// indexes, their sizes and the table's fillfactor are read from the catalog,
// never assumed. Rows are loaded with INSERT ... SELECT FROM generate_series
// in chunks, not through the store: user_id 'user-<n % 1e6>', a uuid-like key
// derived from n, a 32-byte request_hash, a 16-byte owner_token, 1% of rows
// in progress and the rest answered with 201, a Location header and a body of
// about 300 bytes, created_at spread uniformly over the retention (minus a
// headroom so that no live row expires during the run), plus a share of rows
// just past the retention for the sweeper. Sizes are loaded in ascending
// order, each on top of the previous one.
//
// Every operation measured goes through the real *durable.Store and
// *durable.Sweeper. At the largest size it also runs a phase of mixed load
// with the sweeper running concurrently, and, when asked, the same phase with
// the server's autovacuum turned on (ALTER SYSTEM, restored on exit).
//
// Run it from the repository root:
//
//	go run ./bench bigtable -rows 1000000,10000000 -out bench/reference/bigtable
package bigtable
