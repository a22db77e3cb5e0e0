package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/participantd/participantd/client"
)

// A participant enrolls, tells and follows the conversation, acknowledging
// what it read. The client re-attaches it after a reconnect on its own and
// hands every new credential to OnCredential. The README shows this body.
func Example() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:7420", client.Options{
		// Every attach, also the re-attach after a reconnect, mints a new
		// credential: persist it, the previous one no longer attaches.
		OnCredential: func(cred client.Credential) { save(cred) },
		// Another session took the participant over, or it left.
		OnLost: func(cred client.Credential, why error) { log.Printf("lost %v: %v", cred, why) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	cred, err := c.Enroll(ctx, 42) // participant, generation, secret
	if err != nil {
		log.Fatal(err)
	}
	seq, err := c.Tell(ctx, cred, []byte("hello")) // durable before it returns
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("told seq %d", seq)
	for d := range c.Deliveries() { // everyone else's records and events, in seq order
		fmt.Printf("%d %s from %d: %q\n", d.Seq, d.Kind, d.Participant, d.Payload)
		if _, err := c.Ack(ctx, d.Credential, d.Seq); err != nil {
			log.Fatal(err)
		}
	}
}

// save stands for the caller's persistence: write the credential
// atomically (a temporary file, fsync, rename), mode 0600.
func save(cred client.Credential) { _ = cred }

// An operation whose outcome the client could not learn before its context
// ended carries its token; retrying with it applies the operation at most
// once.
func ExampleWithToken() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:7420", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	cred, err := c.Enroll(ctx, 42)
	if err != nil {
		log.Fatal(err)
	}

	seq, err := c.Tell(ctx, cred, []byte("once"))
	var ce *client.Error
	if errors.Is(err, client.ErrInDoubt) && errors.As(err, &ce) {
		seq, err = c.Tell(ctx, cred, []byte("once"), client.WithToken(ce.Token))
	}
	fmt.Println(seq, err)
}

// A credential saved earlier is attached again: the server mints a new
// generation and secret, which must replace the saved ones.
func ExampleClient_Attach() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "127.0.0.1:7420", client.Options{
		OnCredential: func(cred client.Credential) {
			// Persist cred: the previous one no longer attaches.
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	var saved client.Credential
	if err := saved.UnmarshalJSON([]byte(`{"conversation":42,"participant":0,"generation":1,"secret":"` +
		"0000000000000000000000000000000000000000000000000000000000000000" + `"}`)); err != nil {
		log.Fatal(err)
	}
	cred, err := c.Attach(ctx, saved)
	if errors.Is(err, client.ErrStaleAuthority) {
		log.Fatal("the credential moved on: someone attached with it")
	}
	fmt.Println(cred)
}
