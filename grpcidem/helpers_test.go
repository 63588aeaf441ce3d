package grpcidem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/grpcidem"
)

// testPool returns a pool to the test database, closed at cleanup. An
// unreachable database skips the test, or fails it under CI=true.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL unreachable: %v", err)
		}
		t.Skipf("PostgreSQL unreachable (%v); start one on 127.0.0.1:5432 or set TEST_DATABASE_URL", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// testDB is a fresh, migrated schema of its own, dropped at cleanup.
type testDB struct {
	pool   *pgxpool.Pool
	schema string
	store  *durable.Store
}

func newTestDB(t *testing.T) testDB {
	t.Helper()
	return newTestDBWith(t, durable.Config{})
}

// newTestDBWith is newTestDB with a store configured as cfg (its Schema is
// the test's own).
func newTestDBWith(t *testing.T, c durable.Config) testDB {
	t.Helper()
	pool := testPool(t)
	var b [8]byte
	_, _ = rand.Read(b[:])
	cfg := &c
	cfg.Schema = "idemgrpc_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{cfg.Schema}.Sanitize()+" CASCADE")
		require.NoError(t, err)
	})
	require.NoError(t, durable.Migrate(t.Context(), pool, cfg))
	store, err := durable.New(pool, cfg)
	require.NoError(t, err)
	return testDB{pool: pool, schema: cfg.Schema, store: store}
}

// age moves every key back by d, as if it had been claimed d ago: its claim,
// its owner's deadline, and its answer or release (from which it expires).
func (db testDB) age(t *testing.T, d time.Duration) {
	t.Helper()
	_, err := db.pool.Exec(t.Context(), "UPDATE "+pgx.Identifier{db.schema, "idempotency_keys"}.Sanitize()+
		" SET created_at = created_at - make_interval(secs => $1), hold_until = hold_until - make_interval(secs => $1),"+
		" completed_at = completed_at - make_interval(secs => $1), released_at = released_at - make_interval(secs => $1)", d.Seconds())
	require.NoError(t, err)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newGuard returns a Guard over db's store; cfg may be nil.
func newGuard(t *testing.T, db testDB, cfg *idem.Config) *idem.Guard {
	t.Helper()
	var c idem.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Logger == nil {
		c.Logger = quiet
	}
	g, err := idem.New(db.store, &c)
	require.NoError(t, err)
	return g
}

// The test service, written by hand so that no code generation is needed:
// /idemtest.Payments/Charge takes and returns a structpb.Struct (maps make
// the deterministic encoding matter), /idemtest.Payments/Balance a
// wrapperspb.StringValue.
const (
	methodCharge  = "/idemtest.Payments/Charge"
	methodBalance = "/idemtest.Payments/Balance"
)

// handleFunc is what the test server does for every call.
type handleFunc func(ctx context.Context, method string, req proto.Message) (proto.Message, error)

type payments interface{ handle() handleFunc }

type paymentsServer struct{ h handleFunc }

func (s *paymentsServer) handle() handleFunc { return s.h }

func unary[Req any, PReq interface {
	*Req
	proto.Message
}](method string) grpc.MethodDesc {
	name := method[len("/idemtest.Payments/"):]
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := PReq(new(Req))
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				out, err := srv.(payments).handle()(ctx, method, req.(proto.Message))
				if err != nil {
					return nil, err
				}
				return out, nil
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, h)
		},
	}
}

var paymentsDesc = grpc.ServiceDesc{
	ServiceName: "idemtest.Payments",
	HandlerType: (*payments)(nil),
	Methods: []grpc.MethodDesc{
		unary[structpb.Struct](methodCharge),
		unary[wrapperspb.StringValue](methodBalance),
	},
}

// serve starts a server with the interceptor over bufconn and returns a
// client connection to it; both end at cleanup.
func serve(t *testing.T, ic grpc.UnaryServerInterceptor, h handleFunc) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic))
	srv.RegisterService(&paymentsDesc, &paymentsServer{h: h})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// scopeFromMetadata is the tests' authentication: the "x-user" entry.
func scopeFromMetadata(ctx context.Context) (string, bool) {
	v := metadata.ValueFromIncomingContext(ctx, "x-user")
	if len(v) != 1 {
		return "", false
	}
	return v[0], true
}

// result is what a client got from one call.
type result struct {
	resp     *structpb.Struct
	err      error
	replayed bool
}

// charge calls Charge as user with key (none when empty) and req.
func charge(t *testing.T, conn *grpc.ClientConn, user, key string, req *structpb.Struct) result {
	t.Helper()
	md := metadata.MD{}
	if user != "" {
		md.Set("x-user", user)
	}
	if key != "" {
		md.Set(grpcidem.MetadataKey, key)
	}
	return callWith(t.Context(), conn, md, req)
}

func callWith(ctx context.Context, conn *grpc.ClientConn, md metadata.MD, req *structpb.Struct) result {
	ctx = metadata.NewOutgoingContext(ctx, md)
	var hdr metadata.MD
	out := new(structpb.Struct)
	err := conn.Invoke(ctx, methodCharge, req, out, grpc.Header(&hdr))
	r := result{err: err, replayed: len(hdr.Get(grpcidem.MetadataReplayed)) == 1 && hdr.Get(grpcidem.MetadataReplayed)[0] == "true"}
	if err == nil {
		r.resp = out
	}
	return r
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	require.NoError(t, err)
	return s
}

func newKey() string { return rand.Text() }
