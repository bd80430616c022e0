package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func queueTotal(t *testing.T, s *server, q string) float64 {
	t.Helper()
	var r struct {
		Messages struct {
			Total float64 `json:"total"`
		} `json:"messages"`
	}
	s.callJSON(t, "GET", "/api/v1/resources/queues/"+q, nil, 200, &r)
	return r.Messages.Total
}

// TestRetentionOverHTTP: retentionMessages, retentionSeconds and
// completedRetentionSeconds configured over HTTP remove messages from the
// running broker, and consumers carry on with what is left.
func TestRetentionOverHTTP(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	t.Run("Messages", func(t *testing.T) {
		s.callJSON(t, "POST", "/api/v1/configure", M{"queue": "ret-n", "options": M{"retentionMessages": 2}}, 200, nil)
		s.pushN(t, "ret-n", "p", 5)
		if n := queueTotal(t, s, "ret-n"); n != 2 {
			t.Fatalf("retentionMessages=2 keeps %v", n)
		}
		p := s.mustPop(t, "ret-n", "batch=10&consumerGroup=g&subscriptionMode=all&autoAck=true", 2)
		if p.Messages[0].Offset != 3 || p.Messages[1].Offset != 4 {
			t.Fatalf("kept offsets %d,%d, want 3,4", p.Messages[0].Offset, p.Messages[1].Offset)
		}
	})
	t.Run("Seconds", func(t *testing.T) {
		s.callJSON(t, "POST", "/api/v1/configure", M{"queue": "ret-s", "options": M{"retentionSeconds": 1}}, 200, nil)
		s.pushN(t, "ret-s", "p", 3)
		if err := checkFor(10*time.Second, 100*time.Millisecond, func() error {
			if n := queueTotal(t, s, "ret-s"); n != 0 {
				return fmt.Errorf("%v messages still retained", n)
			}
			return nil
		}); err != nil {
			t.Fatalf("retentionSeconds=1: %v", err)
		}
		s.mustEmpty(t, "ret-s", "batch=10&consumerGroup=late&subscriptionMode=all")
		s.pushN(t, "ret-s", "p", 1) // the partition carries on after the cut
		s.mustPop(t, "ret-s", "batch=10&consumerGroup=late", 1)
	})
	t.Run("MaxWaitTime", func(t *testing.T) {
		// Queen's maxWaitTimeSeconds: messages that waited longer go.
		out := s.configure(t, M{"queue": "ret-w", "options": M{"maxWaitTimeSeconds": 1}})
		if out["maxWaitTimeSeconds"] != float64(1) {
			t.Fatalf("configure echoes options %v, want maxWaitTimeSeconds 1", out)
		}
		s.pushN(t, "ret-w", "p", 3)
		if err := checkFor(10*time.Second, 100*time.Millisecond, func() error {
			if n := queueTotal(t, s, "ret-w"); n != 0 {
				return fmt.Errorf("%v messages still retained", n)
			}
			return nil
		}); err != nil {
			t.Fatalf("maxWaitTimeSeconds=1: %v", err)
		}
		s.mustEmpty(t, "ret-w", "batch=10&consumerGroup=w&subscriptionMode=all")
		s.pushN(t, "ret-w", "p", 1)
		s.mustPop(t, "ret-w", "batch=10&consumerGroup=w", 1)
	})
	t.Run("Completed", func(t *testing.T) {
		s.callJSON(t, "POST", "/api/v1/configure", M{"queue": "ret-c", "options": M{"completedRetentionSeconds": 1}}, 200, nil)
		s.pushN(t, "ret-c", "p", 2)
		p := s.mustPop(t, "ret-c", "batch=1", 1)
		s.mustAck(t, ackFor(p.Messages[0], "completed"))
		if err := checkFor(10*time.Second, 100*time.Millisecond, func() error {
			if n := queueTotal(t, s, "ret-c"); n != 1 {
				return fmt.Errorf("%v messages retained, want 1 (the unconsumed one)", n)
			}
			return nil
		}); err != nil {
			t.Fatalf("completedRetentionSeconds=1: %v", err)
		}
		// The unconsumed message stays past the window.
		time.Sleep(2500 * time.Millisecond)
		if n := queueTotal(t, s, "ret-c"); n != 1 {
			t.Fatalf("an unconsumed message was removed: total %v", n)
		}
	})
}

// TestEncryptionOverHTTP: with QUEEN_ENCRYPTION_KEY set, an encrypted
// queue's payload comes back in plaintext from a pop, and no file of the data
// directory holds it.
func TestEncryptionOverHTTP(t *testing.T) {
	t.Parallel()
	s := startServer(t, withEnv("QUEEN_ENCRYPTION_KEY", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"))
	s.callJSON(t, "POST", "/api/v1/configure", M{"queue": "sealed", "options": M{"encryptionEnabled": true}}, 200, nil)
	marker := "E2E-PLAINTEXT-MARKER-5c1d"
	s.push(t, []pushItem{{Queue: "sealed", Partition: "p", Payload: M{"secret": marker}}})
	p := s.mustPop(t, "sealed", "batch=1&autoAck=true", 1)
	if !bytes.Contains(p.Messages[0].Data, []byte(marker)) {
		t.Fatalf("pop did not return the plaintext: %s", p.Messages[0].Data)
	}
	if err := s.Stop(); err != nil { // flushes the store on a clean stop
		t.Fatal(err)
	}
	files := 0
	filepath.Walk(s.dataDir, func(path string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() {
			return nil
		}
		files++
		if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(marker)) {
			t.Errorf("%s holds the plaintext payload", path)
		}
		return nil
	})
	if files < 5 {
		t.Fatalf("only %d files scanned in %s", files, s.dataDir)
	}
}
