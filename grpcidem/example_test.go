package grpcidem_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/grpcidem"
	"github.com/idemguard/idem/lock"
)

func databaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// checkout is a service written by hand so that the example needs no code
// generation: /shop.Checkout/Pay takes an order id and answers with a
// receipt. With protoc-gen-go-grpc it would be pb.RegisterCheckoutServer.
type checkout struct{ charges int }

func (c *checkout) pay(ctx context.Context, order *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	c.charges++ // the side effect that must happen once
	return wrapperspb.String(fmt.Sprintf("paid %s with ch_%d", order.GetValue(), c.charges)), nil
}

var checkoutDesc = grpc.ServiceDesc{
	ServiceName: "shop.Checkout",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Pay",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(*checkout).pay(ctx, req.(*wrapperspb.StringValue))
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/shop.Checkout/Pay"}, h)
		},
	}},
}

// The interceptor on a checkout service, with the hybrid strategy: an
// in-process miniredis holds the leases, PostgreSQL stores the answers. A
// retry is replayed, a reused key with another order is refused.
func ExampleUnaryServerInterceptor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// A schema of its own, so the example leaves nothing behind.
	schema := "idemgrpc_example_" + strings.ToLower(rand.Text()[:8])
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	cfg := &durable.Config{Schema: schema}
	if err := durable.Migrate(ctx, pool, cfg); err != nil {
		log.Fatal(err)
	}
	store, err := durable.New(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}

	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1, Addr: mr.Addr()})
	defer rdb.Close()
	locker, err := lock.New(rdb, nil)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.New(store, &idem.Config{
		Lock:   locker,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}

	// Demo authentication: the bearer token is the user id. In production
	// an authentication interceptor chained before this one puts the caller
	// in ctx, and the ScopeFunc reads it from there.
	scope := func(ctx context.Context) (string, bool) {
		v := metadata.ValueFromIncomingContext(ctx, "authorization")
		if len(v) != 1 {
			return "", false
		}
		return strings.CutPrefix(v[0], "Bearer ")
	}
	svc := &checkout{}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		grpcidem.UnaryServerInterceptor(guard, scope, &grpcidem.Config{
			Methods: func(m string) bool { return m == "/shop.Checkout/Pay" },
		}),
	))
	srv.RegisterService(&checkoutDesc, svc)
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///checkout",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	pay := func(key, order string) {
		ctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer user-42", "idempotency-key", key)
		var header metadata.MD
		receipt := new(wrapperspb.StringValue)
		err := conn.Invoke(ctx, "/shop.Checkout/Pay", wrapperspb.String(order), receipt, grpc.Header(&header))
		if err != nil {
			st := status.Convert(err)
			for _, d := range st.Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok {
					fmt.Println(st.Code(), info.GetReason())
				}
			}
			return
		}
		fmt.Printf("OK %q replayed=%q\n", receipt.GetValue(), strings.Join(header.Get("idempotent-replayed"), ","))
	}
	pay("8e03978e-40d5-43e8-bc93-6894a57f9324", "order-1")
	pay("8e03978e-40d5-43e8-bc93-6894a57f9324", "order-1") // the client's retry
	pay("8e03978e-40d5-43e8-bc93-6894a57f9324", "order-2") // a client bug
	fmt.Println("charges:", svc.charges)
	// Output:
	// OK "paid order-1 with ch_1" replayed=""
	// OK "paid order-1 with ch_1" replayed="true"
	// FailedPrecondition IDEMPOTENCY_KEY_REUSED
	// charges: 1
}
