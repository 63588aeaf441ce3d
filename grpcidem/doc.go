// Package grpcidem guards gRPC unary calls with an idem.Guard: the handler of
// a call runs at most once per (scope, idempotency key), and every retry is
// answered with the stored result.
//
// It is a module of its own, so that google.golang.org/grpc never reaches
// the build of a net/http user of idem:
//
//	go get github.com/idemguard/idem/grpcidem
//
//	guard, _ := idem.New(store, nil)
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
//		authInterceptor, // puts the caller in ctx
//		grpcidem.UnaryServerInterceptor(guard, userFromContext, &grpcidem.Config{
//			Methods: func(m string) bool { return m == "/shop.v1.Checkout/Pay" },
//		}),
//	))
//
// # What the client sees
//
// The key is the request metadata entry "idempotency-key" (MetadataKey):
// exactly one value of 1 to 255 characters of printable ASCII, taken
// literally, without a comma or a leading or trailing space. The fingerprint
// is idem.HashParts over the full method name and the deterministic protobuf
// encoding of the request (Fingerprint; Config.Fingerprint replaces it), so a
// retry of the same message matches even when it holds maps.
//
// Every refusal carries a google.rpc.ErrorInfo detail whose Domain is
// ErrorDomain and whose Reason is stable; the message is for humans.
//
//	Situation                                      Code                Reason
//	First call                                     the handler's own result
//	Retry, same key and same request               the stored result, with header
//	                                               "idempotent-replayed: true"
//	Retry while the first call runs                Aborted             REQUEST_IN_PROGRESS, RetryInfo 1s
//	Retry of a key left in progress longer than    Aborted             REQUEST_PENDING, RetryInfo 30s
//	  the Guard's MaxHold (waits for reconciliation)
//	Same key, different method or message          FailedPrecondition  IDEMPOTENCY_KEY_REUSED
//	No key (or passed through, Config.OptionalKey) InvalidArgument     IDEMPOTENCY_KEY_MISSING
//	Malformed key, or two values                   InvalidArgument     IDEMPOTENCY_KEY_INVALID
//	No authenticated caller (ScopeFunc false)      Unauthenticated     UNAUTHENTICATED
//	PostgreSQL unreachable: the handler did not    Unavailable         SERVICE_UNAVAILABLE, RetryInfo 2s
//	  run, retry with the same key
//	Request cannot be fingerprinted, stored        Internal            (none; the cause is logged)
//	  answer cannot be read (see below)
//
// The refusals are decided by idem.Classify, as the HTTP middleware's are;
// the code follows the kind of refusal. The RetryInfo delays are the
// middleware's Retry-After (idem.Decision.RetryAfter): 1s is sent as 1 or
// 2s, 30s as 30 to 36s. A call whose own context ended before the guard
// could decide gets Canceled or DeadlineExceeded instead of Unavailable. With
// the Guard's Config.Wait, a retry of a running call waits for its answer
// instead of Aborted.
//
// Why these codes: Aborted is gRPC's code for a concurrency conflict, the
// counterpart of the HTTP middleware's 409, and unlike Unavailable it is not
// in the usual automatic retry policies, so a key held in progress for
// minutes (until reconciliation) does not turn into a storm of transparent
// retries; the RetryInfo tells clients that do retry when. A reused key is
// FailedPrecondition, not InvalidArgument: the request is well formed, but
// the key is already bound to another one, and only a new key helps.
// Unavailable is kept for the one refusal that a client may retry
// automatically, as gRPC retry policies do: nothing was decided.
//
// # The client
//
// UnaryClientInterceptor is the other end: it sends every attempt of a call
// with one key (the caller's, from the outgoing metadata, or a random one
// drawn once) and the same message, and retries Unavailable and the Aborted
// refusals above (REQUEST_IN_PROGRESS, REQUEST_PENDING) after their
// RetryInfo, with idemclient's bounds (ClientConfig). A reused or invalid
// key, and every other code, is final. WithResult reports the key, whether
// the answer was replayed and how many attempts it took.
//
//	conn, err := grpc.NewClient(target, creds,
//		grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor(nil)))
//
// # What is stored
//
// The handler's result decides the key's fate, with the same rules as the
// HTTP middleware (the column "as HTTP" is the status it is stored under,
// from the grpc-gateway mapping):
//
//	Handler returns                                 As HTTP  Key          Next retry
//	a response message (OK)                         200      stored       replayed, same message
//	InvalidArgument, FailedPrecondition, OutOfRange 400      stored       replayed, same code,
//	Unauthenticated                                 401      stored         message and details
//	PermissionDenied                                403      stored
//	NotFound                                        404      stored
//	AlreadyExists                                   409      stored
//	ResourceExhausted (rate limited)                429      released     runs again
//	Unimplemented (nothing ran)                     -        released     runs again
//	Internal, Unknown, Unavailable, Aborted,        -        in progress  Aborted until settled
//	  DeadlineExceeded, Canceled, DataLoss,                                or released
//	  any error that is not a status
//	anything, after idem.MarkRetrySafe(ctx)         -        released     runs again
//	a message not storable: over 1 MiB              -        in progress  Aborted until settled
//	  (idem.DefaultMaxBody), or not a proto.Message                        or released
//	a panic                                         -        in progress  (released after MarkRetrySafe)
//
// Only the final answers are stored. Unavailable, Aborted and
// DeadlineExceeded are left in progress although they often mean "nothing
// happened": the interceptor cannot know that the handler stopped before
// its effect (a charge sent, its reply lost, ends in DeadlineExceeded too).
// A handler that knows calls idem.MarkRetrySafe(ctx) first, and its key is
// released. A client hanging up mid-call does not cancel the handler: the
// Guard runs it with a context the caller's cancellation does not reach.
//
// A response message is stored as its protobuf encoding with its full name
// (in the stored header "Grpc-Message-Type"); a replay resolves that name in
// protoregistry.GlobalTypes, which holds every generated message type the
// server binary links, so any instance of the fleet can replay any answer
// without a registry learnt at run time. An error is stored as its
// google.rpc.Status. Answer gives that stored form: a reconciler that learns
// the outcome of a key left in progress settles it with
//
//	answer, err := grpcidem.Answer(&pb.PayReply{Charge: "ch_77"}, nil)
//	return reconcile.Decision{Verdict: reconcile.Settled, Response: answer}, err
//
// and a handler that joins its answer to its own transaction passes the
// same form to idem.Complete. Whatever the handler then returns, the caller
// gets the committed answer, as every retry does.
//
// A service that serves a key's answer over HTTP and gRPC alike may keep it
// in one form of its own (an HTTP status with a JSON body, say), since a
// reconcile.Item does not say which transport claimed the key:
// Config.Render turns such an answer into the reply of the method called, on
// every call that gets it. A stored answer that is in neither form is
// codes.Internal, and its key keeps it until it expires.
package grpcidem
