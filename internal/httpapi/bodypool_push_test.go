package httpapi

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// TestPooledPushBodiesStoreWhatWasSent: 16 clients push bodies of about
// 75 KiB (pooled buffers) at once over real HTTP, half of them cut
// short by their client mid-flight; every message a push acknowledged
// reads back with the payload it was sent with, and no payload appears
// that no client sent: a body's buffer is never reused while its push's
// payloads can still be read from it.
func TestPooledPushBodiesStoreWhatWasSent(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	b := authzBroker(t)
	srv := httptest.NewServer(New(b, Config{}))
	t.Cleanup(srv.Close)
	const clients, pushes, items = 16, 12, 70
	var mu sync.Mutex
	acked := map[string]string{} // transaction id -> payload
	sent := map[string]bool{}    // every payload sent
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			for p := range pushes {
				var sb strings.Builder
				payloads := make([]string, items)
				sb.WriteString(`{"items":[`)
				for i := range payloads {
					pl := make([]byte, 1000)
					for j := range pl {
						pl[j] = 'a' + byte(r.IntN(26))
					}
					payloads[i] = fmt.Sprintf(`"c%d-p%d-i%d-%s"`, c, p, i, pl)
					if i > 0 {
						sb.WriteByte(',')
					}
					fmt.Fprintf(&sb, `{"queue":"pool-q","partition":"p%d","transactionId":"c%d-p%d-i%d","payload":%s}`, c%4, c, p, i, payloads[i])
				}
				sb.WriteString(`]}`)
				mu.Lock()
				for _, pl := range payloads {
					sent[pl] = true
				}
				mu.Unlock()
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(2) == 0 {
					time.AfterFunc(time.Duration(r.IntN(3000))*time.Microsecond, cancel)
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/v1/push", strings.NewReader(sb.String()))
				resp, err := http.DefaultClient.Do(req)
				cancel()
				if err != nil {
					continue // ended by the client: its messages may or may not be stored
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					errs <- fmt.Errorf("client %d push %d: status %d", c, p, resp.StatusCode)
					return
				}
				mu.Lock()
				for i, pl := range payloads {
					acked[fmt.Sprintf("c%d-p%d-i%d", c, p, i)] = pl
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := map[string]string{}
	for {
		res, err := b.Pop(context.Background(), broker.PopRequest{Tenant: "default", Queue: "pool-q", Group: "check", Batch: 1000, Partitions: 4, AutoAck: true, SubscriptionMode: "all"})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) == 0 {
			break
		}
		for _, m := range res.Messages {
			if !sent[string(m.Data)] {
				t.Fatalf("message %s holds a payload no client sent (%d bytes: %.40q…)", m.TxID, len(m.Data), m.Data)
			}
			got[m.TxID] = string(m.Data)
		}
	}
	if len(acked) == 0 {
		t.Fatal("no push was acknowledged")
	}
	for id, want := range acked {
		if got[id] != want {
			t.Fatalf("acknowledged message %s read back as %.40q…, want %.40q…", id, got[id], want)
		}
	}
	t.Logf("%d messages acknowledged, %d stored", len(acked), len(got))
}
