package local

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// barrier stands in for a relay whose Close returns only once every relay
// of the network is closing: so a network that closes them one at a time
// never gets past the first.
type barrier struct {
	wg     *sync.WaitGroup
	closed chan struct{}
}

func (b barrier) Close() error {
	b.wg.Done()
	select {
	case <-b.closed:
		return nil
	case <-time.After(5 * time.Second):
		return errors.New("closed while the other relays ran on")
	}
}

// A network closes its relays at once, not one after the other.
func TestCloseClosesEveryRelayAtOnce(t *testing.T) {
	var wg sync.WaitGroup
	closed := make(chan struct{})
	relays := make([]barrier, 8)
	wg.Add(len(relays))
	for i := range relays {
		relays[i] = barrier{&wg, closed}
	}
	go func() { wg.Wait(); close(closed) }()
	if err := closeAll(relays); err != nil {
		t.Fatal(err)
	}
}
