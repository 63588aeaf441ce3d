package lock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem/lock"
)

// A lease is held by one caller at a time and can only be released by its
// holder.
func ExampleLocker_Obtain() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: mr.Addr()})
	defer rdb.Close()

	locker, err := lock.New(rdb, nil) // prefix "idem:", TTL 30s
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	lease, _, err := locker.Obtain(ctx, "user-42", "8e03978e-40d5-43e8-bc93-6894a57f9324", nil)
	if err != nil {
		log.Fatal(err)
	}
	_, _, err = locker.Obtain(ctx, "user-42", "8e03978e-40d5-43e8-bc93-6894a57f9324", nil)
	fmt.Println("second caller:", errors.Is(err, lock.ErrNotObtained))

	ttl, _ := lease.TTL(ctx)
	fmt.Println("ttl:", ttl)
	fmt.Println("release:", lease.Release(ctx))
	fmt.Println("release again:", lease.Release(ctx))
	// Output:
	// second caller: true
	// ttl: 30s
	// release: <nil>
	// release again: lock: not held
}
