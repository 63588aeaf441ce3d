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
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()

	locker, err := lock.New(rdb, nil) // prefix "idem:", TTL 30s
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	const key = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	lease, _, err := locker.Obtain(ctx, "user-42", key, []byte("running"))
	if err != nil {
		log.Fatal(err)
	}
	_, held, err := locker.Obtain(ctx, "user-42", key, nil)
	fmt.Println("second caller:", errors.Is(err, lock.ErrNotObtained), string(held))

	fmt.Println("ttl:", mr.TTL(locker.Key("user-42", key)))
	fmt.Println("release:", lease.Release(ctx))
	fmt.Println("release again:", lease.Release(ctx))
	// Output:
	// second caller: true running
	// ttl: 30s
	// release: <nil>
	// release again: lock: not held
}
