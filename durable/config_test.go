package durable_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/durable"
)

// nopDB is a DB that must never be used: validation happens before any
// statement.
type nopDB struct{}

func (nopDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	panic("nopDB used")
}
func (nopDB) Query(context.Context, string, ...any) (pgx.Rows, error) { panic("nopDB used") }
func (nopDB) QueryRow(context.Context, string, ...any) pgx.Row        { panic("nopDB used") }
func (nopDB) Begin(context.Context) (pgx.Tx, error)                   { panic("nopDB used") }

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  *durable.Config
		err  string // substring of the error; "" for valid
	}{
		{name: "nil", cfg: nil},
		{name: "zero", cfg: &durable.Config{}},
		{name: "all set", cfg: &durable.Config{Schema: "idem", Retention: time.Hour, Notify: true, AdmissionWait: time.Second, Partitions: 4}},
		{name: "schema upper case", cfg: &durable.Config{Schema: "Idem"}, err: "durable: Config.Schema:"},
		{name: "schema quote", cfg: &durable.Config{Schema: `a"b`}, err: "durable: Config.Schema:"},
		{name: "schema too long", cfg: &durable.Config{Schema: strings.Repeat("s", 64)}, err: "durable: Config.Schema:"},
		{name: "negative retention", cfg: &durable.Config{Retention: -time.Hour}, err: "durable: Config.Retention:"},
		{name: "sub-microsecond retention", cfg: &durable.Config{Retention: time.Nanosecond}, err: "durable: Config.Retention:"},
		{name: "negative partitions", cfg: &durable.Config{Partitions: -1}, err: "durable: Config.Partitions:"},
		{name: "too many partitions", cfg: &durable.Config{Partitions: 1025}, err: "durable: Config.Partitions: must be at most 1024, got 1025"},
		{name: "negative admission wait", cfg: &durable.Config{AdmissionWait: -time.Second}, err: "durable: Config.AdmissionWait:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, err := durable.New(nopDB{}, tt.cfg)
			migrateErr := durable.Migrate(t.Context(), errOnlyBeginner{}, tt.cfg)
			if tt.err == "" {
				require.NoError(t, err)
				require.NotNil(t, store)
				require.ErrorIs(t, migrateErr, errBegin) // got as far as the database
				return
			}
			require.ErrorContains(t, err, tt.err)
			require.Nil(t, store)
			require.ErrorContains(t, migrateErr, tt.err)
		})
	}
}

func TestNewDefaults(t *testing.T) {
	t.Parallel()
	store, err := durable.New(nopDB{}, nil)
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, store.Retention())
	require.Equal(t, `"idempotency_keys"`, store.Table())

	store, err = durable.New(nopDB{}, &durable.Config{Schema: "idem", Retention: time.Minute})
	require.NoError(t, err)
	require.Equal(t, time.Minute, store.Retention())
	require.Equal(t, `"idem"."idempotency_keys"`, store.Table())

	_, err = durable.New(nil, nil)
	require.Error(t, err)
}

var errBegin = errors.New("begin refused")

// errOnlyBeginner refuses to begin a transaction.
type errOnlyBeginner struct{ nopDB }

func (errOnlyBeginner) Begin(context.Context) (pgx.Tx, error) { return nil, errBegin }

func TestConfigValidateExported(t *testing.T) {
	var nilCfg *durable.Config
	require.NoError(t, nilCfg.Validate())
	require.NoError(t, (&durable.Config{Schema: "shop"}).Validate())
	require.ErrorContains(t, (&durable.Config{Schema: "Bad-Schema"}).Validate(), "Config.Schema")
	require.ErrorContains(t, (&durable.Config{Retention: -time.Hour}).Validate(), "Config.Retention")
}
