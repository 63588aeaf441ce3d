package grpcidem_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/grpcidem"
	"github.com/idemguard/idem/idemclient"
	"github.com/idemguard/idem/idemtest"
)

// The client's side: the interceptor sends one key with every attempt of a
// call, the caller's own (born with the intent) or one it draws, and says
// whether the answer is a replay.
func ExampleUnaryClientInterceptor() {
	// The server of ExampleUnaryServerInterceptor, in memory.
	guard, err := idem.New(idemtest.NewMemStore(nil), &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	scope := func(ctx context.Context) (string, bool) {
		v := metadata.ValueFromIncomingContext(ctx, "authorization")
		if len(v) != 1 {
			return "", false
		}
		return strings.CutPrefix(v[0], "Bearer ")
	}
	svc := &checkout{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(grpcidem.UnaryServerInterceptor(guard, scope, nil)))
	srv.RegisterService(&checkoutDesc, svc)
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///checkout",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor(nil))) // every default
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	key := idemclient.NewKey() // at the click, stored with the order
	for range 2 {
		ctx := metadata.AppendToOutgoingContext(context.Background(),
			"authorization", "Bearer user-42", grpcidem.MetadataKey, key)
		var res idemclient.Result
		receipt := new(wrapperspb.StringValue)
		if err := conn.Invoke(ctx, "/shop.Checkout/Pay", wrapperspb.String("order-1"), receipt, grpcidem.WithResult(&res)); err != nil {
			log.Fatal(err) // the outcome is unknown: call again later with res.Key
		}
		fmt.Printf("%q replayed: %v attempts: %d key kept: %v\n", receipt.GetValue(), res.Replayed, res.Attempts, res.Key == key)
	}
	fmt.Println("charges:", svc.charges)
	// Output:
	// "paid order-1 with ch_1" replayed: false attempts: 1 key kept: true
	// "paid order-1 with ch_1" replayed: true attempts: 1 key kept: true
	// charges: 1
}
